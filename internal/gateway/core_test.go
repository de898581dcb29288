package gateway

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestCoreTrace runs the traces of testdata/core: each line an event
// (open, takeover, locked, busy, broken, failed, fenced, closed,
// reconnected), applied in order to one volume's core, whose store can
// reconnect if the command says "reconnects"; the output is the state
// after each and the action it asks for.
func TestCoreTrace(t *testing.T) {
	datadriven.RunTest(t, "testdata/core", func(t *testing.T, td *datadriven.TestData) string {
		if td.Cmd != "events" {
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		}
		c := newCore(td.HasArg("reconnects"))
		var b strings.Builder
		for _, w := range strings.Fields(td.Input) {
			e, ok := eventByName(w)
			if !ok {
				t.Fatalf("%s: unknown event %q", td.Pos, w)
			}
			a := c.step(e)
			fmt.Fprintf(&b, "%-11s → %-7s %s\n", w, c.state, a)
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
// or being taken.
func FuzzCore(f *testing.F) {
	f.Add(false, []byte{byte(EvOpen), byte(EvBusy), byte(EvTakeover), byte(EvBroken), byte(EvBusy), byte(EvBroken), byte(EvLocked), byte(EvFenced)})
	f.Add(true, []byte{byte(EvOpen), byte(EvLocked), byte(EvFenced), byte(EvFailed), byte(EvTakeover), byte(EvReconnected), byte(EvBroken), byte(EvLocked)})
	f.Fuzz(func(t *testing.T, reconnects bool, evs []byte) {
		c := newCore(reconnects)
		relocks := 0
		for _, x := range evs {
			e := Event(x % uint8(len(eventNames)))
			before := c
			if e == EvTakeover {
				relocks = 0
			}
			a := c.step(e)
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
