package initiator

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// srpFence orders the logins of an SRP session of several channels so
// that no channel logs in again while the connection it lost may still
// run commands at the target.
//
// A channel other than the first logs in with SRP_MULTICHAN_MULTI: it
// joins the I_T nexus and ends nothing (SRP r16a 6.4), and SRP names no
// channel a login could replace, so the target cannot tell which of its
// connections the new one stands for. A write the lost connection had
// fetched, or a copy of its SRP_CMD that a device replaying receives at
// ERR delivered (transport.Quirks.ReplayOnErr), could then land after
// the channel re-issued that write on its new connection and the
// application wrote newer data (TestReplayedCommandsLandInOrder). The
// first channel's login asks for SINGLE, which ends the nexus's other
// channels; srpd answers it once their volume calls are done
// (target.Target.reinstate). So a channel that lost its connection
// waits, before it logs in again, for a SINGLE login begun after its
// lost connection was accepted, and has the first channel log in again
// if none is coming: a channel's loss costs the session a login of
// every channel, as in ib_srp, whose srp_reconnect_rport reconnects
// them all, the first without multichannel.
//
// SINGLE logins are numbered from 1 in the order they begin. A number
// suffices: a SINGLE login begun after a connection's accept reached
// the initiator reached the target after it took that connection in.
type srpFence struct {
	mu    sync.Mutex
	begun uint64 // SINGLE logins begun
	done  uint64 // the number of the last SINGLE login accepted
	// owed is the lowest number a SINGLE login must have for the
	// channels waiting; the first channel's loop reads it without mu
	// (relogin).
	owed    atomic.Uint64
	changed chan struct{} // closed when done changes
}

func newSRPFence() *srpFence { return &srpFence{changed: make(chan struct{})} }

// begin numbers a SINGLE login the first channel is about to send.
func (f *srpFence) begin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begun++
	return f.begun
}

// accepted records that SINGLE login n was accepted: the target ended
// the nexus's older channels and finished their I/O before it answered.
func (f *srpFence) accepted(n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n > f.done {
		f.done = n
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// joined is what a channel's MULTI login, accepted now, records: a
// SINGLE login numbered above it fences that connection.
func (f *srpFence) joined() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begun
}

// lost records that the connection a MULTI login accepted at joined
// ended, and returns the number the SINGLE login fencing it must have;
// relogin then reports true to the first channel until one that high
// is begun.
func (f *srpFence) lost(joined uint64) uint64 {
	need := joined + 1
	for {
		o := f.owed.Load()
		if o >= need || f.owed.CompareAndSwap(o, need) {
			return need
		}
	}
}

// ready reports whether a SINGLE login numbered need or above was
// accepted and none is under way; if not, changed is closed when the
// next one is accepted. A MULTI login sent while a SINGLE is under way
// would be ended by it, losing the connection it just made, and that
// SINGLE, begun before the MULTI was accepted, would not fence the
// connection: the first channel would have to log in once more (seen
// over rxe with QP errors made on both channels).
func (f *srpFence) ready(need uint64) (ok bool, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done >= need && f.done >= f.begun, f.changed
}

// relogin reports whether the first channel, connected by SINGLE login
// n, must log in again for a channel that lost its connection.
func (f *srpFence) relogin(n uint64) bool { return f.owed.Load() > n }

// errNexusRelogin ends the first channel's connection so that it logs
// in again with SINGLE for another channel (srpFence).
var errNexusRelogin = errors.New("initiator: another channel lost its connection; the SRP I_T nexus logs in again (SINGLE) before it does")

// fenceLost is fail's part: a channel other than the first, in an SRP
// session of several, logs in again only after the nexus does; the
// first channel is told to, unless it has.
func (c *channel) fenceLost() {
	if f := c.s.fence; f != nil && c.id > 0 {
		c.fenceNeed = f.lost(c.srpLogin)
		c.s.chans[0].ring()
	}
}

// reloginOwed reports whether the first channel must log in again for
// another that lost its connection.
func (c *channel) reloginOwed() bool {
	return c.id == 0 && c.s.fence != nil && c.s.fence.relogin(c.srpLogin)
}

// awaitFence is reconnect's wait for the SINGLE login that fences the
// lost connection: ready once it was accepted (or none is needed);
// otherwise it returns when one is, at the loss deadline (left, which
// fails the queue), or 2 s on, for reconnect to look again. stopped:
// the channel is closing.
func (c *channel) awaitFence(left time.Duration) (ready, stopped bool) {
	if c.fenceNeed == 0 {
		return true, false
	}
	ok, changed := c.s.fence.ready(c.fenceNeed)
	if ok {
		c.fenceNeed = 0
		return true, false
	}
	wait := 2 * time.Second
	if left > 0 {
		wait = min(wait, left+time.Millisecond)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.stop:
		return false, true
	case <-changed:
	case <-t.C:
	}
	return false, false
}
