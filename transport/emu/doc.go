// Package emu is a software RDMA NIC: a transport.Provider that emulates a
// strict InfiniBand-style device in user space, moving real bytes between
// arenas and failing exactly where hardware fails.
//
// What it models (the rules of docs/verbs.md):
//
//   - Memory objects (regular MRs, fast-registration MRs, type-2 memory
//     windows) with a device copy of key, state (FREE/VALID), page range,
//     iova, length and access that only executed work requests change; the
//     consumer's staged copy (FastRegMR.Map) is snapshotted into the work
//     request when it is posted, never read later (the rxe bug behind ib_srp's
//     "off by one" invalidations, docs/verbs.md#keys).
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
//     retries and then RNR_RETRY_EXC_ERR (never, with RNRRetryForever:
//     IBA's rnr_retry 7); duplicate requests are detected
//     by sequence number and a duplicate READ is re-executed against the
//     current memory state.
//   - Device quirks, bundled as profiles (strict, ib, iwarp, rxe) or set one
//     by one (transport.Quirks).
//   - Wires: loop (both ends in one process), tcp (siw-like framing
//     between processes or hosts; the receiving NIC checks every access
//     before touching memory, a malformed frame moves the QP to ERR, and
//     ACKs queued back to back are coalesced into the last, which the
//     requester takes as acknowledging every SEND and WRITE before it)
//     and shm (two processes on one host, below).
//   - Seeded fault injection (Faults, and the Inject* methods) and
//     observability for tests (MRInfo, Outstanding, Counters).
//
// # Profiles
//
// A profile (Config.Profile) bundles the quirks of a kind of device; each
// knob can also be set on its own (Config.Quirks replaces the profile's
// quirks). strict is the default and the most unforgiving reading. rxe is
// emulated as the project meets it: through user-space verbs and the
// ibverbs provider, which stops before the device the rxe behaviours that
// crash a host or break the contract (see the transport/ibverbs package
// doc, "rxe as measured"). Where the rxe measured in the VM (test/rxe,
// Debian 6.1 kernel, rdma-core 44) and the rxe profile disagree on a
// rule, the profile is wrong, with one exception: where Debian's 6.12
// kernel (bookworm-backports, GOSRP_RXE_KERNEL_SUITE) behaves otherwise,
// the profile follows 6.12 [11]. Statuses are written without their
// _ERR suffix; "-" is the rule's strict outcome.
//
//	rule                          strict       ib           iwarp        rxe emulated  rxe measured in the VM
//	LINV / SEND_WITH_INV key      full key     index only   index only   full key      full key
//	invalidate a FREE object [1]  fails        fails        succeeds     fails         host oops; the provider
//	                                                                                     fails it (LOC_QP_OP)
//	flushed REG/BIND/LINV [2]     poisons      poisons      no           no            no
//	failed LOCAL_INV, REG_MR      MW_BIND      MW_BIND      MW_BIND      WR_FLUSH      LOC_QP_OP (no REG_MR);
//	  [11]                                                                               6.12: WR_FLUSH
//	failed BIND_MW                MW_BIND      MW_BIND      MW_BIND      WR_FLUSH      MW_BIND; 6.12: WR_FLUSH
//	LINV of a window bound        MW_BIND      MW_BIND      MW_BIND      LOC_QP_OP     succeeds; the provider
//	  through another QP                                                                 fails it (LOC_QP_OP)
//	SEND_WITH_INV of a window     REM_INV_REQ  REM_INV_REQ  REM_INV_REQ  succeeds      succeeds (6.1), the
//	  of another QP or PD [14]                                                           window FREE
//	post send before RTS [3]      refused      dropped      refused      refused       WQE queued, doorbell
//	                                                                                     EINVAL; provider refuses
//	error completion fields [4]   garbage      garbage      zero         zero          zero
//	responder error event [5]     raised       raised       raised       none          none (only SQ_DRAINED)
//	lkey does not resolve [6]     LOC_PROT     LOC_PROT     LOC_PROT     WR_FLUSH      LOC_QP_OP; 6.12: WR_FLUSH
//	local SGE out of bounds       LOC_PROT     LOC_PROT     LOC_PROT     WR_FLUSH      LOC_PROT; 6.12: WR_FLUSH
//	SEND > receive: receiver      LOC_LEN      LOC_LEN      LOC_LEN      LOC_QP_OP     LOC_QP_OP
//	                sender        REM_INV_REQ  REM_INV_REQ  REM_INV_REQ  REM_OP        REM_OP
//	access beyond a window,       REM_ACCESS   REM_ACCESS   REM_ACCESS   served [7]    served [7]
//	  inside its MR
//	REG_MR (FRMRs)                yes          yes          yes          yes [8]       ErrUnsupported
//	destroy a QP with a window    ErrBusy      windows      windows      ErrBusy       waits ~50 s, kernel
//	  bound through it [9]                     invalidated  invalidated                WARNING; the provider
//	                                                                                     refuses (ErrBusy)
//	index of a new MR or window   freed last   freed last   freed last   cyclic        cyclic: 64 windows
//	  after a free [10]                                                                  freed in turn, 64
//	                                                                                     indices
//	request received as the QP    flushed      flushed      flushed      flushed (see  6.1: flushed; 6.12.95:
//	  enters ERR [12]                                                    [12])         replayed, oops if a
//	                                                                                     SEND_WITH_INV
//	local op behind a retried     executed     executed     executed     executed      executed again (6.1
//	  request [13]                once         once         once         again         seen; every release)
//
// [1] A LOCAL_INV, or a received SEND_WITH_INV, naming a FREE MR or window
// with its current key. Failing means the local-op status
// (Quirks.LocalOpErrStatus) for LOCAL_INV and REM_INV_REQ at the receiver
// of a SEND_WITH_INV (Quirks.InvalidateFreeOK false). rxe dereferences
// NULL in rxe_do_invalidate_mw; the provider rewrites the LOCAL_INV so that
// it fails, and a SEND_WITH_INV when both ends are on one device, but it
// cannot see a peer's windows: never invalidate a key twice.
//
// [2] Every later REG_MR, BIND_MW or LOCAL_INV on an object named by a
// flushed memory operation fails MW_BIND until it is deregistered
// (Quirks.PoisonOnFlush; ConnectX-2/3).
//
// [3] refused: PostSend fails with ErrInvalidState and n = 0; dropped:
// accepted and never completed (Quirks.DropPostsBeforeRTS).
//
// [4] Fields of an error completion other than ID, status, QP number and
// vendor error (Quirks.ScrambleErrorWC); ibv_poll_cq(3) says they are
// undefined. rxe leaves opcode, byte_len and vendor_err zero.
//
// [5] QP_ACCESS_ERR for an inbound access violation, QP_REQ_ERR for a bad
// SEND_WITH_INV, QP_FATAL for a SEND into a receive too small or unusable;
// the responder's QP goes to ERR either way (Quirks.NoQPErrorEvents).
// Events of injected faults (QP error, link cut, CQ overrun) are raised on
// every profile.
//
// [6] Wrong 8-bit key, another PD, deregistered or FREE, in a source of a
// SEND or RDMA WRITE or in a receive buffer a SEND lands in
// (Quirks.LocalKeyErrStatus). In the VM a SEND with a bad lkey completed
// LOC_QP_OP, and a receive with one LOC_QP_OP with REM_OP at the sender,
// which is what the profile does. A bad sink of an RDMA READ is LOC_PROT
// on every profile, as rxe's completer reports it.
//
// [7] A device bug, not a feature (Quirks.WindowBoundsUnchecked): rxe
// checks a window access against the MR under the window only, so a peer
// can reach the whole MR through any window over it; the profile
// reproduces it so that consumers are tested against it. Consumers must
// not rely on window bounds to isolate buffers on rxe, nor on the bug.
//
// [8] Kernel rxe implements REG_MR, but user-space verbs have no FRMR: the
// ibverbs provider uses type-2 windows instead. The profile keeps FRMRs so
// the frmr pool's REG_MR path runs on it too.
//
// [9] rxe's BIND_MW takes a reference on the QP it is posted on
// (rxe_do_bind_mw), dropped only when the window is invalidated or
// deallocated; rxe_destroy_qp waits for it (every reconnect of the
// end-to-end test stalled ~50 s) and then warns in __rxe_cleanup
// (Quirks.DestroyQPInvalidatesWindows). Refusing is the strict reading:
// it keeps the QP, so a consumer that destroys the QP before it replaces
// the windows it cannot vouch for leaks it, and initiator's
// TestTeardownReleasesWindows sees that.
//
// [10] rxe allocates object indices with xa_alloc_cyclic (rxe_pool.c), so
// a freed index comes back only once the rest of the range has been
// handed out (Quirks.CyclicIndices); the other profiles hand back the
// index freed last, the harshest reuse. It decides how long frmr's
// windows can keep every key a peer has seen from coming back (frmr's
// "Stale descriptors").
//
// [11] On Debian's 6.12 kernel (6.12.95, test/rxe with
// GOSRP_RXE_KERNEL_SUITE=bookworm-backports, 2026-12-05) every send-queue
// WR that fails at the requester completed WR_FLUSH_ERR, like the WRs
// after it: LOCAL_INV of a FREE window or with a wrong key, BIND_MW of a
// bound window or of another index, a SEND with a bad lkey. 17
// conformance cases that expect the cause failed on it (in each of the
// suite's two polling passes), and 3 of the measurements. A bad READ sink
// (found by the completer) and the responder's errors are still reported.
// rxe's completer flushes the whole send queue once the requester has
// moved the QP to ERR ("RDMA/rxe: Fix multiple rxe_qp_error calls",
// v6.10), the failed WR included (Quirks.LocalErrFlushed). The profile
// follows 6.12, the harsher of the two for a consumer, which must read
// such a flush as "this WR failed or never ran, and the QP is in ERR";
// the strict, ib and iwarp profiles report the cause. The ibverbs
// provider sets the quirk from the running kernel's release.
//
// RDMA READ credit is negotiated at connect as rdma_cm does it and kept on
// every profile (transport.ReadCredit): the connect request carries the
// requester's initiator_depth and responder_resources, the acceptor sees
// them swapped into its own view (ConnRequest.ReadCredit), and a requester
// holds at most Conn.ReadCredit().Out READs outstanding; the next READ and
// the queue behind it wait for a response, for ever with no credit. That
// is what the kernel's ib_srp met on rxe: it asks for no READs of its own,
// srpd's provider took the figures the wrong way round, its QP got
// max_rd_atomic 0, and every write needing an RDMA READ hung until the
// SCSI layer reset the host (107 s for a 64 KiB write) while 4 and 8 KiB
// writes, sent as immediate data, worked. The conformance family
// ReadCredit (Asymmetric fails on a provider that swaps them, None on one
// that lets a READ go without credit) runs here and on rxe in the VM.
// The READs a peer holds at a responder are not bounded here (rxe does
// not NAK them either; it reuses its oldest responder resource).
//
// Also measured in the VM and the same in every profile: a SEND_WITH_INV
// with a wrong key fails the receive REM_INV_REQ and moves the receiver to
// ERR while the sender sees SUCCESS; deregistering an MR with a bound
// window is ErrBusy; a receive posted in RESET is ErrInvalidState; a bad
// rkey, permission or bound is REM_ACCESS at the requester with both QPs
// in ERR; slots of unsignaled send WRs are accounted until a later
// completion (ErrQueueFull). With the faults made in front of the device
// (transport/faults, TestConformanceFaults in transport/ibverbs), rxe
// behaves as every profile does: a QP moved to ERR mid-chain flushes every
// later WR, unsignaled ones included, with one completion each in posting
// order; after an error completion the rest flush; a cut link closes both
// Conn.Done channels with ErrDisconnected and leaves both QPs in ERR; a
// REG→SEND chain cut after the bind leaves the window bound under its new
// key. Not emulated: the rxe behaviours the provider
// repairs (a second BIND_MW comparing a stale ibv_mw.rkey, the received
// SEND_WITH_INV flag's numbering, receives posted in ERR left unflushed,
// work posted in SQD left queued after SQD -> RTS), rxe's limits and timing
// (MTU 1024, about 4 s to RNR_RETRY_EXC with rnr_retry 6) and the kernel
// WARNING when a QP is destroyed with a window still bound through it.
//
// [12] On 6.12.95 rxe carries a request it completes as its QP enters ERR
// out again for every receive still posted, and a SEND_WITH_INV so
// replayed invalidates a FREE window: a kernel oops (the faults run of the
// initiator's end-to-end test, 2 panics in about 90 runs). The NIC
// replays under Quirks.ReplayOnErr (replay.go) with a wider window than
// rxe's few microseconds: the last SEND, if the QP enters ERR while its
// receive completion still waits unpolled in the CQ; it counts each oops
// rxe would have had (Counters.KernelOopses). The conformance suite
// passes with the quirk set (TestConformanceKnobs/ReplayOnErr), as it
// does on rxe 6.12.95. No profile sets it: the rxe profile is the rxe of
// 6.1 (and, by Debian's changelog, of 6.12.111 on), which flushes
// instead; the quirk is one kernel's bug, not the device's nature. Tests set it through
// Config.Quirks (TestReplayOnErr; the initiator's
// TestReplayOnErrUnderFaults, which counts 100 to 200 oopses in 2,000
// I/Os when the initiator asks for remote invalidation on such a
// device).
//
// [13] rxe's req_retry rewinds its requester to the oldest request not
// yet completed, and rxe_requester runs every local operation it meets
// again, done or not. Seen on Linux 6.1 in the VM: one requester retry
// in about 69,000 packets (completer_retry_err=1, nothing lost: a late
// ACK) and a BIND_MW repeated over its bound window failed MW_BIND_ERR,
// ending the connection. Worse, a registration whose key the peer has
// invalidated in between (SEND_WITH_INV) is registered again, valid
// after its I/O ended. The NIC repeats them under
// Quirks.RetryRepeatsLocalOps, which the rxe profile sets, on every
// rewind (a timeout, an RNR NAK); a repeated LOCAL_INV of a FREE window
// is counted as the oops it is on rxe (Counters.KernelOopses). rxe
// fences every LOCAL_INV (rxe_wqe_is_fenced, since 6.0), so a LOCAL_INV
// is at the head of its queue when it executes and is never repeated
// there; here only a fenced one waits. TestRetryRepeatsLocalOps shows
// both outcomes; InjectWithholdAcks makes retries on demand, and the
// initiator's TestRetryLeavesNoKey fails when the initiator asks for
// remote invalidation on such a device, or registers without a fenced
// LOCAL_INV in front (frmr.Config.FenceRegistrations): seen in the CI VM
// as one lost connection in about 20,000 I/Os of bench at QD32. Retries
// are rare, so the NIC also counts the hazard itself, retry or not: a
// local operation that executes while a request before it waits for its
// ACK (Counters.ExposedLocalOps). The initiator's TestFaultsWrapped
// requires none on the rxe profile; without the fence it counts about
// 1,300 in 1,500 I/Os.
//
// [14] rxe_invalidate_mw finds the window of a received SEND_WITH_INV by
// its key in the device's pool and checks only that it is not INVALID
// (Quirks.RemoteInvalidateAnyQP): the peer of any connection of the host
// ends another's registration (conformance
// FastReg/MW/SendWithInvValid{OtherQP,OtherPD}, measured on 6.1), and one
// naming a FREE window under its key oopses the kernel, which no provider
// on the receiving host can stop; the NIC counts it
// (Counters.KernelOopses, TestRemoteInvalidateFreeWindow).
//
// The tcp and shm listeners outlive a temporary accept failure (out of
// descriptors, say): they count it (Counters.AcceptErrors), log it at a
// bounded rate and retry after a backoff of 5 ms doubling to 1 s; any
// other failure of the listening socket is logged and returned by Accept.
// The NIC forgets a connection once it has ended, and a listener once it
// is closed.
//
// The shm wire is kernel bypass between two processes. Listen takes a
// unix socket path ("" picks a fresh one under os.TempDir()); a socket
// left there by a listener that died is replaced, one that is alive or a
// file that is not a socket is not (ErrBusy). A listener owns its path
// through an flock on PATH.lock (the kernel drops the lock when the
// process dies; a clean Close removes the file), so of several started at
// once exactly one gets the path, and a closing listener removes the path
// only while it still names its own socket. Connection management,
// arena hand-over and disconnect travel on that SOCK_SEQPACKET socket,
// and nothing else does:
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
//     idle it polls for about twice its recent average wait (2–50 µs),
//     and up to 200 µs while its own requests await answers unless a
//     poll shows the CPUs oversubscribed (Config.ShmPoll "eager" polls
//     for answers regardless), then sleeps, so a slow or co-scheduled
//     peer does not cost it a spinning CPU. Its doorbell flag in shared
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
// or read through a remote key that is being invalidated. No lock is held
// across a socket read or write: the tcp wire copies a READ response into
// a per-QP buffer under the lock and frames SEND and WRITE sources (the
// requester's own, lkey-checked memory) straight from the arena into its
// pending batch, or, from 8 KiB on, writes them from the arena itself
// (writev), which the consumer leaves alone until the WR completes, after
// the peer's ACK; the shm wire copies under the same shared lock, straight
// between the two processes' arenas.
package emu
