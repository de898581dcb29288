package gateway_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/target"
)

// TestCatalogTakeover: two gateways over one volume. The first to open
// it is active, the second standby and refuses I/O (target.ErrStandby)
// without touching the store; a takeover fences the first (the cluster
// tells it at once, and it reconnects to standby, its I/O refused) and
// then serves; the data is the new owner's; each change reaches
// OnStateChange, the old owner's before the new owner's activation. A
// failback is a takeover the other way, which fences the second. A
// memory store is passed through, active.
func TestCatalogTakeover(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	var changes []string
	for i, g := range []*gateway.Catalog{ga, gb} {
		g.OnStateChange(func(name string, s gateway.State) {
			changes = append(changes, fmt.Sprintf("%c %s %s", 'a'+i, name, s))
		})
	}

	va, vb := openBoth(t, ga, gb, "v")
	pa, pb := va.(target.PathStater), vb.(target.PathStater)
	if pa.Standby() || !pb.Standby() || ga.State("v") != gateway.Active || gb.State("v") != gateway.Standby {
		t.Fatalf("states after the opens: a %v, b %v; want active, standby", ga.State("v"), gb.State("v"))
	}
	if cl.Owner("v") != a.ID() {
		t.Fatalf("lock owner %d, want a (%d)", cl.Owner("v"), a.ID())
	}
	if d, ok := va.(target.Deallocator); !ok || !d.Deallocates() {
		t.Fatal("a gateway's volume over a store that discards does not say it deallocates: SRP hosts get no UNMAP")
	}
	blk := make([]byte, 4096)
	if _, err := vb.WriteAt(blk, 0); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("standby write: %v, want ErrStandby", err)
	}
	if _, err := vb.(target.Allocator).Allocated(0, 4096, func(int64, int64) bool { return true }); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("standby extents: %v, want ErrStandby", err)
	}
	blk[0] = 1
	if _, err := va.WriteAt(blk, 8192); err != nil {
		t.Fatal(err)
	}
	var runs [][2]int64
	if _, err := va.(target.Allocator).Allocated(0, 1<<20, func(off, n int64) bool { runs = append(runs, [2]int64{off, n}); return true }); err != nil ||
		len(runs) != 1 || runs[0] != [2]int64{8192, 4096} {
		t.Fatalf("active extents: %v, %v; want the one block written", runs, err)
	}
	if _, err := va.WriteAt(blk, 0); err != nil {
		t.Fatal(err)
	}

	if err := pb.TakeOver(); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if pb.Standby() || cl.Owner("v") != b.ID() {
		t.Fatalf("after the takeover b is %v, owner %d", gb.State("v"), cl.Owner("v"))
	}
	blk[0] = 2
	if _, err := vb.WriteAt(blk, 0); err != nil {
		t.Fatal(err)
	}
	// The old owner heard of the break from the cluster (FenceWatcher),
	// before any I/O of its own, and reconnected: standby.
	if ga.State("v") != gateway.Standby || !pa.Standby() {
		t.Fatalf("old owner is %v, want standby (fenced, then reconnected)", ga.State("v"))
	}
	blk[0] = 3
	if _, err := va.WriteAt(blk, 0); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("the old owner's write: %v, want ErrStandby", err)
	}
	want := []string{"a v active", "b v standby", "a v standby", "b v active"}
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Errorf("state changes told: %q, want %q", changes, want)
	}
	got := make([]byte, 4096)
	if _, err := vb.ReadAt(got, 0); err != nil || got[0] != 2 {
		t.Fatalf("read %d (%v), want the new owner's 2", got[0], err)
	}

	// Failback, asked for: a takes the volume back and fences b.
	if err := pa.TakeOver(); err != nil {
		t.Fatalf("the reconnected gateway's takeover: %v", err)
	}
	if ga.State("v") != gateway.Active || gb.State("v") != gateway.Standby || cl.Owner("v") != a.ID() {
		t.Fatalf("after the failback: a %v, b %v, owner %d; want active, standby, a", ga.State("v"), gb.State("v"), cl.Owner("v"))
	}
	if _, err := va.ReadAt(got, 0); err != nil || got[0] != 2 {
		t.Fatalf("read after the failback %d (%v), want b's 2", got[0], err)
	}
	if _, err := vb.WriteAt(blk, 0); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("b's write after the failback: %v, want ErrStandby", err)
	}

	// A store without locks: always active, not a PathStater.
	mem := block.NewMemStore()
	defer mem.Close()
	mv, _ := mem.Create("m", 1<<20, 4096)
	mv.Close()
	h, err := gateway.New(mem).OpenVolume("m")
	if err != nil {
		t.Fatal(err)
	}
	defer h.(interface{ Close() error }).Close()
	if _, ok := h.(target.PathStater); ok {
		t.Error("a memory volume is a PathStater")
	}
}

// TestCatalogReleaseOnClose: the lock goes with the volume's last handle,
// and the next gateway to open it is active without fencing anyone.
func TestCatalogReleaseOnClose(t *testing.T) {
	cl := gatewaytest.NewCluster()
	a, b := cl.Client(), cl.Client()
	v, _ := a.Create("v", 1<<20, 4096)
	v.Close()
	ga, gb := gateway.New(a), gateway.New(b)
	h1, _ := ga.OpenVolume("v")
	h2, _ := ga.OpenVolume("v")
	h1.(interface{ Close() error }).Close()
	if ga.State("v") != gateway.Active {
		t.Fatalf("one handle left: %v", ga.State("v"))
	}
	h2.(interface{ Close() error }).Close()
	if ga.State("v") != gateway.Closed || cl.Owner("v") != 0 {
		t.Fatalf("after the last close: %v, owner %d", ga.State("v"), cl.Owner("v"))
	}
	hb, err := gb.OpenVolume("v")
	if err != nil || hb.(target.PathStater).Standby() {
		t.Fatalf("b's open after a closed: standby %v, %v", hb.(target.PathStater).Standby(), err)
	}
	hb.(interface{ Close() error }).Close()
}

// TestCatalogFencesOneVolume: a takeover of one volume fences the old
// owner from that volume only; its other volume, on a client of its
// own, goes on being served. Before each shared volume had its own
// cluster client, one takeover blocklisted the gateway from all of them.
func TestCatalogFencesOneVolume(t *testing.T) {
	cl := gatewaytest.NewCluster()
	for _, n := range []string{"v", "w"} {
		if err := cl.Create(n, 1<<20, 4096); err != nil {
			t.Fatal(err)
		}
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	open := func(g *gateway.Catalog, name string) target.Volume {
		v, err := g.OpenVolume(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.(interface{ Close() error }).Close() })
		return v
	}
	av, aw, bv := open(ga, "v"), open(ga, "w"), open(gb, "v")
	if err := bv.(target.PathStater).TakeOver(); err != nil {
		t.Fatal(err)
	}
	if ga.State("v") != gateway.Standby || ga.State("w") != gateway.Active {
		t.Fatalf("after b took v over: a has v %v, w %v; want standby, active", ga.State("v"), ga.State("w"))
	}
	blk := make([]byte, 4096)
	if _, err := aw.WriteAt(blk, 0); err != nil {
		t.Fatalf("a's write to w, which nobody took over: %v", err)
	}
	if err := aw.Flush(); err != nil {
		t.Fatalf("a's flush of w: %v", err)
	}
	if _, err := av.WriteAt(blk, 0); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("a's write to v: %v, want ErrStandby", err)
	}
}

// TestCatalogReconnectFails: a fenced gateway that cannot reach the
// cluster stays fenced (SRP hosts see the unit unavailable) and refuses
// a takeover; once the cluster is reachable again, a takeover reconnects
// it first and then takes the volume over.
func TestCatalogReconnectFails(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	va, vb := openBoth(t, ga, gb, "v")
	a.FailReconnects(true)
	if err := vb.(target.PathStater).TakeOver(); err != nil {
		t.Fatal(err)
	}
	if ga.State("v") != gateway.Fenced || !va.(target.Fencer).Fenced() {
		t.Fatalf("a, which could not reconnect: %v, want fenced", ga.State("v"))
	}
	if err := va.(target.PathStater).TakeOver(); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("takeover by a gateway that cannot reconnect: %v, want ErrStandby", err)
	}
	if ga.State("v") != gateway.Fenced || cl.Owner("v") != b.ID() {
		t.Fatalf("after the failed takeover: a %v, owner %d; want fenced, b", ga.State("v"), cl.Owner("v"))
	}
	a.FailReconnects(false)
	if err := va.(target.PathStater).TakeOver(); err != nil {
		t.Fatalf("takeover once the cluster is back: %v", err)
	}
	if ga.State("v") != gateway.Active || cl.Owner("v") != a.ID() {
		t.Fatalf("after it: a %v, owner %d", ga.State("v"), cl.Owner("v"))
	}
}

// TestCatalogBreakLimit: two hosts that disagree take one volume back
// and forth through two gateways, a takeover a second. Each gateway
// breaks the lock at most Limit.Burst times a window, so the cluster's
// blocklist grows by at most 2 × Burst, not by one a takeover; a
// takeover past the bound fails as a standby path (target.ErrStandby),
// saying why, and leaves the volume served by the gateway that holds
// it. Once the window has passed, a takeover breaks again.
func TestCatalogBreakLimit(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	o := gateway.Options{Limit: gateway.Limit{Burst: 2, Window: time.Minute}, Clock: func() time.Time { return now }}
	ga, gb := gateway.NewWithOptions(cl.Client(), o), gateway.NewWithOptions(cl.Client(), o)
	var ps [2]target.PathStater
	var vs [2]target.Volume
	for i, g := range []*gateway.Catalog{ga, gb} {
		v, err := g.OpenVolume("v")
		if err != nil {
			t.Fatal(err)
		}
		defer v.(interface{ Close() error }).Close()
		vs[i], ps[i] = v, v.(target.PathStater)
	}
	taken, refused, already := 0, 0, 0
	for round := range 20 {
		now = now.Add(time.Second)
		i := (round + 1) % 2 // b first: a took the free lock at its open
		was := !ps[i].Standby()
		switch err := ps[i].TakeOver(); {
		case err == nil && was:
			already++
		case err == nil:
			taken++
		case errors.Is(err, target.ErrStandby) && strings.Contains(err.Error(), "not breaking the lock again"):
			refused++
		default:
			t.Fatalf("round %d: takeover through %c: %v", round, 'a'+i, err)
		}
		active := 0
		for j := range ps {
			if !ps[j].Standby() {
				active++
				if _, err := vs[j].WriteAt(make([]byte, 4096), 0); err != nil {
					t.Fatalf("round %d: write through the active gateway %c: %v", round, 'a'+j, err)
				}
			}
		}
		if active != 1 {
			t.Fatalf("round %d: %d gateways active", round, active)
		}
	}
	// The first four alternate; from then on every other asks the
	// gateway that serves, which has nothing to do.
	if taken != 4 || refused != 8 || already != 8 || cl.Blocklisted() != 4 {
		t.Fatalf("20 takeovers in 20 s: %d taken, %d refused, %d already active, %d blocklisted; want 4, 8, 8, 4 (2 breaks a minute per gateway)",
			taken, refused, already, cl.Blocklisted())
	}
	now = now.Add(time.Minute)
	i := 1
	if ps[0].Standby() {
		i = 0
	}
	if err := ps[i].TakeOver(); err != nil || cl.Blocklisted() != 5 {
		t.Fatalf("a takeover a minute later: %v, %d blocklisted; want done, 5", err, cl.Blocklisted())
	}
	// Each gateway's record (srpd exports it as metrics): b broke the
	// lock three times and was refused eight, a broke it twice and was
	// fenced three times, b twice.
	want := [2]gateway.VolumeStats{
		{Name: "v", State: gateway.Standby, Breaks: 2, Fenced: 3},
		{Name: "v", State: gateway.Active, Breaks: 3, Refused: 8, Fenced: 2},
	}
	for j, g := range []*gateway.Catalog{ga, gb} {
		if got := g.Stats(); len(got) != 1 || got[0] != want[j] {
			t.Errorf("gateway %c's stats: %+v, want %+v", 'a'+j, got, want[j])
		}
	}
}

// TestCatalogBeforeActive: BeforeActive's function runs once the lock is
// this gateway's and before the volume is active here, on a first open
// as on a takeover; when it fails, the volume is not served (a takeover
// fails as a standby path, saying why, and I/O is refused), and a later
// takeover runs it again.
func TestCatalogBeforeActive(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	var calls []string
	fail := errors.New("the shared state cannot be read")
	for i, g := range []*gateway.Catalog{ga, gb} {
		id := []int{a.ID(), b.ID()}[i]
		g.BeforeActive(func(name string) error {
			calls = append(calls, fmt.Sprintf("%c %s owner-is-me=%v state=%s", 'a'+i, name, cl.Owner(name) == id, g.State(name)))
			if i == 1 && fail != nil {
				return fail
			}
			return nil
		})
	}
	_, vb := openBoth(t, ga, gb, "v")

	err := vb.(target.PathStater).TakeOver()
	if !errors.Is(err, target.ErrStandby) || !strings.Contains(err.Error(), fail.Error()) {
		t.Fatalf("takeover whose BeforeActive fails: %v, want ErrStandby saying why", err)
	}
	if gb.State("v") == gateway.Active {
		t.Fatal("active after BeforeActive failed")
	}
	if _, err := vb.WriteAt(make([]byte, 4096), 0); !errors.Is(err, target.ErrStandby) {
		t.Fatalf("write after the failed takeover: %v, want ErrStandby", err)
	}
	fail = nil
	if err := vb.(target.PathStater).TakeOver(); err != nil || gb.State("v") != gateway.Active {
		t.Fatalf("takeover: %v, state %v", err, gb.State("v"))
	}
	want := []string{
		"a v owner-is-me=true state=standby",
		"b v owner-is-me=true state=standby",
		"b v owner-is-me=true state=standby",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("BeforeActive calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}

// openBoth opens volume name through ga, then gb; both handles close
// when the test ends.
func openBoth(t *testing.T, ga, gb *gateway.Catalog, name string) (va, vb target.Volume) {
	t.Helper()
	for _, g := range []struct {
		c *gateway.Catalog
		v *target.Volume
	}{{ga, &va}, {gb, &vb}} {
		v, err := g.c.OpenVolume(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.(interface{ Close() error }).Close() })
		*g.v = v
	}
	return va, vb
}
