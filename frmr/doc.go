// Package frmr is the initiator's fast-registration pool: completion-gated
// recycling of fast-registration MRs (REG_MR) or type-2 memory windows
// (BIND_MW over an arena MR), rkey bumping, and recovery by deregistration
// and reallocation (docs/registration.md#states,
// docs/registration.md#invariants).
//
// One pool serves exactly one QP. Chaining LOCAL_INV → REG_MR (and
// REG_MR → SEND) without waiting is safe only because one send queue
// executes in posting order; a pool shared across QPs would lose that
// argument, so never share one.
//
// State machine of one MR (Slot):
//
//	FREE --Get, REG/BIND posted in front of its SEND--> REG_POSTED
//	REG_POSTED --SEND (or a later signaled WR) completes SUCCESS--> VALID
//	VALID --Invalidate: signaled LOCAL_INV naming the device key--> INV_POSTED
//	INV_POSTED --that LOCAL_INV (or a later signaled WR) SUCCESS--> FREE
//	VALID --receive WITH_INV naming the device key, SEND done--> FREE
//	any --flush, error CQE, bogus invalidation, partial post,
//	      deadline, skipped completion, QP error--> TAINTED
//	TAINTED --no WR names it any more: dereg + fresh alloc--> FREE
//
// A TAINTED MR is never invalidated again and reused (the ConnectX-3 lesson,
// docs/registration.md#poisoned-mrs); it is deregistered and replaced before
// Get hands anything out. Done(reg) reports when the I/O's buffer may go back
// to the application: the registration is FREE, or its MR is gone.
//
// The pool is a state machine driven by its caller (etcd-raft style): it
// never polls a CQ, reads a clock or starts a goroutine, and it is not safe
// for concurrent use. The caller passes every chain through Admit before
// PostSend and Posted after it, every send completion of the QP to
// OnSendCompletion, remote invalidations to OnRemoteInvalidate, ticks to
// Tick while Waiting reports anything to time (an idle connection's pool
// needs none), and QP errors to OnQPError, then a drain (or Reset, when the drain
// cannot finish), then Recover, and only then destroys the QP: a type-2
// window bound through a QP holds it on rxe, whose destroy then waits for the
// window (transport.Quirks.DestroyQPInvalidatesWindows), so the windows the
// pool cannot vouch for are replaced first. Close likewise comes before the
// QP's destroy. Err reports when the pool itself wants the QP torn down:
// after an error completion, or after a signaled WR's completion was skipped
// (a lost completion, or a post before RTS that the device dropped silently),
// which the pool never takes as proof that the skipped WRs executed. It
// bounds send-queue use (signal at least every SignalEvery WRs, one slot kept
// for a drain marker) and CQ size (CQDepth). Steady-state
// Get/Posted/OnSendCompletion allocate nothing.
//
// Stale descriptors. A peer may keep every (rkey, iova, length) it was
// ever handed and present it later; a key is 24 bits of index and 8 bits
// of variant, so one MR's keys repeat every 256 registrations. The pool
// makes sure a repeated key never comes with a range the peer saw:
//
//   - FRMR (Config.IOVATag): the iova is not the buffer's address but the
//     pool's registration count (plus Config.IOVABase) shifted above the
//     bits one registration needs, keeping only the buffer's offset in its
//     first page. Two registrations of any MR of the pool never advertise
//     overlapping ranges until the count wraps (2^64 over the shift: more
//     than 2^40 registrations; Stats.KeyHorizon says 2^32, the spacing
//     the initiator gives its channels' bases), so a stale descriptor
//     fails the device's bounds check however many times its key has
//     wrapped.
//
//   - MW: a window's address is the buffer's, so it cannot be tagged.
//     Instead a window is rotated after 254 bindings, before its variant
//     could repeat: a fresh window takes its place and the old one stays
//     allocated and unbound in a quarantine of Config.WindowQuarantine
//     windows, so no key of its index is valid and the device cannot give
//     the index to anyone. Only when it leaves the quarantine can the
//     index come back. A window the pool deallocates after a taint (the
//     recovery rule) leaves no quarantined trace, so the pool remembers
//     per index where the variants stopped, and a window reborn at that
//     index goes on from there, rotating when the lives since the index's
//     last quarantine have used the variants up. The guarantee is
//     therefore WindowQuarantine × 254 registrations of the pool
//     (Stats.KeyHorizon) on a device that hands back the index it freed
//     last (the emulator's strict, ib and iwarp profiles), and far more
//     on one that allocates indices cyclically
//     (transport.Quirks.CyclicIndices: rxe, whose index space of
//     MaxMW windows must go round first).
//
//     No bound on windows can make it unbounded on the first kind of
//     device: with at most W windows allocated, such a device never hands
//     out more than W+1 indices, each index has 255 variants, and a
//     buffer keeps its address, so past W × 255 registrations of one
//     buffer some (key, address) pair must repeat. A caller that needs a
//     longer horizon sizes WindowQuarantine for it (a window is a small
//     device object); FRMRs, where the device offers them, have none of
//     this limit.
//
// Windows and unchecked bounds. Where the device does not check a window's
// own bounds (transport.Quirks.WindowBoundsUnchecked, rxe), a window's key
// reaches all of the MR it is bound over. The caller then binds each
// buffer's windows over an MR covering only that buffer (Segment.Base).
//
// Retries that repeat registrations. Where a transport retry executes
// again the local operations behind the request it retries
// (transport.Quirks.RetryRepeatsLocalOps, rxe), a repeated REG_MR or
// BIND_MW of a VALID object fails and ends the connection. With
// Config.FenceRegistrations the pool keeps a barrier (a window or FRMR over
// a page of its own, with no remote access) and the caller puts
// AppendFence in front of the registrations of each post: a fenced
// LOCAL_INV of the barrier, which executes only once every earlier WR has
// completed, and the barrier's registration again; then the
// registrations, then the commands carrying their keys, one each in
// order (Admit and Posted pair them so). The caller posts Prologue as the
// first WR of each new QP (the barrier's first registration, with nothing
// before it), and Get refuses (ErrNoFence) until it is in place
// (fence.go; testdata/pool/fence).
//
// Tests: go test ./frmr runs a short seeded soak per device profile (strict,
// ib, iwarp, rxe: fenced, as the initiator is there) and mechanism with
// every fault of
// docs/registration.md#fault-scenarios injected (TestLostFlushCompletions,
// TestStaleWrappedKey, TestRegFailure, TestWrongKeyLocalInv and
// TestPostBeforeRTS pin the ones with the most moving parts); set
// GOSRP_FRMR_SOAK=N for N I/Os per profile and GOSRP_FRMR_SEED=S to replay a
// failing seed (printed on failure).
package frmr
