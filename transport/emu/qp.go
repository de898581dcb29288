package emu

import (
	"fmt"
	"sync"
	"time"

	"github.com/gosrp/gosrp/transport"
)

type wqeState uint8

const (
	wqeQueued wqeState = iota // posted, not started
	wqeSent                   // transmitted, answer outstanding
	wqeDone                   // finished; status holds the outcome
)

// wqe is a send-queue slot. Everything the device needs is copied in at
// post time, so the consumer may reuse its SendWR and SGL at once.
type wqe struct {
	wr       transport.SendWR
	sgl      []transport.SGE // slot-owned storage for wr.SGL
	inline   []byte          // inline data copied at post
	regMap   mapping         // REG_MR page list snapshotted at post
	signaled bool
	state    wqeState
	status   transport.Status
	byteLen  uint32
	psn      uint32
	sentAt   time.Time
	retries  int
	rnr      int
	reason   string
}

type rwqe struct {
	id  uint64
	sgl []transport.SGE
}

// qp is an emulated RC queue pair. mu guards everything below it. Lock
// order: qp.mu, then device.mem, then cq.mu; never call into another QP
// (a link) while holding mu.
type qp struct {
	dev    *device
	pd     *pd
	num    uint32
	cfg    transport.QPConfig
	sendCQ *cq
	recvCQ *cq

	doorbell chan struct{}
	stop     chan struct{}
	stopped  chan struct{}
	timer    *time.Timer

	mu sync.Mutex
	// pumping is set while a goroutine runs the requester; pumpAgain asks
	// it to run once more (see pump).
	pumping, pumpAgain bool
	armedAt            time.Time // the retry timer's deadline; zero when idle
	state              transport.QPState
	link               link
	conn               *conn

	sq     []wqe
	sqHead uint64 // oldest slot not reclaimed
	sqDone uint64 // oldest slot not completed
	sqNext uint64 // next slot to start
	sqTail uint64 // next free slot
	// blocked stops the requester after a local failure until the failing
	// WR reaches the head and moves the QP to ERR.
	blocked  bool
	inflight []uint64 // slots of transmitted network WRs, in PSN order
	nextPSN  uint32
	rnrUntil time.Time
	drainEv  bool // raise SQ_DRAINED when in-flight work ends in SQD

	rq     []rwqe
	rqHead uint64
	rqTail uint64

	// responder
	expPSN  uint32
	respBuf []byte
	respSeg [1]seg // READ response source on a direct (shm) link
	// requester: the checked sources of the WR being sent
	txPieces [][]byte
	txSegs   []seg // SEND/WRITE sources on a direct (shm) link
	txPkt    packet
	respPkt  packet
	respErr  respErr // the responder's error, applied once its NAK is out

	// injection
	errAfter  int // QP → ERR before this many more WRs start; -1 off
	postFail  int // next PostSend fails at this index; -1 off
	dropCQE   int // drop the n-th next send completion; -1 off
	statusCQE int
	statusSet transport.Status
	dupNext   int

	victims []*qp // QPs to move to ERR after unlocking (CQ overrun)
	overrun []*cq // CQs whose CQ_ERR to raise after that
	// stray receives the outcome of the WR InjectStray posted.
	stray  chan transport.Status
	closed bool
}

func (pd *pd) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	d := pd.dev
	sc, ok1 := cfg.SendCQ.(*cq)
	rc, ok2 := cfg.RecvCQ.(*cq)
	switch {
	case !ok1 || !ok2 || sc.dev != d || rc.dev != d:
		return nil, fmt.Errorf("emu: create qp: CQs must be this device's: %w", transport.ErrInvalidArgument)
	case cfg.MaxSendWR <= 0 || cfg.MaxSendWR > maxQPWR || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxQPWR:
		return nil, fmt.Errorf("emu: create qp with %d send / %d recv WRs (max %d): %w", cfg.MaxSendWR, cfg.MaxRecvWR, maxQPWR, transport.ErrInvalidArgument)
	case cfg.MaxSendSGE > maxSGE || cfg.MaxRecvSGE > maxSGE || cfg.MaxInline > maxInline || cfg.MaxInline < 0:
		return nil, fmt.Errorf("emu: create qp with %d/%d SGEs, %d inline (max %d, %d): %w", cfg.MaxSendSGE, cfg.MaxRecvSGE, cfg.MaxInline, maxSGE, maxInline, transport.ErrInvalidArgument)
	}
	if cfg.MaxSendSGE <= 0 {
		cfg.MaxSendSGE = 1
	}
	if cfg.MaxRecvSGE <= 0 {
		cfg.MaxRecvSGE = 1
	}
	if err := pd.use(); err != nil {
		return nil, err
	}
	q := &qp{
		dev: d, pd: pd, cfg: cfg, sendCQ: sc, recvCQ: rc,
		doorbell: make(chan struct{}, 1),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
		sq:       make([]wqe, cfg.MaxSendWR),
		rq:       make([]rwqe, max(cfg.MaxRecvWR, 1)),
		errAfter: -1, postFail: -1, dropCQE: -1, statusCQE: -1, dupNext: -1,
	}
	for i := range q.sq {
		q.sq[i].sgl = make([]transport.SGE, 0, cfg.MaxSendSGE)
		if cfg.MaxInline > 0 {
			q.sq[i].inline = make([]byte, 0, cfg.MaxInline)
		}
	}
	for i := range q.rq {
		q.rq[i].sgl = make([]transport.SGE, 0, cfg.MaxRecvSGE)
	}
	if err := sc.attach(q); err != nil {
		pd.release()
		return nil, err
	}
	if err := rc.attach(q); err != nil {
		sc.detach(q)
		pd.release()
		return nil, err
	}
	d.qpMu.Lock()
	q.num = d.nextQP
	d.nextQP++
	d.qps[q.num] = q
	d.qpMu.Unlock()
	q.timer = time.NewTimer(time.Hour)
	q.timer.Stop()
	go q.run()
	return q, nil
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) State() transport.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// unlock releases q.mu and then moves the victims of a CQ overrun to ERR.
func (q *qp) unlock() {
	v, overrun := q.victims, q.overrun
	q.victims, q.overrun = nil, nil
	q.mu.Unlock()
	for _, x := range v {
		x.fatal(transport.EventQPFatal, "completion queue overrun")
	}
	for _, c := range overrun {
		c.raiseOverrun()
	}
}

func (q *qp) kick() {
	select {
	case q.doorbell <- struct{}{}:
	default:
	}
}

func (q *qp) Modify(to transport.QPState) error {
	q.mu.Lock()
	defer q.unlock()
	if q.closed {
		return fmt.Errorf("emu: modify qp %d: %w", q.num, transport.ErrClosed)
	}
	from := q.state
	switch {
	case to == transport.QPErr:
		q.toErrLocked(0, "modified to ERR by the consumer")
		return nil
	case to == transport.QPReset:
		q.resetLocked()
		return nil
	case from == to && to != transport.QPSQE:
		return nil
	case from == transport.QPReset && to == transport.QPInit:
		q.state = transport.QPInit
		return nil
	case from == transport.QPRTS && to == transport.QPSQD:
		q.state = transport.QPSQD
		q.drainEv = true
		q.maybeDrainedLocked()
		return nil
	case from == transport.QPSQD && to == transport.QPRTS:
		q.state = transport.QPRTS
		q.drainEv = false
		q.kick()
		return nil
	case (to == transport.QPRTR || to == transport.QPRTS) && q.link == nil:
		return fmt.Errorf("emu: modify qp %d %s→%s: the peer's address comes from connection management: %w", q.num, from, to, transport.ErrInvalidState)
	}
	return fmt.Errorf("emu: modify qp %d %s→%s: %w", q.num, from, to, transport.ErrInvalidState)
}

// connectLocked attaches the wire and moves the QP through INIT and RTR to
// RTS, as rdma_cm does on accept and connect.
func (q *qp) connect(l link, c *conn) error {
	q.mu.Lock()
	defer q.unlock()
	if q.closed {
		return fmt.Errorf("emu: connect qp %d: %w", q.num, transport.ErrClosed)
	}
	if q.state != transport.QPReset && q.state != transport.QPInit {
		return fmt.Errorf("emu: connect qp %d in %s (want RESET or INIT): %w", q.num, q.state, transport.ErrInvalidState)
	}
	if q.link != nil {
		return fmt.Errorf("emu: connect qp %d: already connected: %w", q.num, transport.ErrInvalidState)
	}
	q.link = l
	q.conn = c
	q.state = transport.QPRTS
	q.kick()
	return nil
}

// resetLocked discards every WR without a completion (IBA: entering RESET
// empties the queues).
func (q *qp) resetLocked() {
	for i := q.sqHead; i < q.sqTail; i++ {
		q.sq[i%uint64(len(q.sq))].regMap = mapping{}
	}
	q.sqHead, q.sqDone, q.sqNext, q.sqTail = 0, 0, 0, 0
	q.rqHead, q.rqTail = 0, 0
	q.inflight = q.inflight[:0]
	q.blocked = false
	q.state = transport.QPReset
	q.link = nil
	q.conn = nil
	q.expPSN, q.nextPSN = 0, 0
}

func (q *qp) slot(i uint64) *wqe { return &q.sq[i%uint64(len(q.sq))] }

// ---- posting ----

func (q *qp) PostSend(wrs []transport.SendWR) (int, error) {
	q.mu.Lock()
	for i := range wrs {
		if err := q.postOneLocked(&wrs[i], i); err != nil {
			q.unlock()
			q.pump() // what was accepted runs (bad_wr contract)
			return i, err
		}
	}
	q.unlock()
	q.pump()
	return len(wrs), nil
}

func (q *qp) postOneLocked(wr *transport.SendWR, i int) error {
	p := q.dev.p
	if q.closed {
		return fmt.Errorf("emu: post send: %w", transport.ErrClosed)
	}
	if q.postFail == i {
		q.postFail = -1
		p.counters.postFailures.Add(1)
		return fmt.Errorf("emu: post send WR %d on qp %d (injected): %w", i, q.num, transport.ErrQueueFull)
	}
	if p.chance(p.cfg.Faults.PostFail) {
		p.counters.postFailures.Add(1)
		return fmt.Errorf("emu: post send WR %d on qp %d (random fault, seed %d): %w", i, q.num, p.cfg.Seed, transport.ErrQueueFull)
	}
	if err := q.validateLocked(wr); err != nil {
		return fmt.Errorf("emu: post send WR %d (%s) on qp %d: %w", i, wr.Opcode, q.num, err)
	}
	switch q.state {
	case transport.QPReset, transport.QPInit, transport.QPRTR:
		if p.quirks.DropPostsBeforeRTS {
			return nil // accepted and silently dropped, never completes
		}
		return fmt.Errorf("emu: post send on qp %d in %s: %w", q.num, q.state, transport.ErrInvalidState)
	}
	if q.sqTail-q.sqHead == uint64(len(q.sq)) {
		return fmt.Errorf("emu: post send on qp %d: %d WRs outstanding (unsignaled WRs hold their slot until a later signaled WR completes): %w", q.num, len(q.sq), transport.ErrQueueFull)
	}
	w := q.slot(q.sqTail)
	w.wr = *wr
	w.sgl = append(w.sgl[:0], wr.SGL...)
	w.wr.SGL = w.sgl
	w.signaled = wr.Flags&transport.FlagSignaled != 0 || q.cfg.SignalAll
	w.state = wqeQueued
	w.status = transport.StatusSuccess
	w.byteLen = 0
	w.retries, w.rnr = 0, 0
	w.sentAt = time.Time{}
	w.psn = 0
	w.reason = ""
	w.regMap = mapping{}
	if wr.Flags&transport.FlagInline != 0 {
		w.inline = w.inline[:0]
		for _, s := range wr.SGL {
			a, off, ok := transport.LookupArena(s.Addr, uint64(s.Length))
			if !ok {
				return fmt.Errorf("emu: post send WR %d: inline data at %#x is not arena memory: %w", i, s.Addr, transport.ErrInvalidArgument)
			}
			w.inline = append(w.inline, a.Bytes()[off:off+int(s.Length)]...)
		}
	}
	if wr.Opcode == transport.OpRegMR {
		f := wr.Reg.MR.(*frmr)
		if f.hasMap {
			w.regMap = f.staged
		}
	}
	q.sqTail++
	if q.state == transport.QPErr {
		// Posts to a QP in ERR are accepted and flushed (IBA 10.3.1 ERR).
		q.flushSendLocked()
	}
	return nil
}

func (q *qp) validateLocked(wr *transport.SendWR) error {
	if len(wr.SGL) > q.cfg.MaxSendSGE {
		return fmt.Errorf("%d SGEs, qp allows %d: %w", len(wr.SGL), q.cfg.MaxSendSGE, transport.ErrInvalidArgument)
	}
	switch wr.Opcode {
	case transport.OpSend, transport.OpSendWithImm, transport.OpSendWithInv,
		transport.OpRDMAWrite, transport.OpRDMAWriteWithImm, transport.OpRDMARead:
		n := transport.SGLLen(wr.SGL)
		if n > maxMsgSize {
			return fmt.Errorf("message of %d bytes, max %d: %w", n, maxMsgSize, transport.ErrInvalidArgument)
		}
		if wr.Flags&transport.FlagInline != 0 {
			if wr.Opcode == transport.OpRDMARead {
				return fmt.Errorf("inline RDMA READ: %w", transport.ErrInvalidArgument)
			}
			if n > uint64(q.cfg.MaxInline) {
				return fmt.Errorf("%d bytes inline, qp allows %d: %w", n, q.cfg.MaxInline, transport.ErrInvalidArgument)
			}
		}
	case transport.OpLocalInv:
	case transport.OpRegMR:
		f, ok := wr.Reg.MR.(*frmr)
		if !ok || f.dev != q.dev {
			return fmt.Errorf("REG_MR needs a fast-reg MR of this device: %w", transport.ErrInvalidArgument)
		}
	case transport.OpBindMW:
		w, ok1 := wr.Bind.MW.(*mw)
		m, ok2 := wr.Bind.MR.(*mr)
		if !ok1 || !ok2 || w.dev != q.dev || m.dev != q.dev {
			return fmt.Errorf("BIND_MW needs a window and an MR of this device: %w", transport.ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("opcode %d: %w", wr.Opcode, transport.ErrInvalidArgument)
	}
	return nil
}

func (q *qp) PostRecv(wrs []transport.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.unlock()
	for i := range wrs {
		wr := &wrs[i]
		switch {
		case q.closed:
			return i, fmt.Errorf("emu: post recv: %w", transport.ErrClosed)
		case q.state == transport.QPReset:
			return i, fmt.Errorf("emu: post recv on qp %d in RESET: %w", q.num, transport.ErrInvalidState)
		case len(wr.SGL) > q.cfg.MaxRecvSGE:
			return i, fmt.Errorf("emu: post recv WR %d: %d SGEs, qp allows %d: %w", i, len(wr.SGL), q.cfg.MaxRecvSGE, transport.ErrInvalidArgument)
		case q.cfg.MaxRecvWR == 0 || q.rqTail-q.rqHead == uint64(len(q.rq)):
			return i, fmt.Errorf("emu: post recv on qp %d: %d receives outstanding: %w", q.num, q.rqTail-q.rqHead, transport.ErrQueueFull)
		}
		r := &q.rq[q.rqTail%uint64(len(q.rq))]
		r.id = wr.ID
		r.sgl = append(r.sgl[:0], wr.SGL...)
		q.rqTail++
		if q.state == transport.QPErr {
			q.flushRecvLocked()
		}
	}
	return len(wrs), nil
}

// ---- completions ----

func (q *qp) pushLocked(c *cq, wc *transport.WC) {
	if v := c.push(wc); v != nil {
		q.victims = append(q.victims, v...)
		q.overrun = append(q.overrun, c)
	}
}

// completeSendLocked reports one finished send WR. Errors always complete;
// successes only when signaled (IBA 10.8.6, ibv_post_send(3)).
func (q *qp) completeSendLocked(w *wqe) {
	p := q.dev.p
	if w.wr.ID == StrayWRID && q.stray != nil {
		q.stray <- w.status
		q.stray = nil
	}
	if w.status == transport.StatusSuccess && !w.signaled {
		return
	}
	wc := transport.WC{ID: w.wr.ID, Status: w.status, QPNum: q.num}
	if w.status == transport.StatusSuccess {
		if q.statusCQE == 0 {
			q.statusCQE = -1
			wc.Status = q.statusSet
			w.status = q.statusSet
			p.counters.corruptedCQEs.Add(1)
		} else if q.statusCQE > 0 {
			q.statusCQE--
		} else if p.chance(p.cfg.Faults.CorruptCQE) {
			wc.Status = transport.StatusGeneralErr
			w.status = wc.Status
			p.counters.corruptedCQEs.Add(1)
		}
	}
	if wc.Status == transport.StatusSuccess {
		wc.Opcode = wcOpcode(w.wr.Opcode)
		wc.ByteLen = w.byteLen
	} else {
		q.scrambleLocked(&wc)
	}
	if q.dropCQE == 0 {
		q.dropCQE = -1
		p.counters.droppedCQEs.Add(1)
		return
	} else if q.dropCQE > 0 {
		q.dropCQE--
	}
	if p.chance(p.cfg.Faults.DropCQE) {
		p.counters.droppedCQEs.Add(1)
		return
	}
	q.pushLocked(q.sendCQ, &wc)
}

// scrambleLocked fills the fields of an error completion that ibv_poll_cq(3)
// calls undefined with garbage on devices that do so.
func (q *qp) scrambleLocked(wc *transport.WC) {
	if !q.dev.p.quirks.ScrambleErrorWC {
		return
	}
	r := q.dev.p.randUint32()
	wc.Opcode = transport.WCOpcode(r % 10)
	wc.ByteLen = r
	wc.Flags = transport.WCFlags(r >> 8)
	wc.Imm = ^r
	wc.InvalidatedKey = transport.Key(r * 2654435761)
}

func wcOpcode(o transport.Opcode) transport.WCOpcode {
	switch o {
	case transport.OpRDMAWrite, transport.OpRDMAWriteWithImm:
		return transport.WCRDMAWrite
	case transport.OpRDMARead:
		return transport.WCRDMARead
	case transport.OpLocalInv:
		return transport.WCLocalInv
	case transport.OpRegMR:
		return transport.WCRegMR
	case transport.OpBindMW:
		return transport.WCBindMW
	}
	return transport.WCSend
}

// retireLocked reports finished WRs from the head in posting order. A
// failed WR moves the QP to ERR after it has been reported.
func (q *qp) retireLocked() {
	for q.sqDone < q.sqNext {
		w := q.slot(q.sqDone)
		if w.state != wqeDone {
			break
		}
		q.completeSendLocked(w)
		q.sqDone++
		if w.signaled || w.status != transport.StatusSuccess {
			// A completion frees this slot and every unsignaled one
			// before it (docs/verbs.md#completions).
			q.sqHead = q.sqDone
		}
		if w.status != transport.StatusSuccess {
			q.toErrLocked(w.status, w.reason)
			return
		}
	}
	q.maybeDrainedLocked()
}

func (q *qp) maybeDrainedLocked() {
	if q.state == transport.QPSQD && q.drainEv && q.sqDone == q.sqNext {
		q.drainEv = false
		q.dev.event(transport.AsyncEvent{Type: transport.EventSQDrained, QPNum: q.num})
	}
}

// toErrLocked moves the QP to ERR and flushes both queues in order
// (IBA 10.3.1; rxe flush_send_queue). status is the error that caused it
// (0 for a consumer's modify), for the async event and log.
func (q *qp) toErrLocked(status transport.Status, reason string) {
	if q.enterErrLocked(status, reason) {
		q.flushLocked()
	}
}

// enterErrLocked is the state change of toErrLocked without the flush; it
// reports false if the QP was in ERR already. A QP in ERR answers no
// request, and a post to it flushes both queues in order (postOneLocked),
// so until flushLocked runs only the flush completions are held back.
func (q *qp) enterErrLocked(status transport.Status, reason string) bool {
	if q.state == transport.QPErr {
		return false
	}
	prev := q.state
	q.state = transport.QPErr
	if q.link != nil {
		q.link.closeSinks()
	}
	if status != transport.StatusSuccess || reason != "" {
		q.dev.p.log.Debug("qp to ERR", "qp", q.num, "from", prev, "status", status, "reason", reason)
	}
	q.blocked = false
	q.rnrUntil = time.Time{}
	return true
}

// flushLocked completes both queues' outstanding WRs with WR_FLUSH_ERR.
func (q *qp) flushLocked() {
	q.flushSendLocked()
	q.flushRecvLocked()
}

// flushSendLocked completes every unreported send WR with WR_FLUSH_ERR,
// signaled or not. On devices with PoisonOnFlush, memory objects named by
// flushed memory operations are left unusable until deregistered.
func (q *qp) flushSendLocked() {
	d := q.dev
	poison := d.p.quirks.PoisonOnFlush
	for q.sqDone < q.sqTail {
		w := q.slot(q.sqDone)
		w.status = transport.StatusWRFlushErr
		w.state = wqeDone
		d.p.counters.flushed.Add(1)
		if poison && w.wr.Opcode.IsLocal() {
			d.mem.Lock()
			switch w.wr.Opcode {
			case transport.OpRegMR:
				w.wr.Reg.MR.(*frmr).o.poisoned = true
			case transport.OpBindMW:
				w.wr.Bind.MW.(*mw).o.poisoned = true
			case transport.OpLocalInv:
				if o := d.objLocked(w.wr.InvalidateKey); o != nil && o.kind != kindMR {
					o.poisoned = true
				}
			}
			d.mem.Unlock()
		}
		q.completeSendLocked(w)
		q.sqDone++
	}
	q.sqHead, q.sqNext = q.sqTail, q.sqTail
	q.inflight = q.inflight[:0]
}

func (q *qp) flushRecvLocked() {
	for q.rqHead < q.rqTail {
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		wc := transport.WC{ID: r.id, Status: transport.StatusWRFlushErr, QPNum: q.num}
		q.scrambleLocked(&wc)
		q.dev.p.counters.flushed.Add(1)
		q.pushLocked(q.recvCQ, &wc)
		q.rqHead++
	}
}

// fatal moves the QP to ERR from outside (overrun, link cut, injected) and
// raises the async event.
func (q *qp) fatal(ev transport.EventType, reason string) {
	q.mu.Lock()
	if q.state != transport.QPErr && q.state != transport.QPReset && !q.closed {
		q.failInflightLocked(reason)
		q.toErrLocked(transport.StatusGeneralErr, reason)
		q.dev.event(transport.AsyncEvent{Type: ev, QPNum: q.num, Reason: reason})
	}
	q.unlock()
}

// failInflightLocked gives the oldest transmitted WR RETRY_EXC_ERR when the
// wire is gone (the requester would have retried into silence).
func (q *qp) failInflightLocked(reason string) {
	if len(q.inflight) == 0 {
		return
	}
	// Everything before the oldest in-flight WR is done; report those,
	// then that one with its real status, then flush the rest.
	w := q.slot(q.inflight[0])
	w.state = wqeDone
	w.status = transport.StatusRetryExcErr
	w.reason = reason
	for q.sqDone < q.sqNext && q.slot(q.sqDone).state == wqeDone {
		x := q.slot(q.sqDone)
		q.completeSendLocked(x)
		q.sqDone++
		if x == w {
			break
		}
	}
}

func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	// A type-2 window bound through q holds it on rxe (and on strict):
	// refuse, as the ibverbs provider does, rather than destroy a QP the
	// device would wait ~50 s for (Quirks.DestroyQPInvalidatesWindows).
	d := q.dev
	release := d.p.quirks.DestroyQPInvalidatesWindows
	d.mem.Lock()
	held := d.windowsHeldLocked(q.num, release)
	d.mem.Unlock()
	if held > 0 && !release {
		q.mu.Unlock()
		return fmt.Errorf("emu: destroy qp %d: %d type-2 windows still bound through it: %w", q.num, held, transport.ErrBusy)
	}
	q.closed = true
	l := q.link
	c := q.conn
	q.link = nil
	q.state = transport.QPErr
	q.mu.Unlock()
	close(q.stop)
	<-q.stopped
	q.timer.Stop()
	err := fmt.Errorf("emu: qp %d destroyed: %w", q.num, transport.ErrDisconnected)
	if c != nil {
		c.fail(err, false)
	}
	if l != nil {
		// Destroying a connected QP disconnects it (rdma_destroy_id
		// sends a DREQ): the peer sees Done and the wire is released.
		l.disconnect(err)
	}
	q.sendCQ.detach(q)
	q.recvCQ.detach(q)
	d.qpMu.Lock()
	delete(d.qps, q.num)
	d.qpMu.Unlock()
	q.pd.release()
	return nil
}
