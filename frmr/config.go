package frmr

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// Mechanism is the fast-registration mechanism a pool uses.
type Mechanism uint8

// Mechanisms.
const (
	// Auto picks FRMR when the device has CapFastRegMR, else MW.
	Auto Mechanism = iota
	// FRMR: fast-registration MRs registered by REG_MR.
	FRMR
	// MW: type-2 memory windows bound by BIND_MW over Config.BaseMR.
	MW
)

func (m Mechanism) String() string {
	if names := [...]string{"auto", "frmr", "mw"}; int(m) < len(names) {
		return names[m]
	}
	return fmt.Sprintf("Mechanism(%d)", uint8(m))
}

// Direction says which way the peer moves data through a registration.
type Direction uint8

// Directions.
const (
	// PeerWrites: the peer RDMA-WRITEs into us (data-in, a read from
	// storage). Access REMOTE_WRITE|LOCAL_WRITE.
	PeerWrites Direction = iota
	// PeerReads: the peer RDMA-READs from us (data-out). Access
	// REMOTE_READ only.
	PeerReads
)

// Config configures a pool.
type Config struct {
	// PD is the protection domain of the QP the pool serves.
	PD transport.PD
	// Caps are the device's capabilities, used when Mechanism is Auto.
	Caps      transport.Capability
	Mechanism Mechanism
	// Size is the number of MRs (windows).
	Size int
	// MaxPages bounds one registration (FRMR only; default 16).
	MaxPages int
	// BaseMR is the arena MR windows are bound over (MW only); it must be
	// registered with MW_BIND and LOCAL_WRITE.
	BaseMR transport.MR
	// SQDepth is the QP's MaxSendWR. The pool keeps one slot for a drain
	// marker.
	SQDepth int
	// SignalEvery bounds runs of unsignaled WRs (default SQDepth/4, at
	// least 1).
	SignalEvery int
	// IOVATag makes every FRMR registration advertise an iova of its own:
	// the pool's registration count above the bits an I/O needs (see
	// "Stale descriptors" in the package doc), so a stale (rkey, iova)
	// fails the device's bounds check even when the 8-bit key has
	// wrapped. It ignores the buffer's address apart from its page
	// offset. Windows cannot choose their address; they rotate instead.
	IOVATag bool
	// IOVABase is added to the registration count the iova tag is made
	// of. Pools on one PD (the channels of a session) pass bases far
	// apart so that their tags never meet, whichever MR index the device
	// hands to whom.
	IOVABase uint64
	// WindowQuarantine is how many retired windows the pool keeps
	// allocated (and unbound) after rotating them, so the device cannot
	// hand their index out again while a peer may remember its keys
	// (MW only; default 4×Size). Each buys 254 registrations of key
	// horizon (Stats.KeyHorizon; "Stale descriptors" in the package
	// doc).
	WindowQuarantine int
	// DeadlineTicks is how many Ticks a signaled WR may stay uncompleted
	// (default 50).
	DeadlineTicks int
	// FenceInvalidate sets the Local Invalidate Fence on every LOCAL_INV
	// the pool builds: it executes only once every earlier WR has
	// completed, so no retry can rewind over it. Set it on a device
	// whose retries execute local operations again
	// (transport.Quirks.RetryRepeatsLocalOps): a LOCAL_INV repeated
	// there after the window's BIND completed invalidates a FREE window,
	// a kernel oops on rxe. rxe fences every LOCAL_INV anyway since
	// Linux 6.0 (rxe_wqe_is_fenced); asking for it does not rely on that.
	FenceInvalidate bool
	// FenceRegistrations puts a fence in front of every registration:
	// a fenced LOCAL_INV of a barrier the pool keeps, and the barrier's
	// registration again (fence.go). The registration then executes
	// with nothing before it that is not complete, so no retry executes
	// it again. Set it on a device whose retries execute local
	// operations again (transport.Quirks.RetryRepeatsLocalOps): a
	// BIND_MW or REG_MR repeated over its VALID object fails there, and
	// the connection with it (rxe, every release). The caller posts
	// Prologue first on every new QP, and AppendFence in front of the
	// registrations of each post (with nothing but registrations between
	// the fence and them; their commands may follow, one each, in order),
	// making room for FenceLen more WRs. It costs two WRs per post and
	// makes the post's registrations wait for every earlier request's
	// ACK.
	FenceRegistrations bool
}

// CQDepth is the CQ size a QP with the given queue depths needs so that a
// full flush plus a drain marker never overruns it
// (docs/registration.md#cq-sizing).
func CQDepth(sqDepth, rqDepth int) int { return sqDepth + rqDepth + 1 }
