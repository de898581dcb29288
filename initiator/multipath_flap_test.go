package initiator_test

import (
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
)

// TestMultipathFlappedStandby: the standby gateway's link flaps six
// times in a row, each cut as soon as the path is back, and then stays
// up for a while; then a blip takes it down again just as the active
// gateway dies. The failover must reach the standby about as soon as it
// is back, not after the reconnect pacing of a path that flaps: a
// standby completes no I/O, so every loss of its connection looked
// like a target that cuts each new connection (channel.churn), and the
// pacing it had earned seconds before (1.6 s here) was still owed
// at the failover. A connection that stayed up longer than the longest
// pacing wait clears that debt. Every acknowledged write reads back.
func TestMultipathFlappedStandby(t *testing.T) {
	r := newGatewayRig(t)
	// A FastFail past the longest pacing wait (2 s), so that the wait is
	// not cut short by the path's loss deadline; the killed gateway's
	// address refuses the reconnect, so the failover does not wait for
	// FastFail itself (TestMultipathFailover).
	r.fastFail = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	standby := r.tgts[1]
	// up waits until the standby path is back: a connection of the
	// host's, with vol0 open (as standby), newer than the last cut.
	up := func(after uint64) {
		t.Helper()
		waitUntil(t, "the standby path back", func() bool {
			return standby.Stats().Accepted > after && standby.OpenSessions("vol0") == 1
		})
	}
	cut := func() uint64 {
		t.Helper()
		n := standby.Stats().Accepted
		for _, q := range r.nics[1].QPs() {
			if err := r.nics[1].CutLink(q); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	up(0)
	const flaps = 6
	flapped := time.Now()
	for range flaps {
		up(cut())
	}
	t.Logf("%d flaps of the standby path in %v", flaps, time.Since(flapped).Round(time.Millisecond))
	// Up longer than the longest wait between reconnects (2 s), as the
	// initiator counts it (channel.upAt), with neither side seeing a
	// new connection meanwhile: the target's view alone lets a loaded
	// host cut a connection younger than it looks.
	s := initiator.PathSession(mv, 1)
	var seen [2]uint64
	waitUntil(t, "the standby connection up for 2.5 s", func() bool {
		now := [2]uint64{s.Stats().Reconnects, standby.Stats().Accepted}
		if now != seen {
			seen = now
			return false
		}
		return initiator.UpFor(s) > 2500*time.Millisecond
	})

	paced := initiator.Paced(s)
	gens, took := writesThrough(t, mv, func() {
		cut()
		r.stop[0]()
	})
	t.Logf("active killed as the standby's link blipped: first write through the standby after %v (FastFail %v)", took, r.fastFail)
	// Six flaps owed the next reconnect 1.6 s; the connection that
	// outlived the longest wait owes nothing, and a reconnect or two
	// that fails during the failover owes 25 ms, then 50.
	if waited := initiator.Paced(s) - paced; waited > 100*time.Millisecond {
		t.Errorf("the standby's reconnects waited %v of pacing after the failover began: the flaps long past were still owed", waited)
	}
	r.checkMoved(t, mv, gens)
}
