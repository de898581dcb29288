package target

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/wire"
)

// hangingStore makes the rig's store hang in the open of every volume
// whose name starts with "ghost" (a cluster out of reach hangs on names
// it has no image for, too) until release, and counts those opens: all
// of them, and those still running.
type hangingStore struct {
	gate          chan struct{}
	once          sync.Once
	opens, inside atomic.Int32
}

func newHangingStore(t *testing.T, r *rig) *hangingStore {
	h := &hangingStore{gate: make(chan struct{})}
	r.cat.opening = func(name string) {
		if strings.HasPrefix(name, "ghost") {
			h.opens.Add(1)
			h.inside.Add(1)
			<-h.gate
			h.inside.Add(-1)
		}
	}
	t.Cleanup(h.release) // before the rig's shutdown (cleanups run last first)
	return h
}

func (h *hangingStore) release() { h.once.Do(func() { close(h.gate) }) }

// openPending sends an OPEN of name and checks that it is answered NOT
// READY, becoming ready.
func (c *client) openPending(name string) {
	c.tb.Helper()
	rsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: name})
	if rsp.Sense != wire.SenseBecomingReady || rsp.Handle != 0 {
		c.tb.Fatalf("OPEN %s: %+v, want NOT READY, becoming ready", name, rsp)
	}
}

// TestOpenAbandonedBound: a hostile initiator OPENs name after name on a
// store that hangs on every one of them. Each OPEN is answered NOT
// READY after OpenWait and its open goes on, abandoned; past
// maxConnAbandonedOpens the connection's OPENs are answered at once,
// and the store is asked for nothing more. Another initiator still
// opens and uses a volume, until the target's own bound is met. Once
// the store answers, the bounds are free again. Before, every name cost
// a goroutine hung in the store for as long as the store hung, without
// bound.
func TestOpenAbandonedBound(t *testing.T) {
	r := newRig(t, envs[0], Config{OpenWait: 20 * time.Millisecond})
	r.tgt.maxAbandoned = maxConnAbandonedOpens + 4
	h := newHangingStore(t, r)

	a := r.dial(t)
	defer a.close()
	a.login("hostile")
	for i := range maxConnAbandonedOpens + 8 {
		a.openPending("ghost-a" + string(rune('a'+i)))
	}
	if n := h.opens.Load(); n != maxConnAbandonedOpens {
		t.Fatalf("the store was asked to open %d volumes for one connection, want %d (the connection's bound)", n, maxConnAbandonedOpens)
	}
	a.openPending("vol0") // the connection's bound holds for every name

	b := r.dial(t)
	defer b.close()
	b.login("other")
	b.open("vol0", false)
	for i := range 8 {
		b.openPending("ghost-b" + string(rune('a'+i)))
	}
	if n, want := h.opens.Load(), r.tgt.maxAbandoned; n != want {
		t.Fatalf("the store was asked to open %d volumes in all, want %d (the target's bound)", n, want)
	}
	b.openPending("vol1")

	h.release()
	waitFor(t, "the abandoned opens to return", func() bool { return r.tgt.abandoned.Load() == 0 })
	if n := h.inside.Load(); n != 0 {
		t.Fatalf("%d opens still in the store", n)
	}
	a.open("vol0", false)
	b.open("vol1", false)
}

// TestSRPOpenAbandonedBound: an SRP login while the target's bound on
// abandoned opens is met leaves its LUNs empty, and the session gets
// them once an abandoned open returns: nothing else would ask for them
// again.
func TestSRPOpenAbandonedBound(t *testing.T) {
	r := newRig(t, srpEnvs[0], Config{OpenWait: 20 * time.Millisecond})
	r.tgt.maxAbandoned = 1
	h := newHangingStore(t, r)

	a := r.dial(t)
	defer a.close()
	a.login("gosrp")
	a.openPending("ghost")

	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.reportLUNs(t, "REPORT LUNS with the bound met"); len(got) != 0 {
		t.Fatalf("REPORT LUNS with the target's bound met: %v, want none", got)
	}
	h.release()
	waitFor(t, "the LUNs after an abandoned open returned", func() bool {
		return slices.Equal(c.reportLUNs(t, "REPORT LUNS"), []uint16{lunRO, lunVol0, lunVol1})
	})
	c.clearUA(t, lunVol0)
	copy(c.data(0, bs), pattern(bs, 0x31))
	c.good("WRITE(10) to a LUN the bound held back", c.do(c.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)
	c.logout()
}
