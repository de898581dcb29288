package gateway

import (
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
)

// TestSettleCountsOnlyTheRefusedTakeover: a takeover past the break
// limit is refused once, and counted once; an event that follows it on
// the standby volume (a fenced error from a request already under way,
// the store's fence watch) is no takeover, and neither fails with the
// limit's error nor counts as another refusal.
func TestSettleCountsOnlyTheRefusedTakeover(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	o := Options{Limit: Limit{Burst: 1, Window: time.Minute}, Clock: func() time.Time { return now }}
	ga, gb := NewWithOptions(cl.Client(), o), NewWithOptions(cl.Client(), o)
	for _, g := range []*Catalog{ga, gb} {
		v, err := g.OpenVolume("v")
		if err != nil {
			t.Fatal(err)
		}
		defer v.(interface{ Close() error }).Close()
	}
	eb, ea := gb.vols["v"], ga.vols["v"]
	if s, err := gb.run(eb, EvTakeover); s != Active || err != nil { // b's one break
		t.Fatalf("first takeover through b: %v, %v", s, err)
	}
	if s, err := ga.run(ea, EvTakeover); s != Active || err != nil { // a's one break
		t.Fatalf("takeover back through a: %v, %v", s, err)
	}
	if s, err := gb.run(eb, EvTakeover); s != Standby || !errors.Is(err, errBreakLimit) {
		t.Fatalf("second takeover through b: %v, %v; want standby, refused for the limit", s, err)
	}
	if s, err := gb.run(eb, EvFenced); s != Standby || err != nil {
		t.Fatalf("a fenced error on the standby after the refusal: %v, %v; want standby, no error", s, err)
	}
	if st := gb.Stats(); len(st) != 1 || st[0].Refused != 1 || st[0].Breaks != 1 {
		t.Fatalf("b's stats: %+v; want 1 break, 1 refusal", st)
	}
}
