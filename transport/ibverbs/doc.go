// Package ibverbs is the hardware provider of the gosrp verbs contract
// (package transport): libibverbs and librdmacm through cgo.
//
// It is built only with the build tag ibverbs on Linux with cgo
// (go build -tags ibverbs; needs libibverbs-dev and librdmacm-dev). The
// default build contains only a hint, so that transport.Open("ibverbs",
// nil) says how to get the provider. Programs select it for its side
// effect:
//
//	import _ "github.com/gosrp/gosrp/transport/ibverbs"
//
//	p, err := transport.Open("ibverbs", nil)
//
// # Mapping
//
// Device is an ibv_context (ibv_open_device); its attributes come from
// ibv_query_device and ibv_query_port of port 1. A goroutine owned by the
// Device reads ibv_get_async_event and is stopped by Close. PD.RegMR is
// ibv_reg_mr on arena memory (Arena.Addr()+off). CQ is ibv_create_cq with
// a completion channel; CQ.Wait polls the CQ for a while, then arms it
// (ibv_req_notify_cq) and sleeps in poll(2) on the channel fd and an
// eventfd that context cancellation and Close write (Waiting, below). QP
// is an RC ibv_create_qp; posts fill C arrays of ibv_send_wr / ibv_sge
// sized at creation, so posting and polling do not allocate and no Go
// pointer reaches C. The wr_id the device sees is a slot handle (QP
// handle, queue, sequence number); the slot holds the consumer's ID, and
// completions retire slots in order, which gives exact queue accounting
// (ErrQueueFull) whatever the device does. MRs and
// windows are named through per-device handle tables, so a post naming a
// closed MR or window fails with transport.ErrClosed. errno values are
// mapped to transport sentinel errors in one place (ENOMEM on post is
// ErrQueueFull, ENOMEM on create ErrNoMemory, EINVAL ErrInvalidArgument).
//
// Connection management uses librdmacm in manual-QP mode: QPs are created
// by PD.CreateQP in RESET (not rdma_create_qp); rdma_init_qp_attr plus
// ibv_modify_qp drive INIT, RTR and RTS, the QP number travels in
// rdma_conn_param.qp_num, and the active side calls rdma_establish after
// RDMA_CM_EVENT_CONNECT_RESPONSE. Listen("") binds $GOSRP_IBVERBS_ADDR if
// set, else the first IPv4 address of a netdev that carries an RDMA device.
//
// # Waiting
//
// A consumer polls its CQ until it is empty and then calls CQ.Wait. What
// Wait costs decides the latency and CPU of each I/O, because most I/Os
// end with a Wait on each side: the initiator waits for the response, the
// target for the next command.
//
// Polling is cheap and sleeping is not. ibv_poll_cq reads the CQ's ring in
// user memory, for rxe (rdma-core providers/rxe/rxe.c, rxe_poll_cq, over
// the queue the kernel's rxe_cq_post fills) as for hardware, so it is no
// system call. Sleeping is three: ibv_req_notify_cq (rxe's is
// ibv_cmd_req_notify_cq, a write to the uverbs fd that lands in the
// kernel's rxe_req_notify_cq), poll(2) on the completion channel, and the
// read of ibv_get_cq_event, plus the wake-up by the kernel's
// rxe_cq_post -> ib_uverbs_comp_handler and a thread switch. The profile
// of bench at QD1 on rxe in a TCG VM had the channel's poll(2),
// ibv_get_cq_event and ibv_req_notify_cq on both sides right behind
// ibv_post_send.
//
// So Wait first polls the CQ for up to the busy_poll option
// (DefaultBusyPoll, 50µs; the idea and the name are Linux's
// net.core.busy_poll), yielding between looks to the process's other
// goroutines and, with sched_yield(2), to other threads of its CPU (the
// peer that will complete the I/O may be one of them when both ends share
// a host), and keeps what it finds for the next Poll; a busy queue is then
// drained without a system call and the CQ is never armed. Only a CQ that
// stayed empty that long is armed, polled once more (a completion added
// between the last poll and the arming raises no event: IBA's CQ
// notification fires only for completions added after the request), and
// slept on. The event is acknowledged at once (ibv_ack_cq_events), and the
// CQ is armed again only by a later Wait that finds it idle, as the
// kernel's own CQ polling for its consumers (ib_poll_handler in
// drivers/infiniband/core/cq.c) re-arms only when a round of polling came
// up short of its budget.
//
// The bound is what keeps this right beyond a dedicated machine: polling
// burns a core while it lasts, so busy_poll=0 restores arm-at-once for a
// host that shares its cores. CQ.WaitStats counts busy-poll hits, arms and
// sleeps.
//
// A round trip longer than the bound is slept through whole: over rxe in
// a TCG guest a 4 KiB QD1 I/O takes about 500 µs polled and three times
// that with a sleep on each side (docs/performance.md). busy_poll=1s meets
// it, at the price of a core per waiter after every I/O, idle or not.
// busy_poll=adaptive polls each CQ for twice its recent waits
// (transport/internal/spin: a moving average of the time from a Wait's
// first empty look to its completion), between DefaultBusyPoll and
// AdaptiveBusyPollMax: a steady QD1 stream is met polling, and a CQ
// whose waits outlast the maximum (an idle connection) polls
// DefaultBusyPoll and sleeps. srpd, srpc and bench, programs for a
// machine given to storage, open the provider with busy_poll=adaptive
// unless told otherwise (internal/cli.BusyPoll); the provider's own
// default stays the short poll, right for a Go program that embeds an
// initiator among its own work.
//
// # Fast registration
//
// User-space verbs have no fast-registration MR: IB_WR_REG_MR is
// kernel-only. Its user-space equivalent is the type-2 memory window:
// PD.AllocMW (ibv_alloc_mw with IBV_MW_TYPE_2) bound by an OpBindMW work
// request (IBV_WR_BIND_MW) over an MR registered with AccessMWBind, with a
// key bumped by Key.Bump (ibv_inc_rkey), invalidated by OpLocalInv
// (IBV_WR_LOCAL_INV) or by the peer's OpSendWithInv
// (IBV_WR_SEND_WITH_INV). So this provider never reports CapFastRegMR,
// AllocFastRegMR returns transport.ErrUnsupported and posting OpRegMR fails
// at post with transport.ErrUnsupported. (mlx5dv UMR would be a later,
// device-specific option.) Capabilities and the device flags they need:
//
//	CapMemWindow2   IBV_DEVICE_MEM_WINDOW_TYPE_2B
//	CapLocalInv     IBV_DEVICE_MEM_MGT_EXTENSIONS
//	CapSendWithInv  IBV_DEVICE_MEM_MGT_EXTENSIONS
//	CapHugePages    always (ibv_reg_mr accepts hugetlb memory)
//	CapFastRegMR    never (kernel-only)
//	CapSharedArenas never claimed (the software NIC's shm wire)
//
// # Private data
//
// On InfiniBand and RoCE the CM messages carry fixed-size private-data
// fields, so the passive side sees the request's private data zero-padded
// to 56 bytes and the active side sees accept (196) and reject (148)
// private data padded likewise. Protocols must carry their own lengths.
//
// # rxe as measured
//
// DeviceAttr.Quirks of the kernel's soft-RoCE driver (vendor_id 0xffffff)
// follow what TestMeasure, the smoke tests and the conformance suite saw
// on Debian's 6.1.0-57 kernel with rdma-core 44 in a TCG VM
// (test/rxe/run.sh). Where rxe is unsafe or breaks the contract and the
// provider can see it coming, the provider makes rxe behave strictly; the
// Quirks then describe the provider's behaviour, and this table says what
// rxe itself does. The software NIC's rxe profile (transport/emu) emulates
// rxe behind this provider; the emu package doc compares it, rule by rule,
// with the strict, ib and iwarp profiles and with this measurement.
//
//	rule                                 rxe as measured -> provider
//	LOCAL_INV of a FREE type-2 window    kernel oops (NULL deref, __rxe_put
//	  (never bound, or invalidated)        from rxe_do_invalidate_mw), the
//	                                       host dies -> the provider
//	                                       rewrites it to an impossible key:
//	                                       LOC_QP_OP_ERR, QP to ERR
//	                                       (InvalidateFreeOK false)
//	SEND_WITH_INV of a FREE window       same oops, in the receiver's kernel;
//	                                       rewritten only when both ends are
//	                                       on this device (loopback): the
//	                                       receiver gets REM_INV_REQ_ERR
//	SEND_WITH_INV of a VALID window      succeeds (6.1): rxe_invalidate_mw
//	  bound through another QP, or of      checks neither -> nothing a
//	  another PD                           receiver can do
//	                                       (RemoteInvalidateAnyQP)
//	request received as the QP enters    6.12.95: carried out again for each
//	  ERR                                  receive still posted, a
//	                                       SEND_WITH_INV invalidating its
//	                                       window twice: the oops above, in
//	                                       1 faults run in ~30 (the initiator
//	                                       moved its QP to ERR under the
//	                                       target's answers); 6.1 flushes the
//	                                       receives -> ReplayOnErr, set from
//	                                       the kernel release
//	                                       (rxeReplaysOnErr): the initiator
//	                                       then never asks for remote
//	                                       invalidation
//	LOCAL_INV key compare                full 32 bits: wrong 8-bit key ->
//	                                       LOC_QP_OP_ERR (InvalidateIndexOnly
//	                                       false)
//	LOCAL_INV of a window bound on       succeeds on rxe -> rewritten to fail
//	  another QP, or of another PD         (LOC_QP_OP_ERR)
//	failed LOCAL_INV status              LOC_QP_OP_ERR, vendor_err 0
//	                                       (LocalOpErrStatus); on 6.12
//	                                       WR_FLUSH_ERR, as every local
//	                                       failure of a send-queue WR
//	                                       (LocalErrFlushed, set from the
//	                                       kernel release: 6.10 and later)
//	failed BIND_MW status                MW_BIND_ERR (e.g. bind of a bound
//	                                       window), while LocalOpErrStatus
//	                                       is LOC_QP_OP_ERR: a failed
//	                                       BIND_MW may report MW_BIND_ERR on
//	                                       any device (Quirks doc)
//	BIND_MW, new key of another index    binds under the window's own index
//	                                       with the new 8-bit key -> made to
//	                                       fail: MW_BIND_ERR
//	second BIND_MW of a window           rxe compares ibv_mw.rkey, which
//	                                       libibverbs never updates for type
//	                                       2, with its key -> the provider
//	                                       keeps ibv_mw.rkey current
//	remote access beyond a window        served if inside the underlying MR
//	                                       (the window's bounds are not
//	                                       checked): not fixable here
//	                                       (WindowBoundsUnchecked)
//	ibv_dereg_mr with a bound window     EINVAL -> ErrBusy
//	post send in RESET/INIT              the library queues the WQE, then
//	                                       the doorbell fails EINVAL; the
//	                                       "refused" WQE flushes later ->
//	                                       refused before the device:
//	                                       ErrInvalidState, n = 0
//	                                       (DropPostsBeforeRTS false)
//	post recv in RESET                   EINVAL -> ErrInvalidState; INIT ok
//	modify RESET -> ERR                  EINVAL (kernel table) -> via INIT
//	SQD -> RTS                           work posted in SQD stays queued ->
//	                                       the provider rings the doorbell
//	SQ overflow                          slots of unsignaled WRs are freed
//	                                       as they execute -> the provider
//	                                       counts slots: ErrQueueFull
//	error completion fields              opcode 0, byte_len 0, vendor_err 0;
//	                                       ID, status, qp_num right
//	                                       (ScrambleErrorWC false)
//	bad rkey on RDMA WRITE               REM_ACCESS_ERR at the requester,
//	                                       both QPs to ERR, no QP_ACCESS_ERR
//	                                       async event at the responder
//	                                       (NoQPErrorEvents; no QP event of
//	                                       any kind was seen)
//	SEND_WITH_INV with a wrong key       receiver REM_INV_REQ_ERR and ERR,
//	                                       sender SUCCESS, no QP_REQ_ERR
//	async events seen                    SQ_DRAINED (RTS -> SQD) only
//	received SEND_WITH_INV flag          kernel numbering: bit 2
//	                                       (IBV_WC_IP_CSUM_OK in libibverbs)
//	                                       -> read as IBV_WC_WITH_INV
//	lkey that does not resolve (wrong    LOC_QP_OP_ERR, not LOC_PROT_ERR
//	  8-bit key, other PD, deregistered)   (LocalKeyErrStatus); SGE out of
//	                                       the MR's bounds: LOC_PROT_ERR;
//	                                       later WRs flush
//	SEND larger than the receive buffer  receiver LOC_QP_OP_ERR, not
//	                                       LOC_LEN_ERR (RecvLenErrStatus);
//	                                       sender REM_OP_ERR
//	receives posted in ERR               not flushed until something runs
//	                                       the responder -> the provider
//	                                       re-enters ERR after such posts
//	ibv_destroy_qp with a window still   waits ~50 s for the window's
//	  bound through it                     reference, then a kernel WARNING
//	                                       (__rxe_cleanup) and the destroy
//	                                       succeeds -> refused before the
//	                                       device: ErrBusy, the QP stays
//	                                       (DestroyQPInvalidatesWindows
//	                                       false)
//	completion before the post returns   rxe runs a user QP's requester
//	                                       inside ibv_post_send, so another
//	                                       thread can poll a WR's completion
//	                                       before the post returns -> the
//	                                       provider publishes its wr_id slots
//	                                       before the post (a completion for
//	                                       an unpublished slot was dropped)
//	no receive posted (rnr_retry 6)      RNR_RETRY_EXC_ERR after ~4 s
//	local operations behind a retried    executed again (req_retry): a
//	  request                              BIND_MW of a bound window then
//	                                       fails MW_BIND_ERR (6.1, one
//	                                       retry in ~69,000 packets, a late
//	                                       ACK under TCG), and one of a
//	                                       window the peer invalidated
//	                                       meanwhile makes its key valid
//	                                       again -> RetryRepeatsLocalOps:
//	                                       the initiator puts every BIND_MW
//	                                       behind a fenced LOCAL_INV and
//	                                       invalidates its own keys with
//	                                       fenced LOCAL_INVs;
//	                                       the ACK timeout is raised to
//	                                       ~2.1 s (RxeAckTimeout) so that a
//	                                       late ACK seldom makes a retry
//	REG_MR                               not in user verbs: ErrUnsupported
//	limits                               max_qp_wr 1048576, max_sge 32,
//	                                       max_cqe 32767, inline 512, MTU
//	                                       1024 on a 1500-byte netdev
//
// The provider's view of a window (bound or FREE, its current key, the QP
// that bound it) follows posting order. It is rolled back for requests
// ibv_post_send refused (never given to the device), and made unsure when
// a completion reports that a request which changed it failed or was
// flushed, or its QP is reset: on Linux 6.10 and later rxe flushes
// requests it has already carried out (Quirks.LocalErrFlushed), so a
// flushed BIND_MW, LOCAL_INV or SEND_WITH_INV may have taken effect. Every
// invalidation naming an unsure window is refused until a BIND_MW of it
// posted since completes successfully. When the view was rolled back
// instead, a target's SEND_WITH_INV of a window its earlier, flushed
// SEND_WITH_INV had made FREE reached rxe, which panicked the 6.12 guest
// in the faults run of the initiator's end-to-end test (2 runs in 6);
// with the window unsure, 8 runs in 8 passed. The provider cannot see a
// peer's windows, so a remote SEND_WITH_INV of a FREE window still crashes
// an rxe host: never invalidate a key twice.
package ibverbs
