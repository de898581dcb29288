package transport

// Quirks describe where a device departs from the strictest reading of the
// verbs rules. Real devices differ (docs/verbs.md#device-differences;
// rdma-unit-test's per-device introspection lists them); the software NIC
// reproduces each departure on demand, and the conformance suite reads Quirks
// to know which outcome is correct for the device under test. A correct
// consumer works under every setting.
type Quirks struct {
	// InvalidateIndexOnly: LOCAL_INV and a received SEND_WITH_INV match on
	// the 24-bit index only, ignoring the 8-bit key (siw; assumed for mlx4).
	// Strict devices and rxe compare the full key.
	InvalidateIndexOnly bool
	// InvalidateFreeOK: invalidating an MR or window that is already FREE
	// succeeds (siw, rxe when the key matches). Strict: MW_BIND_ERR.
	InvalidateFreeOK bool
	// PoisonOnFlush: an MR or window named by a flushed REG_MR, BIND_MW or
	// LOCAL_INV is left in a state where every later REG_MR, BIND_MW or
	// LOCAL_INV on it fails with MW_BIND_ERR until it is deregistered
	// (ConnectX-2/3; docs/verbs.md#flushed-invalidations).
	PoisonOnFlush bool
	// LocalOpErrStatus is the status of a failed local memory operation:
	// StatusMWBindErr on hardware, StatusLocQPOpErr on rxe. A failed
	// BIND_MW may complete StatusMWBindErr whatever this says (rxe does:
	// LOCAL_INV fails LOC_QP_OP_ERR, BIND_MW MW_BIND_ERR), so consumers
	// treat both as the same failure.
	LocalOpErrStatus Status
	// DropPostsBeforeRTS: a PostSend on a QP in RESET, INIT or RTR is
	// accepted and silently dropped, never completing (rxe, mlx4, mlx5).
	// Strict: it fails at once with ErrInvalidState.
	DropPostsBeforeRTS bool
	// ScrambleErrorWC: fields of an error completion other than ID, Status,
	// QPNum and VendorErr hold garbage, so consumers that read them fail
	// tests (ibv_poll_cq(3) says they are undefined).
	ScrambleErrorWC bool

	// The fields below were added for rxe as measured through the ibverbs
	// provider (see its package doc). Their zero values are the strict
	// behaviour, so a profile that does not set them is unchanged.

	// NoQPErrorEvents: an error the responder detects (an inbound access
	// violation, a bad SEND_WITH_INV, a receive too small or unusable)
	// moves its QP to ERR without an async event (QP_ACCESS_ERR,
	// QP_REQ_ERR, QP_FATAL); the error shows only in completions (rxe:
	// the only async event it raised in the VM was SQ_DRAINED). Consumers
	// must learn of QP errors from completions, never only from events.
	NoQPErrorEvents bool
	// LocalKeyErrStatus, if not StatusSuccess, is the status of a work
	// request whose local SGE names an lkey that does not resolve to a
	// usable MR (wrong 8-bit key, another PD, deregistered): a source of
	// a SEND or RDMA WRITE, or a receive buffer a SEND lands in; rxe
	// reports StatusLocQPOpErr. Zero means the strict StatusLocProtErr.
	// Bounds errors, and every bad sink of an RDMA READ, stay
	// StatusLocProtErr (rxe's completer reports that for READ sinks
	// whatever the cause).
	LocalKeyErrStatus Status
	// RecvLenErrStatus, if not StatusSuccess, is the receiver's status for
	// a SEND larger than its receive buffer, and the sender then gets
	// StatusRemOpErr: rxe treats the receive as malformed and reports
	// StatusLocQPOpErr. Zero means the strict StatusLocLenErr, with
	// StatusRemInvReqErr at the sender.
	RecvLenErrStatus Status
	// WindowBoundsUnchecked: remote access through a type-2 memory window
	// is bounds-checked against the underlying MR only, not the window
	// (rxe: check_rkey tests the range of mw->mr). This is a device bug,
	// not a feature: a peer can reach the whole MR through any window
	// over it. Consumers must not rely on it either way, and those that
	// need isolation between buffers must not rely on window bounds on
	// such a device (register the buffers as separate MRs, or use a
	// device without the quirk).
	WindowBoundsUnchecked bool
	// DestroyQPInvalidatesWindows: destroying a QP invalidates the type-2
	// windows bound through it, and QP.Close succeeds whatever they hold.
	// Zero (strict, and rxe): a window bound through a QP holds it, and
	// QP.Close fails with ErrBusy, leaving the QP alive, until every such
	// window is invalidated or deallocated. rxe's bind takes a reference
	// on the QP that only an invalidation or the window's deallocation
	// drops (rxe_do_bind_mw), so its destroy waits on that reference for
	// its pool timeout (about 50 s in the test VM) and then warns
	// (__rxe_cleanup); the ibverbs provider refuses such a Close before
	// it reaches the device. A consumer replaces the windows whose state
	// it does not know before it destroys the QP (frmr's Recover or
	// Close), which is what it must do anyway.
	DestroyQPInvalidatesWindows bool
	// CyclicIndices: the device hands out MR and window indices cyclically,
	// so a freed index comes back only after every other free index of its
	// range has been handed out (rxe: rxe_pool.c allocates with
	// xa_alloc_cyclic). Zero means nothing is promised: a device may hand
	// back the index it freed last at once, as the strict profile does.
	// A consumer that must not repeat a key a peer has seen (frmr's
	// windows) gets a longer horizon from a cyclic device for the same
	// resources; it must stay correct without it.
	CyclicIndices bool
	// LocalErrFlushed: a send-queue WR that fails at the requester (a
	// local SGE that does not resolve or is out of bounds, a REG_MR,
	// LOCAL_INV or BIND_MW the device refuses) completes StatusWRFlushErr,
	// as every WR after it does: the cause is not reported, only that
	// the QP went to ERR. rxe does on Linux 6.12 (measured in the VM with
	// a bookworm-backports kernel; 6.1 reports LocalOpErrStatus and
	// LocalKeyErrStatus): its requester moves the QP to ERR and its
	// completer, finding the QP in ERR, flushes the whole send queue, the
	// failed WR included (drivers/infiniband/sw/rxe/rxe_comp.c,
	// flush_send_queue, since "RDMA/rxe: Fix multiple rxe_qp_error
	// calls", v6.10). Errors the completer finds in a response (a READ's
	// sink) and the responder's are still reported. A consumer must take
	// a flushed REG_MR or LOCAL_INV for "state unknown" in any case
	// (docs/verbs.md#flushed-invalidations), and a flush for a QP in ERR
	// whose cause it may never see.
	LocalErrFlushed bool
	// ReplayOnErr: a request the responder carried out as its QP entered
	// ERR is carried out again, as a new successful receive, for every
	// receive still posted, and a SEND_WITH_INV among them invalidates
	// its key again. On rxe that second invalidation of a window already
	// FREE is a kernel oops (rxe_do_invalidate_mw puts the window's NULL
	// QP): seen on Linux 6.12.95 in the faults run of the initiator's
	// end-to-end test, the initiator's QP moved to ERR while the target's
	// answers were arriving (transport/ibverbs/kernel.go says which
	// releases). A consumer on such a device must not let a peer
	// invalidate its keys remotely (the initiator then invalidates them
	// itself), and must take any receive completed after its QP left RTS
	// for a possible copy of an earlier one. The software NIC replays so
	// when a test sets the quirk (transport/emu/replay.go).
	ReplayOnErr bool
	// RetryRepeatsLocalOps: a transport retry (the local ACK timeout, a
	// sequence NAK) carries out again every local operation (REG_MR,
	// BIND_MW, LOCAL_INV) posted behind the oldest unacknowledged request,
	// although each had already executed. rxe does, on every release read
	// here: req_retry rewinds the requester to the send queue's consumer
	// index and rxe_requester runs rxe_do_local_ops for each WQE it meets
	// again, done or not (drivers/infiniband/sw/rxe/rxe_req.c). Seen in
	// the VM on Linux 6.1: one retry in about 69,000 packets, and the
	// second BIND_MW of a bound window failed MW_BIND_ERR. Two outcomes
	// matter to a consumer. A repeated registration of an MR or window a
	// peer has meanwhile invalidated (SEND_WITH_INV) succeeds: the key is
	// valid again, over the same memory, after the request it was
	// issued for has ended, and nothing reports it. A repeated
	// LOCAL_INV of a window already FREE puts the window's QP, which is
	// NULL: a kernel oops (rxe_do_invalidate_mw). A repeated operation
	// that fails (a BIND_MW or REG_MR over its VALID object) costs the
	// connection. So on such a device a consumer executes every
	// registration only when nothing before it on the send queue is
	// incomplete: behind a fenced LOCAL_INV, which waits for every
	// earlier WR (frmr.Config.FenceRegistrations), so no retry rewinds
	// to anything before it; and it lets no peer invalidate its keys
	// (every key dies by its own fenced LOCAL_INV). The software NIC
	// repeats them when a profile or test sets the quirk
	// (transport/emu/requester.go).
	RetryRepeatsLocalOps bool
	// RemoteInvalidateAnyQP: a received SEND_WITH_INV invalidates a
	// type-2 window whatever QP bound it and whatever PD it is of: rxe's
	// rxe_invalidate_mw finds the window by its key in the device's pool
	// and checks only that it is not INVALID (drivers/infiniband/sw/rxe/
	// rxe_mw.c). Strict, type-2B: only through the QP that bound it,
	// else REM_INV_REQ_ERR at the receiver. So on such a device the peer
	// of one connection can end the registrations of any other on the
	// host, and name a FREE window's key, which oopses rxe (no consumer
	// rule prevents either: the peer must be trusted).
	RemoteInvalidateAnyQP bool
}
