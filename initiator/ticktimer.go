package initiator

import (
	"time"

	"github.com/gosrp/gosrp/internal/clock"
)

// tickTimer is the loop's clock: one timer, armed for the next tick the
// channel needs (core.tickDue), so that a channel with nothing to time
// sleeps until an event wakes it, and hundreds of idle sessions cost a
// host next to nothing (docs/performance.md, "Idle sessions").
type tickTimer struct {
	t        *time.Timer
	at       int64 // when t fires (clock.Nanos); 0: it is not armed
	periodic bool  // t was armed by every
	owed     bool  // busy since the last tick, or at it: one more tick is owed
}

// newTickTimer arms the first tick a period away: it publishes the
// pool's counters, and sees to whatever the login left to time.
func newTickTimer() *tickTimer {
	return &tickTimer{t: time.NewTimer(tick), at: clock.Nanos() + int64(tick), periodic: true}
}

// every asks for ticks a period apart: a tick a period from now unless
// one is on its way already. It reads no clock while one is: that is
// the busy loop's case.
func (w *tickTimer) every() {
	w.owed = true
	if w.at != 0 && w.periodic {
		return
	}
	w.at, w.periodic = clock.Nanos()+int64(tick), true
	w.t.Reset(tick)
}

// worked records that the channel completed work, which moved the
// pool's counters: a tick is owed to publish them even when no pass of
// the loop saw the work in flight (its completions were in the CQ at the
// first poll after its post, faults.Config.PostLatency).
func (w *tickTimer) worked() { w.owed = true }

// settle is a channel gone quiet: if it was busy since its last tick,
// or at it, one more tick is owed, to publish the pool's counters as
// the work left them. It comes a period from now, or sooner if the
// timer is armed sooner; a timer armed by by for later (a keepalive's
// ping) is brought forward to it.
func (w *tickTimer) settle() {
	if w.owed && !w.periodic {
		if now := clock.Nanos(); w.at == 0 || w.at > now+int64(tick) {
			w.at, w.periodic = now+int64(tick), true
			w.t.Reset(tick)
		}
	}
	w.owed = false
}

// by asks for a tick at at, unless one comes sooner; a tick that comes
// earlier than asked finds nothing to do and asks again.
func (w *tickTimer) by(at int64) {
	if w.at != 0 && w.at <= at {
		return
	}
	w.at, w.periodic = at, false
	w.t.Reset(time.Duration(at - clock.Nanos()))
}

// fired records that the timer's tick has come, and whether the
// channel was still busy after it.
func (w *tickTimer) fired(busy bool) { w.at, w.periodic, w.owed = 0, false, busy }
