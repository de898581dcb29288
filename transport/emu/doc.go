// Package emu is a software RDMA NIC: a transport.Provider that emulates a
// strict InfiniBand-style device in user space, moving real bytes between
// arenas and failing exactly where hardware fails.
//
// What it models (frmr-semantics §2–§4, §9):
//
//   - Memory objects (regular MRs, fast-registration MRs, type-2 memory
//     windows) with a device copy of key, state (FREE/VALID), page range,
//     iova, length and access that only executed work requests change; the
//     consumer's staged copy (FastRegMR.Map) is snapshotted into the work
//     request when it is posted, never read later (the rxe bug behind seed
//     thread 002).
//   - Key, PD, state, access and bounds checks on every local SGE, remote
//     READ/WRITE, LOCAL_INV, REG_MR, BIND_MW and received SEND_WITH_INV.
//   - RC queue pairs: RESET→INIT→RTR→RTS, SQD, ERR; one send queue executes
//     in posting order; local operations execute exactly once and are never
//     replayed on retransmission; FENCE (local-invalidate fence on
//     LOCAL_INV); a completion for every signaled success and every error;
//     flush of both queues on ERR; send-queue slots of unsignaled requests
//     reclaimed only when a later signaled request completes.
//   - The responder: a bad rkey, permission or bound NAKs with a remote
//     access error and moves the responder to ERR; a bad SEND_WITH_INV
//     fails the receive with REM_INV_REQ_ERR; no receive posted means RNR
//     retries and then RNR_RETRY_EXC_ERR; duplicate requests are detected
//     by sequence number and a duplicate READ is re-executed against the
//     current memory state.
//   - Device quirks, bundled as profiles (strict, ib, iwarp, rxe) or set one
//     by one (transport.Quirks).
//   - Wires: loop (both ends in one process) and tcp (siw-like framing
//     between processes or hosts; the receiving NIC checks every access
//     before touching memory, and a malformed frame moves the QP to ERR).
//   - Seeded fault injection (Faults, and the Inject* methods) and
//     observability for tests (MRInfo, Outstanding, Counters).
//
// Locking: a device-wide RWMutex guards memory-object state; data copies
// hold it shared, memory operations (REG_MR, LOCAL_INV, BIND_MW, remote
// invalidation, deregistration) hold it exclusively, so no byte is placed
// through a key that is being invalidated. No lock is held across a
// socket read or write: the tcp wire stages payloads in per-QP buffers.
package emu
