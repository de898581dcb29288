package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
)

// TestOvercommitAndSpaceStatus: on a 64 MiB file system, creating or
// growing a volume past --max-overcommit fails with a one-line invalid
// argument error naming the bound, and status and /metrics report the
// free space and the provisioned total. Before, a 1 TiB (or 8.8 PiB)
// volume was accepted silently and nothing showed free space.
func TestOvercommitAndSpaceStatus(t *testing.T) {
	statfs := func(string) (block.SpaceUsage, error) { return block.SpaceUsage{Total: 64 << 20, Avail: 40 << 20}, nil }
	st, err := block.OpenPebbleStore("/data", &block.PebbleOptions{FS: vfs.NewMem(), Statfs: statfs, MaxOvercommit: 2,
		CacheSize: 8 << 20, MemTableSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := &service{store: st}
	for _, size := range []int64{1 << 40, 88 << 50 / 10 / 4096 * 4096} {
		_, err = svc.CreateVolume(admin.CreateVolume{Name: "big", Size: size})
		if !errors.Is(err, admin.ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("create of %d bytes on 64 MiB: %v, want a one-line invalid argument", size, err)
		}
	}
	if !strings.Contains(err.Error(), "max-overcommit") && !strings.Contains(err.Error(), "size") {
		t.Errorf("error does not say why: %v", err)
	}
	if _, err := svc.CreateVolume(admin.CreateVolume{Name: "a", Size: 100 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err = svc.ResizeVolume("a", admin.ResizeVolume{Size: 200 << 20})
	if !errors.Is(err, admin.ErrInvalid) || !strings.Contains(err.Error(), "--max-overcommit 2 × the 64 MiB file system = 128 MiB") {
		t.Fatalf("resize past the bound: %v", err)
	}
	t.Log(err)
	s, err := svc.Status()
	if err != nil {
		t.Fatal(err)
	}
	if sp := s.Space; sp == nil || sp.Total != 64<<20 || sp.Free != 40<<20 || sp.Provisioned != 100<<20 || sp.MaxOvercommit != 2 || sp.Reserve != 16<<20 {
		t.Fatalf("status space %+v", s.Space)
	}
	tgt, err := target.New(target.Config{Name: "t", Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := newRegistry(tgt, st, nil, nil).Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if got["srpd_store_free_bytes"] != 40<<20 || got["srpd_store_provisioned_bytes"] != 100<<20 {
		t.Fatalf("space metrics: %v", got)
	}
	if _, ok := got["srpd_store_refused_writes_total"]; !ok {
		t.Fatal("no srpd_store_refused_writes_total")
	}
}
