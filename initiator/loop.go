package initiator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// run is the channel's poller: it dispatches queued requests onto free
// credits, handles completions, ticks the pool and reconnects after a
// loss. It is the only goroutine that touches the QP and the pool.
func (c *channel) run() {
	defer close(c.done)
	t := newTickTimer()
	defer t.t.Stop()
	stop := c.stop
	var closeBy time.Time // set once Close asked; in-flight I/O gets until then
	for {
		if !closeBy.IsZero() && (c.idle() || time.Now().After(closeBy)) {
			c.shutdown()
			return
		}
		if c.qp == nil {
			if !c.reconnect() {
				c.shutdown()
				return
			}
			t.every() // a tick publishes the new pool's counters
			continue
		}
		if c.reloginOwed() {
			c.fail(errNexusRelogin)
			continue
		}
		c.dispatch()
		n := c.poll()
		if c.qp == nil {
			continue
		}
		if n > 0 {
			t.worked()
			continue
		}
		if at, every := c.core.tickDue(); every || !closeBy.IsZero() || c.late.parked.n > 0 {
			t.every()
		} else {
			t.settle()
			if at != 0 {
				t.by(at)
			}
		}
		select {
		case <-stop:
			stop = nil
			closeBy = time.Now().Add(c.s.cfg.IOTimeout)
			// Late volumes will not open in time to matter: their
			// re-opens are given up, their parked requests fail.
			c.stopLate(false)
		case <-c.doorbell:
		case reply := <-c.checks:
			reply <- c.check()
		case <-c.cqReady:
			if c.poll() > 0 {
				t.worked()
			}
			select {
			case c.cqAck <- struct{}{}:
			default:
			}
		case <-t.t.C:
			c.onTick()
			_, busy := c.core.tickDue()
			t.fired(busy)
		}
	}
}

// check verifies the channel's invariants (the core's and its pool's).
func (c *channel) check() error { return c.core.check() }

// applyHandles takes in the volume handles Open learned.
func (c *channel) applyHandles() {
	c.mu.Lock()
	for _, u := range c.pendingHandles {
		switch {
		case u.replaced:
			c.onTimeLocked(u.v)
		case u.remove:
			c.core.dropHandle(u.v)
		case u.epoch == c.epoch:
			c.core.setHandle(u.v, u.h)
			c.onTimeLocked(u.v)
		}
	}
	c.pendingHandles = c.pendingHandles[:0]
	c.mu.Unlock()
}

// dispatch stages queued requests on free credits and posts them, with
// the invalidations still owed, in one PostSend.
func (c *channel) dispatch() {
	now := clock.Nanos()
	c.applyHandles()
	if c.core.stageInvalidations() {
		for c.core.canStart() {
			c.mu.Lock()
			r := c.popNext()
			c.mu.Unlock()
			if r == nil {
				break
			}
			if r.abandoned() {
				continue
			}
			if r.vol != nil && !c.core.hasHandle(r.vol) {
				if r.vol.replaced.Load() && !(r.Op == opControl && r.ctrl.Op == wire.ControlClose) {
					r.finish(r.vol.replacedErr())
					continue
				}
				if c.late.waitsFor(r) {
					// Behind its volume's older requests; if the
					// handle has come, they all go back to the head
					// of the queue, in order.
					c.park(r, now)
					c.applyHandles()
					continue
				}
				// Open may have learned the handle after this pass began.
				c.applyHandles()
			}
			if !c.core.start(r, now) {
				c.mu.Lock()
				c.q.pushFront(r)
				c.mu.Unlock()
				break
			}
			if c.core.acts.sends() >= postBatch {
				// Post what is staged so the device starts on it while
				// the rest of the pass is staged.
				c.apply(now)
			}
		}
	}
	c.apply(now)
}

// postBatch is how many staged WRs a dispatch pass posts at once: enough
// that a deep queue costs a few doorbells (one syscall each on rxe, where
// the post runs the requester) rather than one per request, few enough
// that the device is not left idle while a pass stages 32 requests (bench
// over emu tcp at QD32 lost 10-15% when a pass posted everything at its
// end).
const postBatch = 16

// apply carries out what the core asked for, in the order its actions
// document, until it asks for nothing more.
func (c *channel) apply(now int64) {
	a := &c.core.acts
	for !a.empty() {
		if len(a.recv) > 0 && c.qp != nil {
			if _, err := c.qp.PostRecv(a.recv); err != nil {
				c.core.fail(fmt.Errorf("initiator: repost receive: %w", err))
			}
		}
		a.recv = a.recv[:0]
		if wrs := c.core.takeSend(); len(wrs) > 0 {
			n, err := c.qp.PostSend(wrs)
			c.core.posted(n, err)
		}
		for i := range a.done {
			c.deliver(&a.done[i], now)
		}
		clear(a.done)
		a.done = a.done[:0]
		if len(a.requeue) > 0 {
			c.mu.Lock()
			for i := len(a.requeue) - 1; i >= 0; i-- {
				c.q.pushFront(a.requeue[i])
			}
			c.mu.Unlock()
			clear(a.requeue)
			a.requeue = a.requeue[:0]
		}
		if a.ping {
			a.ping = false
			c.queuePing()
		}
		for _, n := range a.paths {
			n.v.pathNoticed(n.standby)
		}
		clear(a.paths)
		a.paths = a.paths[:0]
		if err := a.fail; err != nil {
			a.fail = nil
			c.fail(err)
		}
	}
}

// queuePing puts the keepalive's ping at the head of the queue, unless
// it is queued or on the wire already; its answer, whatever it says, is
// the proof of life the keepalive waits for.
func (c *channel) queuePing() {
	if c.pinging {
		return
	}
	c.pinging = true
	r := &c.ping
	r.Err = nil
	r.state.Store(reqPending)
	r.start = clock.Nanos()
	c.mu.Lock()
	c.q.pushFront(r)
	c.mu.Unlock()
	c.ring()
}

// poll handles one batch of completions.
func (c *channel) poll() int {
	if c.cq == nil {
		return 0
	}
	n, err := c.cq.Poll(c.wcs[:])
	if err != nil {
		c.core.fail(fmt.Errorf("initiator: poll: %w", err))
		c.apply(0)
		return 0
	}
	if n == 0 {
		return 0
	}
	c.core.completions(c.wcs[:n])
	c.apply(clock.Nanos())
	return n
}

// deliver hands a finished request to its caller: the durability account
// first (replay.go), then a read's data out of its bounce buffer.
func (c *channel) deliver(d *doneIO, now int64) {
	r, err := d.req, d.err
	if d.bounce < 0 {
		r.finish(err)
		return
	}
	c.s.stats.record(r.Op, r.length(), time.Duration(now-r.start), err != nil)
	if d.size != 0 && r.vol != nil {
		err = r.vol.noticed(d.size, err)
	}
	if r.Op == opControl {
		c.mu.Lock()
		r.epoch = c.epoch
		c.mu.Unlock()
	} else if r.Op != OpRead {
		var parked bool
		if err, parked = c.s.afterIO(c, r, d.bounce, err); parked {
			return
		}
	}
	if !r.claim() {
		if r.Op == opControl && err == nil {
			c.closeOrphan(r)
		}
		return
	}
	if r.Op == OpRead && err == nil {
		if _, zc := c.s.zeroCopy(r.Buf); !zc {
			copy(r.Buf, c.s.data.Bytes()[d.bounce:d.bounce+len(r.Buf)])
		}
	}
	r.deliver(err)
}

// closeOrphan closes the handle of an OPEN whose caller gave up before
// the target answered it (its context ended: a takeover held past a
// failover's deadline by a standby whose store hangs): the target opened
// the volume all the same, and nobody else will ever close that handle,
// which would hold the volume open there, and a slot of the connection's
// handle table, until the connection ends. The handle is recorded for
// a volume of its own, of the connection that answered (its epoch), as
// Open records one, so that the close names it only on that connection:
// on a later one the number may be another volume's.
func (c *channel) closeOrphan(r *Request) {
	if r.ctrl == nil || r.ctrl.Op != wire.ControlOpen || r.ctrlRsp.Error != "" || r.ctrlRsp.Handle == 0 {
		return
	}
	c.closeHandle(r.ctrl.Volume, r.ctrlRsp.Handle, r.epoch)
}

// closeHandle closes handle h, which the connection of epoch gave for
// the volume named name and which no Volume holds.
func (c *channel) closeHandle(name string, h uint32, epoch uint64) {
	orphan := &Volume{s: c.s, name: name}
	c.setHandle(orphan, h, epoch)
	cl := &Request{Op: opControl, ctrl: &wire.ControlRequest{Op: wire.ControlClose}, vol: orphan}
	if err := c.submit(cl); err != nil {
		c.s.cfg.Logger.Debug("initiator: close of an unheld handle not sent", "channel", c.id, "handle", h, "err", err)
	}
}

func (c *channel) onTick() {
	c.s.stats.ticks.Add(1)
	c.s.stats.publishPool(c.id, c.core.pool)
	if c.qp == nil {
		return
	}
	now := clock.Nanos()
	c.core.tick(now)
	c.apply(0)
	c.expireLate(now)
}

// fail tears the connection down after an error: the QP is moved to ERR
// and drained so every MR's fate is known, MRs not proven FREE are
// replaced, and requests that had not completed go back to the queue to
// be re-issued on the next connection (xprtrdma's and nvme-rdma's
// recovery: MRs never survive a connection).
func (c *channel) fail(err error) {
	if c.qp == nil {
		return
	}
	c.log.Warn("connection lost; reconnecting", "err", err)
	c.s.stats.connLost.Add(1)
	switch {
	case errors.Is(err, errSilent):
		c.s.stats.lostSilent.Add(1)
	case errors.Is(err, errIOTimeout):
		c.s.stats.lostTimeout.Add(1)
	}
	// A loss the initiator's own timers decided came a timeout after
	// the connection's last sign of life: it is paced already.
	// A login again for another channel (srpFence) is no sign of a
	// target that cuts connections, either.
	paced := errors.Is(err, errIOTimeout) || errors.Is(err, errSilent) || errors.Is(err, errNexusRelogin)
	lived := time.Duration(clock.Nanos() - c.upAt)
	if c.core.answered == 0 && !paced && lived < churnWaitMax {
		c.churn++
	} else {
		c.churn = 0
	}
	c.fenceLost()
	c.core.fail(err)
	c.stopLate(true)
	c.core.acts.fail = nil
	c.core.pool.OnQPError()
	c.qp.Modify(transport.QPErr)
	c.drain(2 * time.Second)
	c.replaceRegistrations()
	c.teardown()
	c.core.reset(clock.Nanos())
	at := time.Now()
	if errors.Is(err, errSilent) {
		// Lost since the target was last heard from, not since the
		// keepalive gave up: LossTimeout (Multipath's FastFail) counts
		// from there, so the keepalive's wait is not added to it.
		at = at.Add(-c.core.ka.silence(clock.Nanos()))
	}
	c.mu.Lock()
	if !c.down {
		c.down, c.downAt, c.refused = true, at, false
	}
	c.mu.Unlock()
}

// replaceRegistrations deregisters and replaces every MR and window the
// pool cannot prove FREE, once the QP is in ERR and drained; WRs the drain
// did not see complete are forgotten first (in ERR none of them executes
// any more, and their completions are never polled). It comes before
// teardown, not after: a type-2 window bound through the QP holds it, and
// on rxe destroying the QP first waits ~50 s for the window's reference
// and leaves a kernel warning (transport.Quirks.DestroyQPInvalidatesWindows).
func (c *channel) replaceRegistrations() {
	pool := c.core.pool
	if !pool.Drained() {
		pool.Reset()
	}
	if err := pool.Recover(); err != nil {
		c.log.Error("replacing registrations failed", "err", err)
	}
}

// rootCause names the first completion in wcs that failed other than by
// a flush: one CQ holds both queues, so a flushed receive may be polled
// before the send error that moved the QP to ERR, and the log should say
// the cause, not its echo.
func rootCause(wcs []transport.WC) string {
	for i := range wcs {
		if st := wcs[i].Status; st != transport.StatusSuccess && st != transport.StatusWRFlushErr {
			return fmt.Sprintf(" (behind it: wr_id %#x %s, vendor error %#x)", wcs[i].ID, st, wcs[i].VendorErr)
		}
	}
	return ""
}

// drain posts a marker behind everything on the send queue of a QP in
// ERR and consumes completions until it comes back (ib_drain_sq), or the
// bound passes.
func (c *channel) drain(bound time.Duration) {
	if c.cq == nil {
		return
	}
	pool := c.core.pool
	marker := [1]transport.SendWR{pool.DrainMarker()}
	if n, _ := c.postChain(marker[:]); n != 1 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if c.waitCancel != nil {
		c.waitCancel()
		<-c.waitDone
		c.waitCancel = nil
	}
	told := false
	for !pool.Drained() {
		n, err := c.cq.Poll(c.wcs[:])
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			if c.wcs[i].ID>>56 != idRecv {
				pool.OnSendCompletion(&c.wcs[i])
			}
		}
		if why := rootCause(c.wcs[:n]); why != "" && !told {
			told = true
			c.log.Warn("a completion drained after the loss failed" + why)
		}
		if n == 0 && c.cq.Wait(ctx) != nil {
			return
		}
	}
}

// lossLeftLocked is the time left before the loss is final (none once a
// reconnect was refused, Config.refusedIsLost). c.mu is held.
func (c *channel) lossLeftLocked() time.Duration {
	if c.refused {
		return 0
	}
	return c.s.cfg.LossTimeout - time.Since(c.downAt)
}

// churnWaitMax is the longest wait before a reconnect after connections
// that ended before any I/O completed on them (channel.churn), and how
// long one must have lived not to count as such.
const churnWaitMax = 2 * time.Second

// reconnect tries to bring the connection back with backoff; it returns
// false when the channel is closing.
func (c *channel) reconnect() bool {
	backoff := 50 * time.Millisecond
	if c.churn > 0 {
		// The last connections ended before any I/O completed on
		// them: wait 25 ms, doubling to 2 s, but not past the loss
		// deadline, before the next.
		wait := min(25*time.Millisecond<<min(c.churn-1, 7), churnWaitMax)
		c.mu.Lock()
		if left := c.lossLeftLocked(); left < wait {
			wait = max(left, 0) + time.Millisecond
		}
		c.mu.Unlock()
		c.s.stats.paced.Add(int64(wait))
		select {
		case <-c.stop:
			return false
		case <-time.After(wait):
		}
	}
	for {
		select {
		case <-c.stop:
			return false
		default:
		}
		c.mu.Lock()
		left := c.lossLeftLocked()
		c.mu.Unlock()
		if left <= 0 {
			c.failQueued(errors.New("not reconnected"))
		}
		if ready, stopped := c.awaitFence(left); stopped {
			return false
		} else if !ready {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		if left > 0 {
			// An attempt ends at the loss deadline, not ConnectTimeout
			// later: a target that accepts connections and never logs
			// them in (a hung process, whose kernel still completes
			// the handshake) must not hold the queued I/O past it.
			ctx, cancel = context.WithTimeout(context.Background(), left+time.Millisecond)
		}
		go func() {
			select {
			case <-c.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := c.connect(ctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			c.down, c.downDue = false, nil
			c.mu.Unlock()
			c.s.stats.reconnects.Add(1)
			c.log.Info("reconnected")
			return true
		}
		c.mu.Lock()
		if c.s.cfg.refusedIsLost && (errors.Is(err, transport.ErrRefused) || errors.Is(err, transport.ErrForeignPeer)) {
			// Nobody listens there, or another service does: no blip to
			// wait out (Multipath's fast failover on a dead gateway).
			c.refused = true
		}
		left = c.lossLeftLocked()
		c.mu.Unlock()
		if left <= 0 {
			c.failQueued(err)
		}
		c.log.Debug("reconnect failed", "err", err, "backoff", backoff)
		wait := backoff
		if left > 0 && left < wait {
			// Wake at the loss deadline, not a backoff later: the
			// queued I/O fails when LossTimeout says (Multipath's fast
			// failover depends on it), not up to 2 s after.
			wait = left + time.Millisecond
		}
		select {
		case <-c.stop:
			return false
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// failQueued fails every queued request with ErrConnectionLost: the
// connection stayed down past LossTimeout (err: the last attempt's).
func (c *channel) failQueued(err error) {
	c.mu.Lock()
	failed := c.q
	c.q = queue{}
	c.mu.Unlock()
	for r := failed.pop(); r != nil; r = failed.pop() {
		r.finish(fmt.Errorf("initiator: channel %d: %w: %w", c.id, ErrConnectionLost, err))
	}
}

// idle reports whether nothing is queued, or in flight for a caller
// who waits for it (core.settled).
func (c *channel) idle() bool {
	c.mu.Lock()
	queued := c.q.n
	c.mu.Unlock()
	return queued == 0 && c.late.parked.n == 0 && c.core.settled()
}

func (c *channel) shutdown() {
	if c.core == nil {
		c.teardown()
		return // setup failed before the core existed
	}
	pool := c.core.pool
	if c.qp != nil && !pool.Drained() {
		pool.OnQPError()
		c.qp.Modify(transport.QPErr)
		c.drain(time.Second)
		if !pool.Drained() {
			pool.Reset()
		}
	}
	// The pool's windows go before the QP they may hold (see
	// replaceRegistrations).
	pool.Close()
	c.teardown()
	c.stopLate(false)
	c.mu.Lock()
	failed := c.q
	c.q = queue{}
	c.mu.Unlock()
	for r := failed.pop(); r != nil; r = failed.pop() {
		r.finish(ErrClosed)
	}
	for _, r := range c.core.unfinished() {
		r.finish(ErrClosed)
	}
	c.closeSlotMRs()
	if c.mr != nil {
		c.mr.Close()
	}
	if c.arena != nil {
		c.arena.Close()
	}
}
