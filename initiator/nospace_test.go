package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// twoStores serves "full" from a pebble store and "other" from a memory
// store.
type twoStores struct{ pebble, mem block.Store }

func (c twoStores) List() ([]target.VolumeInfo, error) {
	var out []target.VolumeInfo
	for _, s := range []block.Store{c.pebble, c.mem} {
		l, err := storecatalog.Catalog{Store: s}.List()
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

func (c twoStores) OpenVolume(name string) (target.Volume, error) {
	if name == "other" {
		return c.mem.Open(name)
	}
	return c.pebble.Open(name)
}

// TestWriteOnFullStore: a write to a volume whose pebble store is out of
// space reaches the initiator within a second as an error matching
// syscall.ENOSPC (initiator.ErrNoSpace), while reads of it, flushes and
// another volume keep working, and writes succeed once space is freed.
// The store's statfs and clock are fakes: the test decides when the disk
// is full. Before the fix the write fails with SenseMediumError (EIO),
// and on a real full disk it hung or crashed srpd.
func TestWriteOnFullStore(t *testing.T) {
	var avail atomic.Int64
	avail.Store(1 << 30)
	statfs := func(string) (block.SpaceUsage, error) {
		return block.SpaceUsage{Total: 2 << 30, Avail: avail.Load()}, nil
	}
	var clock atomic.Int64
	clock.Store(1e18)
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	ps, err := block.OpenPebbleStore(t.TempDir(), &block.PebbleOptions{
		Statfs: statfs, Clock: now, SpaceReserve: 64 << 20, CacheSize: 8 << 20, MemTableSize: 4 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	ms := block.NewMemStore()
	for _, c := range []struct {
		s    block.Store
		name string
	}{{ps, "full"}, {ms, "other"}} {
		v, err := c.s.Create(c.name, 16<<20, 4096)
		if err != nil {
			t.Fatal(err)
		}
		v.Close()
	}
	tgt, err := target.New(target.Config{Name: "test-target", Catalog: twoStores{ps, ms}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := emu.New(emu.Config{Wire: emu.WireLoop})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tgt, p.Listen, p.Close, ps.Close, ms.Close)
	ctx := context.Background()
	r := &rig{tp: p, ip: p, tgt: tgt, addr: addr}
	s := r.dial(t, initiator.Config{})
	full, err := s.Open(ctx, "full", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Open(ctx, "other", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	blk := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := full.WriteAt(blk, 0); err != nil {
		t.Fatal(err)
	}

	// The disk fills: 32 MiB free is under the 64 MiB reserve.
	avail.Store(32 << 20)
	clock.Add(int64(time.Second))
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	start := time.Now()
	_, err = full.WriteAtContext(wctx, blk, 4096)
	if el := time.Since(start); el > time.Second {
		t.Fatalf("refused write took %s", el)
	}
	if !errors.Is(err, syscall.ENOSPC) || !errors.Is(err, initiator.ErrNoSpace) {
		t.Fatalf("write on a full store: %v, want ENOSPC", err)
	}
	if _, err := full.WriteAtFUA(wctx, blk, 4096); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("FUA write on a full store: %v, want ENOSPC", err)
	}
	got := make([]byte, 4096)
	if _, err := full.ReadAt(got, 0); err != nil || !bytes.Equal(got, blk) {
		t.Fatalf("read on a full store: %v", err)
	}
	if err := full.Flush(ctx); err != nil {
		t.Fatalf("flush on a full store: %v", err)
	}
	if _, err := other.WriteAt(blk, 0); err != nil {
		t.Fatalf("write to another store's volume: %v", err)
	}

	// Space is freed: after the guard's refresh interval, writes work.
	avail.Store(1 << 30)
	clock.Add(int64(time.Second))
	if _, err := full.WriteAt(blk, 4096); err != nil {
		t.Fatalf("write after space was freed: %v", err)
	}
	if err := full.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.ConnectionsLost != 0 {
		t.Fatalf("connection lost: %+v", st)
	}
}
