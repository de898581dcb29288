package main

import (
	"testing"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/target"
)

// TestStatusPathState: srpd status of two gateways over one shared store
// shows each volume's path state at each (active, standby, closed when
// not open there; fenced after the other's takeover while it cannot
// reach the cluster, standby once a failback fenced the other, which
// reconnected); a store that is not shared shows none.
func TestStatusPathState(t *testing.T) {
	cl := gatewaytest.NewCluster()
	for _, name := range []string{"v", "w"} {
		if err := cl.Create(name, 1<<20, 4096); err != nil {
			t.Fatal(err)
		}
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	sa, sb := &service{store: a, cat: ga}, &service{store: b, cat: gb}
	states := func(s *service) map[string]string {
		t.Helper()
		st, err := s.Status()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, v := range st.Volumes {
			m[v.Name] = v.PathState
		}
		return m
	}
	var h [2]target.PathStater // a opens first: a is active
	for i, g := range []*gateway.Catalog{ga, gb} {
		v, err := g.OpenVolume("v")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.(interface{ Close() error }).Close() })
		h[i] = v.(target.PathStater)
	}
	if got := states(sa); got["v"] != "active" || got["w"] != "closed" {
		t.Errorf("gateway a: %v, want v active, w closed", got)
	}
	if got := states(sb); got["v"] != "standby" {
		t.Errorf("gateway b: %v, want v standby", got)
	}
	a.FailReconnects(true)
	if err := h[1].TakeOver(); err != nil {
		t.Fatal(err)
	}
	if got, gotB := states(sa), states(sb); got["v"] != "fenced" || gotB["v"] != "active" {
		t.Errorf("after b's takeover: a %v, b %v; want fenced, active", got, gotB)
	}
	a.FailReconnects(false)
	if err := h[0].TakeOver(); err != nil {
		t.Fatal(err)
	}
	if got, gotB := states(sa), states(sb); got["v"] != "active" || gotB["v"] != "standby" {
		t.Errorf("after a's failback: a %v, b %v; want active, standby", got, gotB)
	}

	mem := block.NewMemStore()
	defer mem.Close()
	if _, err := mem.Create("m", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	if got := states(&service{store: mem, cat: gateway.New(mem)}); got["m"] != "" {
		t.Errorf("a memory store's volume has path state %q, want none", got["m"])
	}
}
