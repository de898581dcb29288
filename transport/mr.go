package transport

// MR is a memory region registered with PD.RegMR: a fixed range of an arena
// with fixed access, valid until Close (ibv_dereg_mr).
type MR interface {
	// LKey is the key local SGEs name.
	LKey() Key
	// RKey is the key a peer names in RDMA READ/WRITE (meaningful only with
	// remote access).
	RKey() Key
	// Addr is the virtual address of the first registered byte.
	Addr() uint64
	// Len is the registered length in bytes.
	Len() int
	// Access is the access the region was registered with.
	Access() Access
	// Arena is the memory the region covers.
	Arena() *Arena
	// Close deregisters the region. It fails with ErrBusy while memory
	// windows are bound over it.
	Close() error
}

// FastRegMR is a fast-registration memory region (ib_alloc_mr with
// IB_MR_TYPE_MEM_REG). The consumer stages a page list with Map; the
// registration takes effect only when a REG_MR work request naming the MR
// executes on a send queue, and ends with LOCAL_INV, a peer's
// SEND_WITH_INV, or Close.
//
// Two copies of the registration exist, as on hardware: the staged copy
// kept here (Map) and the device's copy (key, state, page list, iova,
// length, access), which changes only when a REG_MR or invalidation
// executes. Changing the staged copy never changes what the peer can reach.
type FastRegMR interface {
	// Key is the key the MR was allocated with. Its Index never changes;
	// consumers derive each registration's key from it with Key.Bump and
	// track which key the device holds.
	Key() Key
	// MaxPages is the largest page list a registration may carry.
	MaxPages() int
	// Map stages a registration of length bytes at off in arena a, to be
	// advertised at iova (ib_map_mr_sg). The page list is the arena pages
	// the range touches; the first may be entered at any offset, and
	// iova%PageSize must equal off%PageSize. It fails with
	// ErrInvalidArgument if the range needs more than MaxPages pages.
	Map(a *Arena, off, length int, iova uint64) error
	// Close deregisters the MR whatever its device state (ib_dereg_mr), the
	// only operation that always brings an MR out of an unknown state.
	Close() error
}

// MW is a type-2 memory window (ibv_alloc_mw with IBV_MW_TYPE_2), bound over
// a registered MR by a BIND_MW work request and invalidated like a
// fast-registration MR.
type MW interface {
	// Key is the key the window was allocated with; consumers derive each
	// binding's key with Key.Bump (ibv_inc_rkey).
	Key() Key
	// Close deallocates the window whatever its state (ibv_dealloc_mw).
	Close() error
}
