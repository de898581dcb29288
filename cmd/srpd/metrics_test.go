package main

import (
	"strings"
	"testing"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestAcceptErrorsMetric: on the software NIC, srpd exports its count of
// temporary accept failures as srpd_accept_errors_total; a provider
// without the count gets no such metric rather than a false zero.
func TestAcceptErrorsMetric(t *testing.T) {
	p, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	store := block.NewMemStore()
	defer store.Close()
	tgt, err := target.New(target.Config{Catalog: storecatalog.Catalog{Store: store}})
	if err != nil {
		t.Fatal(err)
	}
	find := func(acceptErrs func() uint64) (float64, bool) {
		fams, err := newRegistry(tgt, store, acceptErrs, nil).Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "srpd_accept_errors_total" {
				return f.GetMetric()[0].GetCounter().GetValue(), true
			}
		}
		return 0, false
	}
	if v, ok := find(acceptErrors(p)); !ok || v != 0 {
		t.Errorf("emu: srpd_accept_errors_total = %v (present %v), want 0", v, ok)
	}
	if v, ok := find(func() uint64 { return 3 }); !ok || v != 3 {
		t.Errorf("srpd_accept_errors_total = %v, want the provider's 3", v)
	}
	if _, ok := find(nil); ok {
		t.Error("srpd_accept_errors_total exported for a provider without the count")
	}
}

// TestGatewayMetrics: over a shared store srpd exports each volume's
// path state at the gateway and its counts of lock breaks, refused
// takeovers and fencings; after a takeover through the second gateway,
// it counts one break and the first one fencing. A store that is not
// shared exports none of them.
func TestGatewayMetrics(t *testing.T) {
	cl := gatewaytest.NewCluster()
	if err := cl.Create("v", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	a, b := cl.Client(), cl.Client()
	ga, gb := gateway.New(a), gateway.New(b)
	var paths [2]target.PathStater
	for i, g := range []*gateway.Catalog{ga, gb} {
		v, err := g.OpenVolume("v")
		if err != nil {
			t.Fatal(err)
		}
		defer v.(interface{ Close() error }).Close()
		paths[i] = v.(target.PathStater)
	}
	if err := paths[1].TakeOver(); err != nil {
		t.Fatal(err)
	}
	tgt, err := target.New(target.Config{Catalog: ga})
	if err != nil {
		t.Fatal(err)
	}
	// gather returns the gateway metrics of a registry, by name and
	// labels.
	gather := func(gw func() []gateway.VolumeStats) map[string]float64 {
		fams, err := newRegistry(tgt, a, nil, gw).Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), "srpd_gateway_") {
				continue
			}
			for _, m := range f.GetMetric() {
				key := f.GetName()
				for _, l := range m.GetLabel() {
					key += " " + l.GetName() + "=" + l.GetValue()
				}
				got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		return got
	}
	for _, tc := range []struct {
		gw   *gateway.Catalog
		want map[string]float64
	}{
		{ga, map[string]float64{
			"srpd_gateway_path_state state=standby volume=v": 1, "srpd_gateway_path_state state=active volume=v": 0,
			"srpd_gateway_lock_breaks_total volume=v": 0, "srpd_gateway_fencings_total volume=v": 1,
			"srpd_gateway_takeovers_refused_total volume=v": 0,
		}},
		{gb, map[string]float64{
			"srpd_gateway_path_state state=active volume=v": 1, "srpd_gateway_path_state state=standby volume=v": 0,
			"srpd_gateway_lock_breaks_total volume=v": 1, "srpd_gateway_fencings_total volume=v": 0,
		}},
	} {
		got := gather(tc.gw.Stats)
		for k, v := range tc.want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
			}
		}
	}
	if got := gather(nil); len(got) != 0 {
		t.Errorf("gateway metrics for a store that is not shared: %v", got)
	}
}
