package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestCoreTrace runs the traces of testdata/core: each word an event
// (open, takeover, locked, busy, broken, failed, fenced, closed,
// reconnected), with "@DURATION" the time it happens at (else when the
// one before it did; the first at 0), applied in order to one volume's
// core, whose store can reconnect if the command says "reconnects" and
// whose breaks are bounded by "burst=N window=DURATION" if given; the
// output is the state after each, the action it asks for, and
// "limited" after a takeover past the bound.
func TestCoreTrace(t *testing.T) {
	datadriven.RunTest(t, "testdata/core", func(t *testing.T, td *datadriven.TestData) string {
		if td.Cmd != "events" {
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		}
		var l Limit
		if td.HasArg("burst") {
			var w string
			td.ScanArgs(t, "burst", &l.Burst)
			td.ScanArgs(t, "window", &w)
			var err error
			if l.Window, err = time.ParseDuration(w); err != nil {
				t.Fatalf("%s: %v", td.Pos, err)
			}
		}
		c := newCore(td.HasArg("reconnects"), l, nil)
		var b strings.Builder
		var now time.Duration
		for _, w := range strings.Fields(td.Input) {
			name, at, timed := strings.Cut(w, "@")
			if timed {
				var err error
				if now, err = time.ParseDuration(at); err != nil {
					t.Fatalf("%s: %q: %v", td.Pos, w, err)
				}
			}
			e, ok := eventByName(name)
			if !ok {
				t.Fatalf("%s: unknown event %q", td.Pos, w)
			}
			a := c.step(e, int64(now))
			line := fmt.Sprintf("%-12s → %-7s %s", w, c.state, a)
			if e == EvTakeover && c.limited {
				line += " limited"
			}
			b.WriteString(line + "\n")
		}
		return b.String()
	})
}

func eventByName(s string) (Event, bool) {
	for i, n := range eventNames {
		if n == s {
			return Event(i), true
		}
	}
	return 0, false
}

// FuzzCore drives the core with arbitrary event sequences and checks its
// invariants: it becomes Active only on EvLocked; it asks to break a
// lock only when a takeover starts on a gateway that does not serve the
// volume (or, reconnected, goes on with one), and asks to lock after a
// break only once per takeover; it asks to reconnect only when the store
// can and the volume is Fenced; Fenced lasts until EvClosed or
// EvReconnected, and a fenced error counts only where the lock was held
// or being taken; it breaks the lock at most twice in any minute (the
// Limit it is given), and a takeover past that asks only to lock. Each
// input byte is an event and, in its high bits, how long after the one
// before it comes (0 to 150 s).
func FuzzCore(f *testing.F) {
	f.Add(false, []byte{byte(EvOpen), byte(EvBusy), byte(EvTakeover), byte(EvBroken), byte(EvBusy), byte(EvBroken), byte(EvLocked), byte(EvFenced)})
	f.Add(true, []byte{byte(EvOpen), byte(EvLocked), byte(EvFenced), byte(EvFailed), byte(EvTakeover), byte(EvReconnected), byte(EvBroken), byte(EvLocked)})
	f.Fuzz(func(t *testing.T, reconnects bool, evs []byte) {
		limit := Limit{Burst: 2, Window: time.Minute}
		c := newCore(reconnects, limit, nil)
		relocks := 0
		var now int64
		var breaks []int64
		for _, x := range evs {
			e := Event(x % uint8(len(eventNames)))
			now += int64(x>>4) * int64(10*time.Second)
			before := c
			if e == EvTakeover {
				relocks = 0
			}
			a := c.step(e, now)
			if a == ActBreak {
				recent := 0
				for _, b := range breaks {
					if now-b < int64(limit.Window) {
						recent++
					}
				}
				if recent >= limit.Burst {
					t.Fatalf("a break at %v after %d in the window before it (%v)", time.Duration(now), recent, breaks)
				}
				breaks = append(breaks, now)
			}
			if e == EvTakeover && c.limited && a != ActLock {
				t.Fatalf("a takeover past the limit asked for %v in %+v", a, before)
			}
			if c.state == Active && before.state != Active && e != EvLocked {
				t.Fatalf("%v made %v active", e, before)
			}
			if a == ActBreak && !(e == EvTakeover && before.state != Active && before.state != Fenced ||
				e == EvReconnected && before.pending && before.then == EvTakeover) {
				t.Fatalf("break asked by %v in %+v", e, before)
			}
			if a == ActReconnect && (!reconnects || c.state != Fenced) {
				t.Fatalf("reconnect asked by %v in %+v, now %+v", e, before, c)
			}
			if e == EvFenced && before.state != Active && !before.locking && c != before {
				t.Fatalf("a fenced error outside a lock changed %+v to %+v", before, c)
			}
			if a == ActLock && e == EvBroken {
				if relocks++; relocks > 1 {
					t.Fatalf("a second lock after a break in one takeover, in %+v", before)
				}
			}
			if before.state == Fenced && e != EvClosed && e != EvReconnected && c.state != Fenced {
				t.Fatalf("%v left fenced for %v", e, c.state)
			}
			_ = e.String() + a.String() + c.state.String()
		}
	})
}
