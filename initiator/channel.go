package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// tick is the channel's clock for the pool's deadlines and I/O timeouts.
const tick = 100 * time.Millisecond

// channel is one connection of a session: a QP, its CQ, its FRMR pool and
// the credit slots. Everything below mu is owned by the loop goroutine.
type channel struct {
	s   *Session
	id  int
	log *slog.Logger

	mu     sync.Mutex
	q      queue
	down   bool      // connection lost, reconnecting
	downAt time.Time // when it was lost
	// churn counts the connections in a row that ended before any I/O
	// request completed on them and within churnWaitMax of coming up,
	// other than by the initiator's own timers (a protocol violation, a
	// cut, a flushed receive, not an I/O timeout or the keepalive); the
	// reconnect after such a one waits, longer each time (reconnect), so
	// that a target that takes every login and then breaks or cuts the
	// connection does not have the channel reconnecting hundreds of
	// times a second (ib_srp and nvme-rdma wait reconnect_delay between
	// every two tries). A connection that outlived the longest wait was
	// no part of such a storm: a standby path completes no I/O, and
	// without that rule every flap of its link, days apart, added to a
	// wait still owed at the failover that needs it
	// (TestMultipathFlappedStandby). Run by the channel's goroutine only.
	churn int
	// upAt is when the connection came up (clock.Nanos); churn's.
	// Written by the channel's goroutine with mu held.
	upAt int64
	// srpLogin places the connection among the session's SRP logins
	// (srpFence): the number of the first channel's SINGLE login, or
	// the count of SINGLE logins begun when another's MULTI login was
	// accepted. fenceNeed is the SINGLE login another channel waits for
	// before it logs in again; 0: none. Run by the channel's goroutine.
	srpLogin, fenceNeed uint64
	// refused: the last reconnect found nobody listening and the session
	// takes that as final (Config.refusedIsLost, Multipath's fast
	// failover), so the loss is past LossTimeout at once.
	refused bool
	// downDue are the late volumes' deadlines (lateVols.due) from the
	// moment the connection is lost (stopLate, before the teardown and
	// c.down) until it comes back, so that submit fails at once a
	// request whose volume is past its deadline, as the loop does while
	// the connection is up, instead of after the teardown and the
	// reconnect's backoff.
	downDue map[*Volume]int64
	closing bool
	// pendingHandles are volume handles learned outside the loop (Open).
	pendingHandles []handleUpdate
	// epoch counts successful connections; a handle is valid only on the
	// connection that issued it.
	epoch    uint64
	doorbell chan struct{}
	checks   chan chan error // Session.Check's requests, served by the loop
	stop     chan struct{}
	done     chan struct{}

	// loop-owned
	arena       *transport.Arena // send and receive buffers
	mr          transport.MR
	core        *core
	cq          transport.CQ
	qp          transport.QP
	conn        transport.Conn
	waitCancel  context.CancelFunc
	waitDone    chan struct{}
	cqReady     <-chan struct{}
	cqAck       chan struct{}
	maxTransfer int
	regMax      int    // the largest transfer one registration of the device covers
	instGen     uint64 // the session's instance generation at this connection's login
	// isolate: the device does not check window bounds, so every I/O goes
	// through its slot's bounce buffer and binds over that buffer's own
	// MR; a key then reaches nothing but the buffer of the I/O it was
	// issued for (see frmr's "Windows and unchecked bounds").
	isolate bool
	// localInv: the channel never asks the target to invalidate its keys
	// and invalidates them itself. The device may carry out again a
	// SEND_WITH_INV it received as its QP entered ERR, and oops on the
	// second invalidation (transport.Quirks.ReplayOnErr); or a retry may
	// execute a registration again after the target invalidated its key,
	// leaving the key valid once the I/O has ended
	// (transport.Quirks.RetryRepeatsLocalOps), where a LOCAL_INV, which
	// sits behind the registration on the send queue, is repeated after
	// it.
	localInv bool
	recvWRs  []transport.RecvWR
	recvSGE  []transport.SGE
	loginWR  [1]transport.SendWR
	loginSGE [1]transport.SGE
	wcs      [64]transport.WC
	sqDepth  int
	rqDepth  int
	// ping is the keepalive's request (keepalive.go), allocated once;
	// pinging: it is queued or on the wire.
	ping    Request
	pinging bool
	// late are the volumes the connection came up without, and their
	// parked requests (late_open.go).
	late lateVols
}

func newChannel(s *Session, id int) *channel {
	c := &channel{
		s: s, id: id,
		log:      s.cfg.Logger.With("channel", id, "target", s.cfg.Addr),
		doorbell: make(chan struct{}, 1),
		checks:   make(chan chan error),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	c.ping = Request{Op: opControl, ctrl: &wire.ControlRequest{Op: wire.ControlPing}}
	c.ping.OnDone = func(*Request) { c.pinging = false } // the loop's goroutine, as every delivery
	return c
}

func (c *channel) ring() {
	select {
	case c.doorbell <- struct{}{}:
	default:
	}
}

// submit queues r for this channel.
func (c *channel) submit(r *Request) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.down && c.lossLeftLocked() <= 0 {
		c.mu.Unlock()
		return fmt.Errorf("initiator: channel %d down since %s: %w", c.id, c.downAt.Format(time.RFC3339), ErrConnectionLost)
	}
	now := clock.Nanos()
	if d, ok := c.downDue[r.vol]; ok && now > d && !isClose(r) {
		c.mu.Unlock()
		return c.overdueErr(r.vol)
	}
	r.start = now
	r.retries, r.retryLast, r.timeouts, r.losses = 0, nil, 0, 0
	c.q.push(r)
	c.mu.Unlock()
	c.ring()
	return nil
}

// setup allocates what survives reconnects: the message arena and its MR
// and the FRMR pool.
func (c *channel) setup(dev transport.Device) error {
	s := c.s
	cr := s.cfg.Credits
	c.sqDepth = 3*cr + 8 // REG + SEND + LOCAL_INV per credit, a drain marker, slack
	fence := dev.Attr().Quirks.RetryRepeatsLocalOps
	if fence {
		c.sqDepth += 2 * cr // and a fence per batch of REGs, at most one per credit (frmr.Config.FenceRegistrations)
	}
	c.rqDepth = cr + 1
	size := c.rqDepth*recvIU + (cr+1)*sendIU
	a, err := transport.NewArena(size, transport.ArenaOptions{})
	if err != nil {
		return err
	}
	m, err := s.pd.RegMR(a, 0, a.Len(), transport.AccessLocalWrite)
	if err != nil {
		a.Close()
		return fmt.Errorf("initiator: register message buffers: %w", err)
	}
	pages := s.cfg.MaxTransfer/transport.PageSize + 1
	if mp := dev.Attr().MaxFastRegPages; mp > 1 && pages > mp {
		// The device registers at most mp pages: a transfer of mp-1
		// fits wherever it starts in its first page. Asked for more,
		// the pool's MRs failed to allocate and the connect with them
		// ("alloc fast-reg mr of 1025 pages (max 1024)"); the login
		// lowers MaxTransfer instead, and Volume splits larger I/O.
		pages = mp
	}
	pool, err := frmr.New(frmr.Config{
		PD: s.pd, Caps: dev.Attr().Caps, Mechanism: s.cfg.Mechanism, Size: cr, MaxPages: pages,
		BaseMR: s.dataMR, SQDepth: c.sqDepth, IOVATag: true, WindowQuarantine: s.cfg.WindowQuarantine,
		// Channels share the PD, so a device may hand one channel's old
		// MR index to another's pool: their iova tags must never meet.
		IOVABase:      uint64(c.id) << 32,
		DeadlineTicks: int(s.cfg.IOTimeout / tick),
		// A retry never rewinds over a fenced LOCAL_INV, nor executes
		// again a registration behind one.
		FenceInvalidate: fence, FenceRegistrations: fence,
	})
	if err != nil {
		m.Close()
		a.Close()
		return err
	}
	c.regMax = (pages - 1) * transport.PageSize
	if pool.Mechanism() == frmr.MW {
		// A window binds a range of the base MR and has no page list:
		// only the caller's MaxTransfer bounds it.
		c.regMax = s.cfg.MaxTransfer
	}
	c.arena, c.mr = a, m
	q := dev.Attr().Quirks
	c.isolate = pool.Mechanism() == frmr.MW && q.WindowBoundsUnchecked
	c.localInv = s.cfg.NoRemoteInvalidate || q.ReplayOnErr || q.RetryRepeatsLocalOps
	c.recvWRs = make([]transport.RecvWR, c.rqDepth)
	c.recvSGE = make([]transport.SGE, c.rqDepth)
	for i := range c.recvWRs {
		c.recvSGE[i] = transport.SGE{Addr: m.Addr() + uint64(i*recvIU), Length: recvIU, LKey: m.LKey()}
		c.recvWRs[i] = transport.RecvWR{ID: recvID(i), SGL: c.recvSGE[i : i+1]}
	}
	c.core = newCore(coreParams{
		id: c.id, credits: cr, sqDepth: c.sqDepth, ioTimeout: int64(s.cfg.IOTimeout), lossTimeout: int64(s.cfg.LossTimeout),
		msg: a.Bytes(), msgAddr: m.Addr(), msgLKey: m.LKey(),
		data: s.data.Bytes(), dataAddr: s.dataMR.Addr(), dataLKey: s.dataMR.LKey(), dataArena: s.data,
		zeroCopy: s.zeroCopy, recvWRs: c.recvWRs, pool: pool,
	})
	if s.cfg.Protocol == ProtocolSRP {
		c.core.srp = newSRPCore(cr, c.rqDepth)
	} else {
		// The ping is a gosrp control request; SRP has none of its own
		// to spare (its keepalive would be a TEST UNIT READY).
		c.core.ka.timeout = int64(s.cfg.KeepaliveTimeout)
	}
	for i := range c.core.slots {
		sl := &c.core.slots[i]
		sl.bounce = s.bounceOff(c.id, i)
		sl.sendOff = c.rqDepth*recvIU + (i+1)*sendIU
		if c.isolate {
			if sl.base, err = s.pd.RegMR(s.data, sl.bounce, s.cfg.MaxTransfer, transport.AccessLocalWrite|transport.AccessMWBind); err != nil {
				c.closeSlotMRs()
				pool.Close()
				m.Close()
				a.Close()
				return fmt.Errorf("initiator: register bounce buffer %d: %w", i, err)
			}
		}
	}
	return nil
}

// closeSlotMRs deregisters the bounce buffers' own MRs; the pool's windows
// must be gone first.
func (c *channel) closeSlotMRs() {
	if c.core == nil {
		return
	}
	for i := range c.core.slots {
		if sl := &c.core.slots[i]; sl.base != nil {
			sl.base.Close()
			sl.base = nil
		}
	}
}

// connect builds a QP, connects it and logs in. On failure everything it
// created is gone again, and the pool has forgotten the attempt: a login
// SEND still in its ledger would make the first completion of the next
// connection look like a skipped one and taint every MR.
func (c *channel) connect(ctx context.Context) (err error) {
	s := c.s
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	ep, err := s.cfg.Provider.Resolve(ctx, s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("initiator: resolve %s: %w", s.cfg.Addr, err)
	}
	defer ep.Close()
	if ep.Device() != s.dev {
		return fmt.Errorf("initiator: %s is now reached through another device: %w", s.cfg.Addr, transport.ErrNotFound)
	}
	cq, err := s.dev.CreateCQ(frmr.CQDepth(c.sqDepth, c.rqDepth))
	if err != nil {
		return err
	}
	qp, err := s.pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: c.sqDepth, MaxRecvWR: c.rqDepth,
		MaxSendSGE: c.sendSGEs(), MaxRecvSGE: 1})
	if err != nil {
		cq.Close()
		return err
	}
	c.cq, c.qp = cq, qp
	defer func() {
		if err == nil {
			c.mu.Lock()
			c.upAt = clock.Nanos()
			c.mu.Unlock()
		} else {
			// Registrations first, then the QP (see replaceRegistrations).
			c.core.pool.Reset()
			if rerr := c.core.pool.Recover(); rerr != nil {
				err = fmt.Errorf("%w (and replacing registrations: %v)", err, rerr)
			}
			c.teardown()
			c.core.reset(clock.Nanos()) // nothing was in flight: the loop has not run on it
		}
	}()
	if err := qp.Modify(transport.QPInit); err != nil {
		return err
	}
	if _, err := qp.PostRecv(c.recvWRs); err != nil {
		return fmt.Errorf("initiator: post receives: %w", err)
	}
	if s.cfg.Protocol == ProtocolSRP {
		return c.connectSRP(ctx, ep, qp)
	}
	conn, err := ep.Connect(ctx, qp, wire.Hello{Version: wire.Version}.Encode())
	if err != nil {
		var rej *transport.RejectError
		if errors.As(err, &rej) {
			if h, herr := wire.DecodeHello(rej.PrivateData); herr == nil {
				return &LoginError{Reason: RejectVersion, Message: fmt.Sprintf("target speaks version %d, we speak %d", h.Version, wire.Version)}
			}
			if r, rerr := wire.DecodeConnReject(rej.PrivateData); rerr == nil {
				return &LoginError{Reason: RejectReason(r.Reason), Message: r.Message}
			}
		}
		return fmt.Errorf("initiator: connect to %s: %w", s.cfg.Addr, err)
	}
	c.conn = conn
	if err := c.postPrologue(); err != nil {
		return err
	}
	if err := c.login(ctx); err != nil {
		return err
	}
	// Re-open the session's volumes on the new connection; one the
	// target does not open at once comes later (late_open.go), and so
	// do the ones after it: each could cost the target's OpenWait
	// again, and they are asked for all at once when the connection is
	// up.
	var late []lateVol
	var orphans []lateHandle
	for _, v := range s.openVolumes() {
		if v.replaced.Load() {
			continue // its requests fail; the name is not ours any more
		}
		if len(late) > 0 {
			late = append(late, lateVol{v, "not asked before the connection came up"})
			continue
		}
		rsp, why, err := c.reopen(ctx, v)
		if err != nil {
			return err
		}
		if rsp == nil {
			late = append(late, lateVol{v, why})
			continue
		}
		if !v.sameVolume(rsp.Identity, c.instGen) {
			s.volumeReplaced(v, rsp.Identity)
			orphans = append(orphans, lateHandle{v.name, rsp.Handle})
			continue
		}
		c.core.setHandle(v, rsp.Handle)
		v.resized(int64(rsp.Size)) // it may have changed while the connection was down
		v.standby.Store(rsp.PathState != wire.PathActive)
	}
	c.mu.Lock()
	c.epoch++
	epoch := c.epoch
	left := c.lossLeftLocked()
	c.mu.Unlock()
	for _, o := range orphans {
		c.closeHandle(o.name, o.h, epoch)
	}
	// Only now may the waiter compete for CQ events: login and re-open
	// wait on the CQ themselves.
	c.startWaiter()
	c.startLate(late, left)
	return nil
}

// reopen opens v on a new connection, before the loop runs on it. If
// the target does not open it (still opening it after its OpenWait, its
// store hung; or refusing: deleted meanwhile, access revoked) the
// answer is nil and why says what the target said: the connection comes
// up without v and asks again once it is up (late_open.go). An answer
// with a handle already given on the connection is refused as Open's
// is (core.handleFree).
func (c *channel) reopen(ctx context.Context, v *Volume) (rsp *wire.ControlResponse, why string, err error) {
	rsp, err = c.controlSync(ctx, &wire.ControlRequest{Op: wire.ControlOpen, Volume: v.name, ReadOnly: v.readOnly, Exclusive: v.exclusive})
	switch {
	case err != nil:
		return nil, "", err
	case rsp.Error != "":
		return nil, rsp.Error, nil
	case !c.core.handleFree(rsp.Handle):
		return nil, "", fmt.Errorf("initiator: re-open of %q answered with handle %d, which is not free on this connection: %w", v.name, rsp.Handle, ErrProtocol)
	}
	return rsp, "", nil
}

// sendSGEs is how many SGEs a send needs: two (the command IU and the
// data) where immediate data is wanted and the device gathers that many.
func (c *channel) sendSGEs() int {
	if c.s.cfg.ImmediateData > 0 && c.s.dev.Attr().MaxSGE >= 2 {
		return 2
	}
	return 1
}

// teardown destroys the QP and CQ of the current connection.
func (c *channel) teardown() {
	if c.waitCancel != nil {
		c.waitCancel()
		<-c.waitDone
		c.waitCancel = nil
	}
	if c.conn != nil {
		c.conn.Disconnect()
		c.conn = nil
	}
	if c.qp == nil && c.cq == nil {
		return
	}
	if c.qp != nil {
		// In ERR the QP carries out nothing more, and its receives
		// are flushed: its buffers, rings and keys are free for the
		// next connection before the destroy returns.
		c.qp.Modify(transport.QPErr)
	}
	c.s.destroy(c.log, c.qp, c.cq)
	c.qp, c.cq = nil, nil
}

// startWaiter runs the goroutine that turns CQ events into cqReady, so the
// loop can wait for completions and submissions at once.
func (c *channel) startWaiter() {
	if n, ok := c.cq.(transport.CQNotifier); ok {
		// The CQ signals on a channel: the loop selects on it directly,
		// one goroutine hand-off fewer per completion.
		c.cqReady, c.cqAck = n.Notify(), nil
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.waitCancel = cancel
	c.waitDone = make(chan struct{})
	ready := make(chan struct{})
	c.cqReady = ready
	c.cqAck = make(chan struct{}, 1)
	cq := c.cq
	go func() {
		defer close(c.waitDone)
		for {
			if err := cq.Wait(ctx); err != nil {
				return
			}
			select {
			case ready <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case <-c.cqAck:
			case <-ctx.Done():
				return
			}
		}
	}()
}
