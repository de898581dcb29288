package initiator

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestKeepalive drives the keepalive's decisions with a fake clock: each
// step is a tick at a time (ms), with or without something heard since
// the last one, and the action it must ask for.
func TestKeepalive(t *testing.T) {
	type step struct {
		at    int64 // ms
		heard bool
		want  kaAction
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"I/O completing: no ping ever", []step{
			{400, true, kaNone}, {800, true, kaNone}, {1200, true, kaNone}, {5000, true, kaNone},
		}},
		{"idle: a ping at half the timeout, answered", []step{
			{400, false, kaNone}, {500, false, kaPing}, {600, false, kaNone},
			{700, true, kaNone}, {1100, false, kaNone}, {1200, false, kaPing},
		}},
		{"idle, the ping unanswered: dead at the timeout", []step{
			{500, false, kaPing}, {900, false, kaNone}, {1000, false, kaDead},
		}},
		{"idle, the ping lost before it went out: dead all the same", []step{
			{500, false, kaPing}, {1000, false, kaDead},
		}},
		{"the ping asked late (ticks skipped): half the timeout to answer it", []step{
			{499, false, kaNone}, {1000, false, kaPing}, {1499, false, kaNone}, {1500, false, kaDead},
		}},
		{"the ping asked late and answered: alive", []step{
			{499, false, kaNone}, {1000, false, kaPing}, {1100, true, kaNone}, {1599, false, kaNone}, {1600, false, kaPing},
		}},
		{"outstanding past half: one ping; a live target answers it", []step{
			{500, false, kaPing}, {600, false, kaNone}, {700, true, kaNone}, {1100, false, kaNone}, {1200, false, kaPing},
		}},
		{"outstanding, silent: dead at the timeout, not before", []step{
			{500, false, kaPing}, {999, false, kaNone}, {1000, false, kaDead},
		}},
		{"never pinged (ticks skipped): a ping, not death", []step{
			{0, false, kaNone}, {3000, false, kaPing},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := keepalive{timeout: int64(time.Second)}
			k.reset(0)
			for i, s := range tc.steps {
				k.heard = k.heard || s.heard
				if got := k.tick(s.at * int64(time.Millisecond)); got != s.want {
					t.Fatalf("step %d (%+v): %d, want %d", i, s, got, s.want)
				}
			}
		})
	}
	var off keepalive
	if off.tick(int64(time.Hour)) != kaNone {
		t.Error("a keepalive that is off acted")
	}
}

// TestKeepaliveTickPhase: a 200 ms keepalive on the channel's 100 ms
// ticker, each tick a little early or late (seeded), against a target
// that answers every ping within a millisecond and then goes quiet. A
// live target is never taken for dead: before, a tick that landed just
// short of the 100 ms half-timeout skipped the ping, and the next one,
// past 200 ms, ended the connection (a takeover longer than a second
// lost its path in TestMultipathWedgedStandby's rig). A target that
// stops answering is found within timeout + timeout/2 + two ticks.
func TestKeepaliveTickPhase(t *testing.T) {
	const ms = int64(time.Millisecond)
	for seed := uint64(1); seed <= 20; seed++ {
		rnd := rand.New(rand.NewPCG(seed, 0))
		k := keepalive{timeout: 200 * ms}
		k.reset(0)
		now, pingAnswer := int64(0), int64(-1)
		const ticks = 5000
		for i := range ticks {
			now += 100*ms + rnd.Int64N(2*ms) - ms
			if pingAnswer >= 0 && pingAnswer <= now {
				k.heard, pingAnswer = true, -1
			}
			switch k.tick(now) {
			case kaDead:
				t.Fatalf("seed %d: a live target taken for dead at tick %d (%d ms)", seed, i, now/ms)
			case kaPing:
				pingAnswer = now + 1*ms
			}
		}
		deadFrom := now
		for k.tick(now) != kaDead {
			now += 100*ms + rnd.Int64N(2*ms) - ms
			if now-deadFrom > 200*ms+100*ms+2*100*ms+2*ms {
				t.Fatalf("seed %d: a silent target not found dead %d ms after it went quiet", seed, (now-deadFrom)/ms)
			}
		}
	}
}

// TestKeepaliveDue: an idle channel ticks only when its keepalive says
// (due), and a period apart while a ping is out or an answer waits to
// be stamped, as the shell's tickTimer does. Against a target that
// answers every ping within a millisecond it pings and is never taken
// for dead, each due time lies ahead of the tick that asked for it (a
// due time already past would spin the loop), and a target that stops
// answering is found dead within timeout + timeout/2 + a tick.
func TestKeepaliveDue(t *testing.T) {
	const ms = int64(time.Millisecond)
	const period = 100 * ms
	k := keepalive{timeout: 2000 * ms}
	k.reset(0)
	now, pingOut, pings := int64(0), false, 0
	next := func() int64 {
		at, every := k.due()
		if every || pingOut {
			return now + period
		}
		if at <= now {
			t.Fatalf("at %d ms the keepalive asked for a tick at %d ms", now/ms, at/ms)
		}
		return at
	}
	for range 5000 {
		now = next()
		switch k.tick(now) {
		case kaDead:
			t.Fatalf("a live target taken for dead at %d ms", now/ms)
		case kaPing:
			// Answered a millisecond later, before the next tick.
			pings++
			k.heard = true
		}
	}
	if pings == 0 {
		t.Fatal("an idle channel never pinged")
	}
	silentFrom := now
	for {
		now = next()
		if now-silentFrom > k.timeout+k.timeout/2+period {
			t.Fatalf("a silent target not found dead %d ms after it went quiet", (now-silentFrom)/ms)
		}
		switch k.tick(now) {
		case kaDead:
			return
		case kaPing:
			pingOut = true // never answered
		}
	}
}
