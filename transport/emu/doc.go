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
//   - Wires: loop (both ends in one process), tcp (siw-like framing
//     between processes or hosts; the receiving NIC checks every access
//     before touching memory, and a malformed frame moves the QP to ERR)
//     and shm (two processes on one host, below).
//   - Seeded fault injection (Faults, and the Inject* methods) and
//     observability for tests (MRInfo, Outstanding, Counters).
//
// The shm wire is kernel bypass between two processes. Listen takes a
// unix socket path ("" picks a fresh one under os.TempDir()); connection
// management, arena hand-over and disconnect travel on that SOCK_SEQPACKET
// socket, and nothing else does:
//
//   - The passive side creates the connection region, a sealed memfd it
//     passes with the accept (SCM_RIGHTS): four single-producer/
//     single-consumer rings of 64-byte descriptors, a request and a
//     response ring per direction, each with exactly one producing
//     goroutine (a requester, or a ring reader answering as responder).
//   - Every transport.Arena is memfd-backed (Arena.MemFD). The first time a
//     descriptor names an arena the peer has not mapped, its memfd goes
//     over the socket first (MAP); the descriptor records how many MAPs
//     preceded it, so the receiver waits for exactly those. The receiver
//     requires the memfd to be sealed against shrinking (no SIGBUS), bounds
//     every segment against the mapped size and unmaps on disconnect.
//   - Payload never crosses a ring (except inline data). SEND and WRITE
//     name the requester's lkey-checked sources and the responder copies
//     them straight into its own rkey-checked memory; READ names the
//     requester's lkey-checked sinks and the responder copies its memory
//     straight into them while it executes the READ (so a READ sees the
//     memory as of its execution, before later WRITEs on the queue). One
//     memcpy per transfer, as a NIC's DMA. A sink gate in shared memory
//     keeps READ data out of a requester's buffers once its QP has gone to
//     ERR (the requester closes the gate and waits out a copy in
//     progress), and a re-executed duplicate READ is answered with the
//     source instead, copied by the requester only if it still waits for
//     that PSN.
//   - A ring reader per connection side drains both incoming rings; when
//     idle it spins, then yields, then sleeps. Its doorbell flag in shared
//     memory tells producers whether it sleeps: only then does one of them
//     send a WAKE datagram, so a busy connection makes no system call per
//     work request. The sleeper waits in the netpoller, not FUTEX_WAIT,
//     which would pin a P (see bell).
//   - The socket stays open: EOF on it (the peer process died) is a lost
//     link — the oldest in-flight WR completes RETRY_EXC_ERR, everything
//     else flushes, Conn.Done closes; a DREQ is an orderly disconnect.
//   - Descriptors live in memory the peer can scribble on at any time:
//     each is copied out before it is decoded, ring indices are checked
//     against the ring size, lengths and offsets against the mapped arena,
//     and anything malformed moves the QP to ERR with a logged reason.
//     The peer process can of course read and write every arena it was
//     handed; the checks make a buggy peer fail loudly, they do not make a
//     malicious one harmless.
//
// Locking: a device-wide RWMutex guards memory-object state; data copies
// hold it shared, memory operations (REG_MR, LOCAL_INV, BIND_MW, remote
// invalidation, deregistration) hold it exclusively, so no byte is placed
// through a key that is being invalidated. No lock is held across a
// socket read or write: the tcp wire stages payloads in per-QP buffers;
// the shm wire copies under the same shared lock, straight between the
// two processes' arenas.
package emu
