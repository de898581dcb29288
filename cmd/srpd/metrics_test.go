package main

import (
	"testing"

	"github.com/gosrp/gosrp/block"
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
		fams, err := newRegistry(tgt, store, acceptErrs).Gather()
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
