package transport

import "context"

// Capability is a bit set of optional device features.
type Capability uint64

// Device capabilities. A consumer checks them before choosing a
// registration mechanism; a provider reports only what it really does.
const (
	// CapFastRegMR: fast-registration MRs registered by a REG_MR work
	// request (IB_WR_REG_MR; kernel verbs only on real hardware).
	CapFastRegMR Capability = 1 << iota
	// CapMemWindow2: type-2 memory windows bound by BIND_MW work requests
	// (IBV_DEVICE_MEM_WINDOW_TYPE_2B); the user-space form of fast
	// registration.
	CapMemWindow2
	// CapLocalInv: LOCAL_INV work requests.
	CapLocalInv
	// CapSendWithInv: SEND_WITH_INV sending and remote invalidation on
	// receive (IBV_DEVICE_MEM_MGT_EXTENSIONS).
	CapSendWithInv
	// CapHugePages: arenas backed by huge pages can be registered.
	CapHugePages
	// CapSharedArenas: the device can use memfd-backed arenas shared with a
	// peer process (the software NIC's shm wire).
	CapSharedArenas
)

// Has reports whether every capability in c is present.
func (c Capability) Has(want Capability) bool { return c&want == want }

// String lists the capability names.
func (c Capability) String() string {
	names := [...]string{"FAST_REG_MR", "MW_TYPE_2", "LOCAL_INV", "SEND_WITH_INV", "HUGE_PAGES", "SHARED_ARENAS"}
	s := ""
	for i, n := range names {
		if c&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// DeviceAttr are the limits and capabilities of a device
// (ibv_query_device and ibv_query_port).
type DeviceAttr struct {
	Name            string
	Vendor          string
	FWVer           string
	Caps            Capability
	MaxQP           int
	MaxQPWR         int // send or receive queue depth
	MaxSGE          int // SGEs per work request
	MaxCQE          int // entries per completion queue
	MaxMR           int
	MaxMW           int
	MaxPD           int
	MaxMRSize       uint64
	MaxFastRegPages int    // pages per fast registration
	MaxInline       int    // bytes of inline data per send
	PageSizeCap     uint64 // bit set of supported page sizes
	PortMTU         int
	// Quirks are the known departures of this device from strict verbs
	// behaviour.
	Quirks Quirks
}

// Device is an opened RDMA device (ibv_context).
type Device interface {
	// Attr returns the device's limits and capabilities.
	Attr() DeviceAttr
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with at least depth entries.
	CreateCQ(depth int) (CQ, error)
	// NextEvent blocks until an asynchronous event (ibv_get_async_event)
	// arrives, the context ends, or the device closes.
	NextEvent(ctx context.Context) (AsyncEvent, error)
	// Close releases the device once every object on it is destroyed.
	Close() error
}

// PD is a protection domain: memory regions, windows and QPs on one PD may
// be used together, and no others.
type PD interface {
	// RegMR registers length bytes at off in arena a with the given access
	// (ibv_reg_mr). The MR's address is the arena's virtual address plus off.
	RegMR(a *Arena, off, length int, access Access) (MR, error)
	// AllocFastRegMR allocates a fast-registration MR able to map maxPages
	// pages (ib_alloc_mr with IB_MR_TYPE_MEM_REG). Its device state starts
	// FREE. Needs CapFastRegMR.
	AllocFastRegMR(maxPages int) (FastRegMR, error)
	// AllocMW allocates a type-2 memory window (ibv_alloc_mw with
	// IBV_MW_TYPE_2). Its device state starts FREE. Needs CapMemWindow2.
	AllocMW() (MW, error)
	// CreateQP creates a reliable-connected QP in RESET. It becomes usable
	// when a connection (Endpoint.Connect or ConnRequest.Accept) moves it
	// through INIT and RTR to RTS.
	CreateQP(cfg QPConfig) (QP, error)
	// Close deallocates the PD once nothing on it remains.
	Close() error
}
