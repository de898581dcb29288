package initiator_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/faults"
)

// TestIdleSessionSleeps: a session with nothing in flight takes no tick
// of its own, so that hundreds of idle sessions cost a host nothing
// (before, each channel woke ten times a second: 36,000 ticks an idle
// hour). Without a keepalive it ticks once after its last I/O (the
// pool's counters are published) and then not at all; with one it wakes
// for the pings alone, a few ticks each, and is never taken for dead.
// Either way it answers the next I/O at once. The hour passes on
// synctest's clock (inBubble).
func TestIdleSessionSleeps(t *testing.T) {
	cases := []struct {
		name      string
		keepalive time.Duration
		maxTicks  uint64
	}{
		{"no-keepalive", 0, 1},
		// A ping each 5 s of silence, at most 720 in the hour, each
		// needing the tick that sends it and the one that stamps its
		// answer (keepalive.go).
		{"keepalive-10s", 10 * time.Second, 2 * 720},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) { idleHour(t, tc.keepalive, tc.maxTicks) })
		})
	}
}

// idleHour leaves a session that has done one write idle for an hour,
// and checks how often it ticked.
func idleHour(t *testing.T, keepalive time.Duration, maxTicks uint64) {
	r := newRig(t, emu.Config{}, 1<<20, target.Config{})
	s := r.dial(t, initiator.Config{KeepaliveTimeout: keepalive})
	v := openVol0(t, context.Background(), s)
	buf := make([]byte, 4096)
	if _, err := v.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	before := initiator.Ticks(s)
	time.Sleep(time.Hour)
	ticks := initiator.Ticks(s) - before
	t.Logf("%d ticks in an idle hour", ticks)
	if ticks > maxTicks {
		t.Errorf("%d ticks in an idle hour, want at most %d", ticks, maxTicks)
	}
	if lost := s.Stats().ConnectionsLost; lost != 0 {
		t.Errorf("%d connections lost while idle", lost)
	}
	start := time.Now()
	if _, err := v.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took != 0 {
		t.Errorf("the first I/O after an idle hour took %v of synctest's time; it waited for a tick", took)
	}
	// The tick after the work publishes the pool's counters: the read
	// registered its buffer.
	time.Sleep(time.Second)
	var regs uint64
	for _, p := range s.Stats().FRMR {
		regs += p.Registrations
	}
	if regs == 0 {
		t.Error("no registration published a second after the read")
	}
}

// TestCountersAfterInlineCompletion: a request whose completions are in
// the CQ before its post returns (rxe can run its requester inside the
// post call; faults.Config.PostLatency stands for that) is work the
// channel did all the same, and the tick owed after work publishes its
// registration. Before, only a loop pass that found nothing to poll
// owed that tick, so a read finished by the first poll after its post
// stayed out of Stats.FRMR for good (TestImmediateWrites counted 45
// registrations of 46 on a loaded CI machine).
func TestCountersAfterInlineCompletion(t *testing.T) {
	// With a keepalive (Multipath's default), the timer between reads
	// is armed for the next ping, half a minute away; the read's tick
	// must still come a period after it, not at the ping
	// (TestTickTimer has the timer's own rows).
	for _, keepalive := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("keepalive=%v", keepalive), func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				r := newRig(t, emu.Config{}, 1<<20, target.Config{})
				fp := faults.Wrap(r.ip, faults.Config{PostLatency: time.Millisecond})
				ctx := context.Background()
				s, err := initiator.Dial(ctx, initiator.Config{Provider: fp, Addr: r.addr, Name: "inline", KeepaliveTimeout: keepalive})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				v := openVol0(t, ctx, s)
				buf := make([]byte, 4096)
				for i := 1; i <= 3; i++ {
					time.Sleep(time.Second) // the ticks owed so far have come
					if _, err := v.ReadAt(buf, 0); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Second)
					var regs uint64
					for _, p := range s.Stats().FRMR {
						regs += p.Registrations
					}
					if regs != uint64(i) {
						t.Fatalf("%d registrations published a second after read %d, want %d", regs, i, i)
					}
				}
			})
		})
	}
}
