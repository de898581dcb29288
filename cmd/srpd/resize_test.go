package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/servetest"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// resizeRig is srpd's service over a memory store with a target serving
// it on the software NIC, as a running daemon has.
type resizeRig struct {
	svc  *service
	nic  *emu.Provider
	addr string
}

func newResizeRig(t *testing.T) *resizeRig {
	t.Helper()
	st := block.NewMemStore()
	t.Cleanup(func() { st.Close() })
	nic, err := emu.New(emu.Config{Wire: emu.WireLoop})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	tgt, err := target.New(target.Config{Name: "t", Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		t.Fatal(err)
	}
	addr := servetest.Serve(t, tgt, nic.Listen)
	return &resizeRig{svc: &service{store: st, tgt: tgt}, nic: nic, addr: addr}
}

// open dials a session of channels connections and opens name on it;
// the test's cleanup closes it.
func (r *resizeRig) open(t *testing.T, name string, channels int) (*initiator.Session, *initiator.Volume) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, initiator.Config{Provider: r.nic, Addr: r.addr, Name: "host", Channels: channels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Open(ctx, name, initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

// TestShrinkRefusedWhileOpen: srpd refuses to shrink a volume a session
// has open, with a one-line error that says how many sessions, unless
// forced; the channels of one session count once; a grow is never
// refused, and a session on a snapshot does not
// hold the volume (the snapshot's size does not change with it). Before,
// the shrink was accepted and the session's reads past the new end
// failed as "medium error".
func TestShrinkRefusedWhileOpen(t *testing.T) {
	r := newResizeRig(t)
	if _, err := r.svc.CreateVolume(admin.CreateVolume{Name: "v", Size: 64 << 20, BlockSize: 4096}); err != nil {
		t.Fatal(err)
	}
	shrink := func(size int64, force bool) error {
		_, err := r.svc.ResizeVolume("v", admin.ResizeVolume{Size: size, Force: force})
		return err
	}
	if _, err := r.svc.CreateSnapshot("v", "s"); err != nil {
		t.Fatal(err)
	}
	r.open(t, "v@s", 1)
	if err := shrink(60<<20, false); err != nil {
		t.Fatalf("shrink with only a snapshot open: %v", err)
	}
	_, v1 := r.open(t, "v", 1)
	_, v2 := r.open(t, "v", 2) // one session over two connections
	err := shrink(32<<20, false)
	if !errors.Is(err, admin.ErrBusy) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "2 sessions have it open") ||
		!strings.Contains(err.Error(), "--force") {
		t.Fatalf("shrink under two sessions: %v, want a one-line busy error naming 2 sessions and --force", err)
	}
	t.Log(err)
	if err := shrink(80<<20, false); err != nil {
		t.Fatalf("grow under two sessions: %v", err)
	}
	// The open session learns the grow with its next command.
	if _, err := v2.ReadAt(make([]byte, 4096), 0); err != nil || v2.Size() != 80<<20 {
		t.Fatalf("session after the grow: size %d, read %v; want 80 MiB", v2.Size(), err)
	}
	if err := v1.Close(); err != nil {
		t.Fatal(err)
	}
	err = shrink(32<<20, false)
	if !errors.Is(err, admin.ErrBusy) || !strings.Contains(err.Error(), "1 session has it open") {
		t.Fatalf("shrink under one session: %v", err)
	}
	if err := shrink(32<<20, true); err != nil {
		t.Fatalf("forced shrink: %v", err)
	}
	if v, err := r.svc.volume("v"); err != nil || v.Size != 32<<20 {
		t.Fatalf("after the forced shrink: %+v, %v", v, err)
	}
}
