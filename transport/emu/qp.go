package emu

// The RC queue pair: its state machine (RESET, INIT, RTR, RTS, SQD, ERR),
// creation, connection to a link and destruction.

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
	// repeat: a retry rewound the requester over this local operation,
	// which had executed, and it is to execute again
	// (Quirks.RetryRepeatsLocalOps).
	repeat bool
	rnr    int
	reason string
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
	// gone is closed when a Close has destroyed the QP: a Close that
	// finds another under way waits for it, so that whoever destroys the
	// CQ or PD next finds the QP off them (ibv_destroy_qp returns once
	// the QP is gone).
	gone  chan struct{}
	timer *time.Timer

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
	respErr  respErr   // the responder's error, applied once its NAK is out
	replay   replayReq // the last SEND, under Quirks.ReplayOnErr

	// injection
	errAfter  int // QP → ERR before this many more WRs start; -1 off
	postFail  int // next PostSend fails at this index; -1 off
	dropCQE   int // drop the n-th next send completion; -1 off
	statusCQE int
	statusSet transport.Status
	dupNext   int
	// withhold: the responder carries out this many more SENDs and
	// RDMA WRITEs without acknowledging them (InjectWithholdAcks).
	withhold int

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
		gone:     make(chan struct{}),
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
		pd.refs.Release()
		return nil, err
	}
	if err := rc.attach(q); err != nil {
		sc.detach(q)
		pd.refs.Release()
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
	case from == transport.QPSQD && to == transport.QPRTS && q.drainEv:
		// IBTA's SQD has a draining and a drained substate; the QP may
		// go back to RTS from the drained one only, which SQ_DRAINED
		// announces. rxe on Linux 6.12 drains on a workqueue and refuses
		// the Modify with EINVAL until then.
		return fmt.Errorf("emu: modify qp %d SQD→RTS before the send queue drained (wait for SQ_DRAINED): %w", q.num, transport.ErrInvalidState)
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

func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		<-q.gone
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
	q.pd.refs.Release()
	close(q.gone)
	return nil
}
