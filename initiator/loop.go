package initiator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// run is the channel's poller: it dispatches queued requests onto free
// credits, handles completions, ticks the pool and reconnects after a
// loss. It is the only goroutine that touches the QP and the pool.
func (c *channel) run() {
	defer close(c.done)
	t := time.NewTicker(tick)
	defer t.Stop()
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
			continue
		}
		c.dispatch()
		n := c.poll()
		if c.qp == nil {
			continue
		}
		if n > 0 {
			continue
		}
		select {
		case <-stop:
			stop = nil
			closeBy = time.Now().Add(c.s.cfg.IOTimeout)
		case <-c.doorbell:
		case reply := <-c.checks:
			reply <- c.check()
		case <-c.cqReady:
			c.poll()
			select {
			case c.cqAck <- struct{}{}:
			default:
			}
		case <-t.C:
			c.onTick()
		}
	}
}

// check verifies the channel's invariants: the pool's own (frmr's Check),
// and that every credit slot is accounted for exactly once (free, or
// holding the request it was started for), the responded ones waiting
// for their keys to die.
func (c *channel) check() error {
	if err := c.pool.Check(); err != nil {
		return fmt.Errorf("initiator: channel %d: %w", c.id, err)
	}
	free := make([]bool, len(c.slots))
	for _, si := range c.free {
		if free[si] {
			return fmt.Errorf("initiator: channel %d: slot %d twice on the free list", c.id, si)
		}
		free[si] = true
	}
	waiting := make([]bool, len(c.slots))
	for _, si := range c.waiting {
		waiting[si] = true
	}
	for i := range c.slots {
		sl := &c.slots[i]
		switch {
		case free[i] != (sl.state == slotFree):
			return fmt.Errorf("initiator: channel %d: slot %d in %s, on the free list: %v", c.id, i, sl.state, free[i])
		case sl.state == slotFree && sl.req != nil:
			return fmt.Errorf("initiator: channel %d: free slot %d holds a request", c.id, i)
		case sl.state != slotFree && sl.req == nil:
			return fmt.Errorf("initiator: channel %d: slot %d in %s holds no request", c.id, i, sl.state)
		case sl.state == slotResponded && !waiting[i] && !slices.Contains(c.invPending, i):
			return fmt.Errorf("initiator: channel %d: responded slot %d neither waits for its key nor for its LOCAL_INV", c.id, i)
		}
	}
	if c.avail < 0 || c.avail > c.credits {
		return fmt.Errorf("initiator: channel %d: %d credits available of %d", c.id, c.avail, c.credits)
	}
	return nil
}

// applyHandles takes in the volume handles Open learned.
func (c *channel) applyHandles() {
	c.mu.Lock()
	for _, u := range c.pendingHandles {
		if u.remove {
			delete(c.handles, u.v)
		} else if u.epoch == c.epoch {
			c.handles[u.v] = u.h
		}
	}
	c.pendingHandles = c.pendingHandles[:0]
	c.mu.Unlock()
}

// dispatch moves queued requests onto free credits.
func (c *channel) dispatch() {
	c.clk.reset()
	c.applyHandles()
	for len(c.invPending) > 0 {
		si := c.invPending[0]
		if !c.postInvalidate(si) {
			return
		}
		if c.qp == nil {
			return // the post failed and fail() cleared invPending
		}
		c.invPending = c.invPending[1:]
	}
	for c.avail > 0 && len(c.free) > 0 && c.qp != nil {
		c.mu.Lock()
		r := c.popNext()
		c.mu.Unlock()
		if r == nil {
			return
		}
		if r.abandoned() {
			continue
		}
		if !c.start(r) {
			c.mu.Lock()
			c.q.pushFront(r)
			c.mu.Unlock()
			return
		}
	}
}

// start posts one request. It reports false if the request must wait
// (no room on the send queue, a transient post failure).
func (c *channel) start(r *Request) bool {
	s := c.s
	si := c.free[len(c.free)-1]
	sl := &c.slots[si]
	sl.gen++
	tag := uint64(si) | uint64(sl.gen)<<32
	sendBuf := c.arena.Bytes()[sl.sendOff : sl.sendOff+sendIU]
	var iuLen int
	nsge := 1 // the IU; 2 with immediate data
	chain := c.chain[:0]
	sl.hasReg = false
	if r.Op == opControl {
		if r.ctrl.Op == wire.ControlClose {
			h, ok := c.handles[r.vol]
			if !ok {
				r.finish(nil) // never opened on this connection
				return true
			}
			r.ctrl.Handle = h
			delete(c.handles, r.vol)
		}
		r.ctrl.Tag = tag
		iu, err := wire.EncodeControl(sendBuf[:0], wire.OpControl, r.ctrl)
		if err != nil || len(iu) > sendIU {
			r.finish(fmt.Errorf("initiator: control request: %w", wire.ErrTooLarge))
			return true
		}
		iuLen = len(iu)
	} else {
		h, ok := c.handles[r.vol]
		if !ok {
			// Open may have learned the handle after this pass began.
			c.applyHandles()
			h, ok = c.handles[r.vol]
		}
		if !ok {
			r.finish(fmt.Errorf("initiator: volume %q is not open on channel %d: %w", r.vol.name, c.id, ErrClosed))
			return true
		}
		cmd := &c.cmd
		*cmd = wire.Command{Op: wire.Op(r.Op), Volume: h, Tag: tag, Offset: uint64(r.Offset), Length: uint32(r.length())}
		if r.FUA {
			cmd.Flags |= wire.FlagFUA
		}
		if r.Op == OpRead || r.Op == OpWrite {
			n := len(r.Buf)
			seg, zc := s.zeroCopy(r.Buf)
			if !zc {
				seg = frmr.Segment{Arena: s.data, Off: sl.bounce, Len: n, Base: sl.base}
				if r.Op == OpWrite {
					// The caller may give up on r meanwhile; pin it so
					// that a returned WriteAt never has its buffer read.
					if !r.pin() {
						return true // abandoned: drop it
					}
					copy(s.data.Bytes()[sl.bounce:sl.bounce+n], r.Buf)
					r.unpin()
				}
			}
			if r.Op == OpWrite && n <= c.maxImm {
				// Immediate data: the SEND gathers it from the buffer
				// through the session MR's local key, so no key is
				// exposed to the target and none needs invalidating.
				// The buffer has been read when the response arrives:
				// on RC the target answers only a command it received.
				cmd.Flags |= wire.FlagImmediate
				c.sendSGE[1] = transport.SGE{Addr: s.dataMR.Addr() + uint64(seg.Off), Length: uint32(n), LKey: s.dataMR.LKey()}
				nsge = 2
			} else {
				dir := frmr.PeerReads
				if r.Op == OpRead {
					dir = frmr.PeerWrites
				}
				reg, err := c.pool.Get(seg, dir)
				if err != nil {
					if errors.Is(err, frmr.ErrExhausted) || errors.Is(err, frmr.ErrNotDrained) {
						return false
					}
					c.fail(fmt.Errorf("initiator: register %d bytes: %w", n, err))
					return false
				}
				sl.reg, sl.hasReg = reg, true
				cmd.NDesc = 1
				cmd.Desc[0] = wire.Descriptor{VA: reg.IOVA(), RKey: uint32(reg.RKey()), Len: uint32(n)}
				if c.remoteInv {
					cmd.Flags |= wire.FlagInvalidate
					cmd.InvalidateKey = uint32(reg.RKey())
				}
				chain = append(chain, reg.WR())
			}
		}
		n, err := cmd.Encode(sendBuf)
		if err != nil {
			if sl.hasReg {
				c.pool.Cancel(sl.reg)
			}
			r.finish(err)
			return true
		}
		iuLen = n
	}
	c.sendSGE[0] = transport.SGE{Addr: c.mr.Addr() + uint64(sl.sendOff), Length: uint32(iuLen), LKey: c.mr.LKey()}
	chain = append(chain, transport.SendWR{ID: sendID(si, sl.gen), Opcode: transport.OpSend, SGL: c.sendSGE[:nsge]})
	n, err := c.postChain(chain)
	if n < len(chain) {
		if n == 0 && sl.hasReg && errors.Is(err, frmr.ErrSQFull) {
			c.pool.Cancel(sl.reg) // Admit refused: nothing was posted
		}
		sl.hasReg = false
		if errors.Is(err, frmr.ErrSQFull) || errors.Is(err, transport.ErrQueueFull) {
			return false // retried on the next completion or tick
		}
		c.fail(fmt.Errorf("initiator: post %s: %w", r.Op, err))
		return false
	}
	c.free = c.free[:len(c.free)-1]
	c.avail--
	sl.state = slotSent
	sl.req = r
	sl.started = c.clk.now()
	return true
}

// poll handles one batch of completions.
func (c *channel) poll() int {
	if c.cq == nil {
		return 0
	}
	c.clk.reset()
	n, err := c.cq.Poll(c.wcs[:])
	if err != nil {
		c.fail(fmt.Errorf("initiator: poll: %w", err))
		return 0
	}
	sends := false
	for i := 0; i < n && c.qp != nil; i++ {
		wc := &c.wcs[i]
		if wc.ID>>56 == idRecv {
			if wc.Status != transport.StatusSuccess {
				c.fail(fmt.Errorf("initiator: receive completion %s%s", wc.Status, rootCause(c.wcs[i+1:n])))
				return n
			}
			c.onRecv(wc)
			continue
		}
		sends = true
		c.pool.OnSendCompletion(wc)
		if wc.Status == transport.StatusSuccess {
			if err := c.pool.Err(); err != nil {
				// A successful completion that proves a signaled WR
				// before it was skipped: nothing the pool hands out
				// is trustworthy until the QP is rebuilt.
				c.fail(fmt.Errorf("initiator: %w", err))
				return n
			}
		}
		if wc.Status != transport.StatusSuccess {
			c.fail(fmt.Errorf("initiator: send completion %s%s", wc.Status, rootCause(c.wcs[i+1:n])))
			return n
		}
	}
	if sends {
		c.finishWaiting()
	}
	return n
}

func (c *channel) onRecv(wc *transport.WC) {
	if wc.Status != transport.StatusSuccess {
		c.fail(fmt.Errorf("initiator: receive completion %s", wc.Status))
		return
	}
	idx := int(wc.ID & 0xffffff)
	if idx >= len(c.recvWRs) || int(wc.ByteLen) > recvIU {
		c.fail(fmt.Errorf("initiator: receive %#x of %d bytes: %w", wc.ID, wc.ByteLen, ErrProtocol))
		return
	}
	b := c.arena.Bytes()[idx*recvIU : idx*recvIU+int(wc.ByteLen)]
	op, err := wire.PeekOpcode(b)
	if err != nil {
		c.fail(fmt.Errorf("initiator: %w: %w", ErrProtocol, err))
		return
	}
	var si int
	var sl *ioSlot
	lookup := func(tag uint64) bool {
		si = int(tag & 0xffffffff)
		if si >= len(c.slots) {
			return false
		}
		sl = &c.slots[si]
		return sl.state == slotSent && sl.gen == uint32(tag>>32)
	}
	switch op {
	case wire.OpResponse:
		var rsp wire.Response
		if err := rsp.Decode(b); err != nil || !lookup(rsp.Tag) || sl.req.Op == opControl {
			c.fail(fmt.Errorf("initiator: response %v (tag %#x): %w", err, rsp.Tag, ErrProtocol))
			return
		}
		sl.rsp = rsp
		c.avail += int(rsp.Credits)
	case wire.OpControlResp:
		var rsp wire.ControlResponse
		if err := wire.DecodeControl(b, op, &rsp); err != nil || !lookup(rsp.Tag) || sl.req.Op != opControl {
			c.fail(fmt.Errorf("initiator: control response %v: %w", err, ErrProtocol))
			return
		}
		sl.req.ctrlRsp = rsp
		c.avail += int(rsp.Credits)
	default:
		c.fail(fmt.Errorf("initiator: unexpected %s: %w", op, ErrProtocol))
		return
	}
	c.avail = min(c.avail, c.credits)
	if err := c.repost(idx); err != nil {
		c.fail(fmt.Errorf("initiator: repost receive: %w", err))
		return
	}
	sl.state = slotResponded
	withInv := wc.Flags&transport.WCWithInv != 0
	switch {
	case sl.hasReg && withInv:
		// Remote invalidation counts only if it names the key registered
		// for this request (frmr-semantics rule 3, nvme "Bogus remote
		// invalidation").
		if err := c.pool.OnRemoteInvalidate(sl.reg, wc.InvalidatedKey); err != nil {
			c.fail(err)
			return
		}
	case sl.hasReg:
		if !c.postInvalidate(si) {
			c.invPending = append(c.invPending, si)
		}
		if c.qp == nil {
			return // the invalidation failed and the connection with it
		}
	case withInv:
		c.fail(fmt.Errorf("initiator: target invalidated %s for a request without data: %w", wc.InvalidatedKey, ErrProtocol))
		return
	}
	c.waiting = append(c.waiting, si)
	c.finishWaiting()
}

// postInvalidate posts the signaled LOCAL_INV of a slot whose response
// did not invalidate its key; false if the send queue has no room yet.
func (c *channel) postInvalidate(si int) bool {
	sl := &c.slots[si]
	wr, err := c.pool.Invalidate(sl.reg)
	if err != nil {
		c.fail(fmt.Errorf("initiator: invalidate: %w", err))
		return true
	}
	c.chain[0] = wr
	n, err := c.postChain(c.chain[:1])
	if n == 1 {
		return true
	}
	if errors.Is(err, frmr.ErrSQFull) || errors.Is(err, transport.ErrQueueFull) {
		return false
	}
	c.fail(fmt.Errorf("initiator: post LOCAL_INV: %w", err))
	return true
}

// finishWaiting completes every responded request whose memory the pool
// has proven unreachable (frmr-semantics §3.6).
func (c *channel) finishWaiting() {
	for k := 0; k < len(c.waiting); {
		si := c.waiting[k]
		sl := &c.slots[si]
		if sl.hasReg && !c.pool.Done(sl.reg) {
			k++
			continue
		}
		c.waiting[k] = c.waiting[len(c.waiting)-1]
		c.waiting = c.waiting[:len(c.waiting)-1]
		c.complete(si)
	}
}

func (c *channel) complete(si int) {
	sl := &c.slots[si]
	r := sl.req
	sl.req, sl.hasReg, sl.state = nil, false, slotFree
	c.free = append(c.free, si)
	var err error
	if r.Op != opControl && sl.rsp.Status != wire.StatusGood {
		err = &IOError{Op: r.Op, Off: r.Offset, Len: r.length(), Sense: sl.rsp.Sense}
	}
	c.s.stats.record(r.Op, r.length(), time.Duration(c.clk.now()-r.start), err != nil)
	if r.Op == opControl {
		c.mu.Lock()
		r.epoch = c.epoch
		c.mu.Unlock()
	} else if r.Op != OpRead {
		var parked bool
		if err, parked = c.s.afterIO(c, r, sl.bounce, err); parked {
			return
		}
	}
	if !r.claim() {
		return
	}
	if r.Op == OpRead && err == nil {
		if _, zc := c.s.zeroCopy(r.Buf); !zc {
			copy(r.Buf, c.s.data.Bytes()[sl.bounce:sl.bounce+len(r.Buf)])
		}
	}
	r.deliver(err)
}

func (c *channel) onTick() {
	c.s.stats.publishPool(c.id, c.pool)
	if c.qp == nil {
		return
	}
	if err := c.pool.Tick(); err != nil {
		c.fail(fmt.Errorf("initiator: %w", err))
		return
	}
	now := clock.Nanos()
	for i := range c.slots {
		if sl := &c.slots[i]; sl.state == slotSent && time.Duration(now-sl.started) > c.s.cfg.IOTimeout {
			c.fail(fmt.Errorf("initiator: %s outstanding for %s (I/O timeout %s)", sl.req.Op, time.Duration(now-sl.started).Round(time.Millisecond), c.s.cfg.IOTimeout))
			return
		}
	}
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
	c.pool.OnQPError()
	c.qp.Modify(transport.QPErr)
	c.drain(2 * time.Second)
	c.replaceRegistrations()
	c.teardown()
	// Re-issue in-flight requests in their original order.
	c.mu.Lock()
	for i := len(c.slots) - 1; i >= 0; i-- {
		sl := &c.slots[i]
		if sl.state != slotFree {
			if sl.req != nil && !sl.req.abandoned() {
				c.q.pushFront(sl.req)
			}
			sl.req, sl.hasReg, sl.state = nil, false, slotFree
		}
	}
	if !c.down {
		c.down, c.downAt = true, time.Now()
	}
	c.mu.Unlock()
	c.free = c.free[:0]
	for i := range c.slots {
		c.free = append(c.free, i)
	}
	c.waiting, c.invPending = c.waiting[:0], c.invPending[:0]
	c.avail = 0
}

// replaceRegistrations deregisters and replaces every MR and window the
// pool cannot prove FREE, once the QP is in ERR and drained; WRs the drain
// did not see complete are forgotten first (in ERR none of them executes
// any more, and their completions are never polled). It comes before
// teardown, not after: a type-2 window bound through the QP holds it, and
// on rxe destroying the QP first waits ~50 s for the window's reference
// and leaves a kernel warning (transport.Quirks.DestroyQPInvalidatesWindows).
func (c *channel) replaceRegistrations() {
	if !c.pool.Drained() {
		c.pool.Reset()
	}
	if err := c.pool.Recover(); err != nil {
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
	m := c.pool.DrainMarker()
	c.chain[0] = m
	if n, _ := c.postChain(c.chain[:1]); n != 1 {
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
	for !c.pool.Drained() {
		n, err := c.cq.Poll(c.wcs[:])
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			if c.wcs[i].ID>>56 != idRecv {
				c.pool.OnSendCompletion(&c.wcs[i])
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

// reconnect tries to bring the connection back with backoff; it returns
// false when the channel is closing.
func (c *channel) reconnect() bool {
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-c.stop:
			return false
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
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
			c.down = false
			c.mu.Unlock()
			c.s.stats.reconnects.Add(1)
			c.log.Info("reconnected")
			return true
		}
		c.mu.Lock()
		lost := time.Since(c.downAt) > c.s.cfg.LossTimeout
		var failed queue
		if lost {
			failed = c.q
			c.q = queue{}
		}
		c.mu.Unlock()
		for r := failed.pop(); r != nil; r = failed.pop() {
			r.finish(fmt.Errorf("initiator: channel %d: %w: %w", c.id, ErrConnectionLost, err))
		}
		c.log.Debug("reconnect failed", "err", err, "backoff", backoff)
		select {
		case <-c.stop:
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// idle reports whether nothing is queued or in flight.
func (c *channel) idle() bool {
	c.mu.Lock()
	queued := c.q.n
	c.mu.Unlock()
	return queued == 0 && len(c.free) == len(c.slots)
}

func (c *channel) shutdown() {
	if c.qp != nil && !c.pool.Drained() {
		c.pool.OnQPError()
		c.qp.Modify(transport.QPErr)
		c.drain(time.Second)
		if !c.pool.Drained() {
			c.pool.Reset()
		}
	}
	// The pool's windows go before the QP they may hold (see
	// replaceRegistrations).
	if c.pool != nil {
		c.pool.Close()
	}
	c.teardown()
	c.mu.Lock()
	failed := c.q
	c.q = queue{}
	c.mu.Unlock()
	for r := failed.pop(); r != nil; r = failed.pop() {
		r.finish(ErrClosed)
	}
	for i := range c.slots {
		if sl := &c.slots[i]; sl.req != nil {
			sl.req.finish(ErrClosed)
			sl.req = nil
		}
	}
	c.closeSlotMRs()
	if c.mr != nil {
		c.mr.Close()
	}
	if c.arena != nil {
		c.arena.Close()
	}
}

// passClock reads the clock at most once per pass of the run loop: the
// requests posted in one dispatch pass, or completed in one poll, share a
// stamp. dispatch and poll reset it on entry, so a stamp never outlives
// the pass that took it by more than that pass's own work.
type passClock struct{ t int64 }

func (p *passClock) reset() { p.t = 0 }

func (p *passClock) now() int64 {
	if p.t == 0 {
		p.t = clock.Nanos()
	}
	return p.t
}
