package initiator

// A volume the target does not re-open at once does not hold the
// others. A reconnect re-opens every volume of the session on the new
// connection (channel.connect). A store that hangs in one volume's open
// (an RBD image whose placement group is down) answers NOT READY after
// the target's OpenWait, again and again, and the next such volume
// would cost another OpenWait; a volume deleted, or whose access was
// revoked, while the connection was down is refused for good. Holding
// the connection for such a volume stopped every volume of the session
// until the loss deadline and then failed them all, and a refused one
// kept the session from ever reconnecting: one volume's trouble was
// taken for the connection's. So the connection comes up without it:
// the volume is late on this connection, and so are the volumes not
// re-opened yet, which are all asked for at once. A late volume's
// requests, those re-issued from the lost connection and those queued
// since, are parked in order, taking no credit, while a goroutine of
// the connection asks the target again, with a backoff. When the target
// answers with a handle, the parked requests go back to the head of the
// queue, in order, and run. If the loss deadline (LossTimeout from the
// loss, as for queued I/O) passes first, they fail with
// ErrConnectionLost and ErrNotReady, as they would have with the
// connection; a Multipath fails over on the first. The volume's later
// requests fail at once, until the target opens it, also while the
// connection is down (channel.downDue). The deadline is the
// volume's, not the connection's: a volume late again on the next
// connection keeps it, or a target that ends each connection before it
// opens the volume would hold its requests for ever.
//
// Nothing of another volume waits on a late one, with one exception
// kept on purpose: a replay round (replay.go) replays its writes in
// order, and holds every channel until the late volume's turn is done.
// Its write parks there like any request; the volume's re-open passes
// the hold (popNext), so a store that answers within the deadline gets
// its writes replayed, and at the deadline the write fails, which
// reports the volume's write-cache loss and lets the round go on
// (TestReopenLateReplay).

import (
	"context"
	"fmt"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
)

// lateVols are a connection's late volumes; loop-owned.
type lateVols struct {
	// vols say what the target answered the connection's re-open.
	vols map[*Volume]string
	// due is each late volume's deadline (clock.Nanos) past which its
	// requests fail instead of waiting. It outlives the connection: a
	// volume late again on the next one keeps the earlier deadline, so
	// that a target which drops every connection before the volume is
	// opened or checked (a hostile SRP target that swallows the
	// identity INQUIRY, each timeout a new re-login) cannot keep its
	// requests parked forever (TestSRPIdentitySwallowed).
	due map[*Volume]int64
	// by is the earliest of due, to skip the walk while none has passed.
	by     int64
	parked queue
	// cancel stops the goroutines that re-open them (wg).
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// waitsFor reports whether r must wait for its volume's late open: any
// request about a late volume except its CLOSE, which needs no handle
// (the re-open, if it ever succeeds, closes what it got).
func (l *lateVols) waitsFor(r *Request) bool {
	if len(l.vols) == 0 || r.vol == nil || isClose(r) {
		return false
	}
	_, ok := l.vols[r.vol]
	return ok
}

// isClose reports whether r is a CLOSE, which needs no handle and so
// never waits for a late open.
func isClose(r *Request) bool { return r.Op == opControl && r.ctrl.Op == wire.ControlClose }

// park holds r until its volume opens, or fails it past the deadline.
func (c *channel) park(r *Request, now int64) {
	if now > c.late.due[r.vol] {
		r.finish(c.lateErr(r.vol))
		return
	}
	c.late.parked.push(r)
}

func (c *channel) lateErr(v *Volume) error {
	return fmt.Errorf("initiator: channel %d: volume %q not re-opened since the reconnect (%s): %w: %w",
		c.id, v.name, c.late.vols[v], ErrConnectionLost, ErrNotReady)
}

// overdueErr fails a request of v past v's deadline while the
// connection is down or going (stopLate, submit); lateErr is the
// connection's, which can say what the target answered.
func (c *channel) overdueErr(v *Volume) error {
	return fmt.Errorf("initiator: channel %d: volume %q not re-opened before its deadline, and the connection is down: %w: %w",
		c.id, v.name, ErrConnectionLost, ErrNotReady)
}

// lateHandle is a handle a re-open got for a volume the session no
// longer wants on the connection (a replaced one), to be closed.
type lateHandle struct {
	name string
	h    uint32
}

// lateVol is a volume a connection came up without, and what the target
// answered its re-open.
type lateVol struct {
	v   *Volume
	why string
}

// startLate marks vols late on the connection that just came up, with
// the loss deadline left (left), or the one they had on the last
// connection if it comes first, and starts their re-opens.
func (c *channel) startLate(vols []lateVol, left time.Duration) {
	l := &c.late
	was := l.due
	l.due = nil
	if len(vols) == 0 {
		return
	}
	l.vols = make(map[*Volume]string, len(vols))
	l.due = make(map[*Volume]int64, len(vols))
	by := clock.Nanos() + int64(left)
	l.by = by
	for _, lv := range vols {
		d, ok := was[lv.v]
		if !ok || d > by {
			d = by
		}
		l.due[lv.v] = d
		l.by = min(l.by, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	c.mu.Lock()
	epoch := c.epoch
	c.mu.Unlock()
	srp := c.s.cfg.Protocol == ProtocolSRP
	for i, lv := range vols {
		l.vols[lv.v] = lv.why
		if i == 0 && !srp {
			c.log.Warn("volume not re-opened: the connection is up without it, and its I/O waits for it while the loss deadline lasts",
				"volume", lv.v.name, "target_said", lv.why, "waits", left.Round(time.Millisecond), "volumes_after_it", len(vols)-1)
		}
		l.wg.Add(1)
		if srp {
			// Every re-login checks its units (srp_identity.go): no
			// news unless the check fails.
			go c.recheckLUN(ctx, lv.v, epoch)
		} else {
			go c.reopenLate(ctx, lv.v)
		}
	}
}

// Backoff of a late volume's re-open that the target refused (a volume
// deleted, its access revoked): asked again less and less often. A
// target still opening it paces the tries itself (Session.openOn).
const (
	lateRetryMin = openRetry
	lateRetryMax = 5 * time.Second
)

// reopenLate asks the target for v until it opens, v is closed, or ctx
// ends (the connection did), and hands the loop its handle.
func (c *channel) reopenLate(ctx context.Context, v *Volume) {
	defer c.late.wg.Done()
	s := c.s
	req := wire.ControlRequest{Op: wire.ControlOpen, Volume: v.name, ReadOnly: v.readOnly, Exclusive: v.exclusive}
	b := lateBackoff{what: "re-open of a late volume refused; asking again"}
	for {
		rsp, epoch, err := s.openOn(ctx, c, req)
		if ctx.Err() != nil {
			return // an answer that comes anyway is closed as an orphan's
		}
		if err == nil && rsp.Error == "" {
			c.lateOpened(v, rsp, epoch)
			return
		}
		var why string
		if err != nil {
			why = err.Error()
		} else {
			why = rsp.Error
		}
		if !b.again(ctx, c, v, why) {
			return
		}
	}
}

// lateBackoff paces the tries of a late volume's goroutine (reopenLate,
// recheckLUN): each refusal is logged once, until the target says
// something else, and the waits double up to lateRetryMax.
type lateBackoff struct {
	what string // the log message
	said string
	wait time.Duration
}

// again logs why the try failed and waits for the next one; false
// means stop: v was closed, or ctx ended.
func (b *lateBackoff) again(ctx context.Context, c *channel, v *Volume, why string) bool {
	if why != b.said {
		c.log.Warn(b.what, "volume", v.name, "err", why)
		b.said = why
	}
	c.s.mu.Lock()
	closed := v.closed
	c.s.mu.Unlock()
	if closed {
		return false
	}
	b.wait = min(max(2*b.wait, lateRetryMin), lateRetryMax)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// lateOpened hands the loop the handle a late volume's re-open got on
// the connection of epoch, or closes it if v was closed meanwhile.
func (c *channel) lateOpened(v *Volume, rsp *wire.ControlResponse, epoch uint64) {
	s := c.s
	s.dmu.Lock()
	gen := c.instGen
	s.dmu.Unlock()
	if !v.sameVolume(rsp.Identity, gen) {
		// Another volume of v's name (replaced.go): its handle is
		// closed, and v's parked requests go back to the queue, where
		// dispatch fails them.
		c.closeHandle(v.name, rsp.Handle, epoch)
		c.lateReplaced(v, rsp.Identity)
		return
	}
	// Under s.mu, so that a Close of v either comes first (and the
	// handle is closed here) or finds the handle applied before its
	// CLOSE is dispatched (applyHandles runs first).
	s.mu.Lock()
	closed := v.closed
	if !closed {
		v.standby.Store(rsp.PathState != wire.PathActive)
		c.setHandle(v, rsp.Handle, epoch)
	}
	s.mu.Unlock()
	if closed {
		c.closeHandle(v.name, rsp.Handle, epoch)
		return
	}
	v.resized(int64(rsp.Size))
	c.log.Info("late volume re-opened", "volume", v.name)
}

// lateReplaced records that late volume v was found replaced (identity
// got) and hands its parked requests back to the loop, whose dispatch
// fails them.
func (c *channel) lateReplaced(v *Volume, got uint64) {
	c.s.volumeReplaced(v, got)
	c.mu.Lock()
	c.pendingHandles = append(c.pendingHandles, handleUpdate{v: v, replaced: true})
	c.mu.Unlock()
	c.ring()
}

// onTime releases v's parked requests, in order, to the head of the
// queue once its handle is applied. REQUIRES: c.mu.
func (c *channel) onTimeLocked(v *Volume) {
	l := &c.late
	if _, ok := l.vols[v]; !ok {
		return
	}
	delete(l.vols, v)
	delete(l.due, v)
	mine := l.parked.extract(func(r *Request) bool { return r.vol == v })
	c.q.prependAll(&mine)
}

// expireLate fails the parked requests whose volume's deadline has
// passed.
func (c *channel) expireLate(now int64) {
	l := &c.late
	if l.parked.n == 0 || now <= l.by {
		return
	}
	failed := l.parked.extract(func(r *Request) bool { return now > l.due[r.vol] })
	for r := failed.pop(); r != nil; r = failed.pop() {
		r.finish(c.lateErr(r.vol))
	}
	l.by = math.MaxInt64
	for v := range l.vols {
		if d := l.due[v]; d > now {
			l.by = min(l.by, d)
		}
	}
}

// stopLate, when the connection ends, stops the re-opens and returns
// the parked requests: to the head of the queue for the next connection
// (requeue), or failed with ErrClosed.
func (c *channel) stopLate(requeue bool) {
	l := &c.late
	if l.cancel != nil {
		l.cancel()
		l.wg.Wait()
		l.cancel = nil
	}
	l.vols = nil
	if requeue {
		// l.due stays: the next connection keeps each volume's deadline.
		// Requests of a volume past its deadline fail now, not after
		// the teardown and the reconnect: those parked and those
		// queued since the last look (submit fails the later ones).
		// With no late volume (every teardown but a few) the queue is
		// left alone.
		now := clock.Nanos()
		var failed queue
		c.mu.Lock()
		c.q.prependAll(&l.parked)
		c.downDue = maps.Clone(l.due)
		if len(l.due) > 0 {
			failed = c.q.extract(func(r *Request) bool { d, ok := l.due[r.vol]; return ok && now > d && !isClose(r) })
		}
		c.mu.Unlock()
		for r := failed.pop(); r != nil; r = failed.pop() {
			r.finish(c.overdueErr(r.vol))
		}
		return
	}
	l.due = nil
	c.mu.Lock()
	c.downDue = nil
	c.mu.Unlock()
	for r := l.parked.pop(); r != nil; r = l.parked.pop() {
		r.finish(ErrClosed)
	}
}
