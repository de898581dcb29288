package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/faults"
)

// TestDestroyHeldDuringRelogin: the target's device does not return
// from destroying the QPs of a host whose process died (rxe's destroy
// waited 9 minutes for references on Linux 6.12: docs/performance.md).
// The host, restarted, logs in again under its name and reads back what
// it wrote before it died; another host's I/O goes on; and neither
// waits for the destroy, which is still held when they are done.
// destroyRig is a target whose device's QP destroys the test can hold
// (faults.Provider.HoldDestroys), with vol0 and vol1, over TCP wires.
type destroyRig struct {
	tp      *emu.Provider
	fp      *faults.Provider
	addr    string
	release func()
}

func newDestroyRig(t *testing.T) *destroyRig {
	t.Helper()
	tp, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	r := &destroyRig{tp: tp, fp: faults.Wrap(tp, faults.Config{}), release: func() {}}
	st := block.NewMemStore()
	for _, name := range []string{"vol0", "vol1"} {
		if _, err := st.Create(name, 1<<20, 4096); err != nil {
			t.Fatal(err)
		}
	}
	tgt, err := target.New(target.Config{Name: "test-target", Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		t.Fatal(err)
	}
	r.addr = serve(t, tgt, r.fp.Listen, tp.Close, st.Close)
	// After serve's cleanup is registered, so run before it: the
	// destroys are let go before the target's shutdown waits for its
	// connections to end.
	t.Cleanup(func() { r.release() })
	return r
}

// nic is a new initiator NIC, closed when the test ends.
func (r *destroyRig) nic(t *testing.T) *emu.Provider {
	t.Helper()
	p, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// hold holds the target's QP destroys from now on.
func (r *destroyRig) hold() { r.release = r.fp.HoldDestroys() }

// waitHeld waits until a QP destroy of the target's is held.
func (r *destroyRig) waitHeld(t *testing.T) {
	t.Helper()
	waitUntil(t, "the target destroying a QP", func() bool { return r.fp.Counters().DestroysHeld > 0 })
}

func TestDestroyHeldDuringRelogin(t *testing.T) {
	r := newDestroyRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	other := dial(t, initiator.Config{Provider: r.nic(t), Addr: r.addr, Name: "other"})
	ov := openNamed(t, ctx, other, "vol1")
	// The host that will die: its own NIC, so that closing the NIC is
	// its process's end (the connections drop, nothing is said).
	dying := r.nic(t)
	s, err := initiator.Dial(ctx, initiator.Config{Provider: dying, Addr: r.addr, Name: "host"})
	if err != nil {
		t.Fatal(err)
	}
	v := openVol0(t, ctx, s)
	want := bytes.Repeat([]byte("before the kill "), 256)
	if _, err := v.WriteAtFUA(ctx, want, 0); err != nil {
		t.Fatal(err)
	}

	r.hold()
	dying.Close()
	r.waitHeld(t)
	// Session.Close of the dead process's session: its NIC is gone, so
	// this only ends its goroutines.
	s.Close()

	again := dial(t, initiator.Config{Provider: r.nic(t), Addr: r.addr, Name: "host"})
	got := make([]byte, len(want))
	if _, err := openVol0(t, ctx, again).ReadAtContext(ctx, got, 0); err != nil {
		t.Fatalf("read after the restart, with the old QP's destroy held: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the restarted host read other data than it wrote before it died")
	}
	if _, err := ov.WriteAtContext(ctx, want, 4096); err != nil {
		t.Fatalf("another host's write, with the dead host's QP destroy held: %v", err)
	}
	if _, err := ov.ReadAtContext(ctx, got, 4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("another host's read-back, with the dead host's QP destroy held: %v", err)
	}
	// The destroy is still held: what came before did not wait for it.
	if n := r.fp.Counters().DestroysHeld; n == 0 {
		t.Fatal("no destroy held")
	}
}

// TestDestroyHeldDuringReconnect: the links of two hosts' connections
// are cut, and the target's device does not return from destroying
// their QPs. Each host's session reconnects, and its login replaces
// the connection whose QP is being destroyed (target.reinstate): the
// login waits for that connection's volume I/O to end, not for the
// destroy, which a device may take minutes over.
func TestDestroyHeldDuringReconnect(t *testing.T) {
	r := newDestroyRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var vols []*initiator.Volume
	for i, name := range []string{"vol0", "vol1"} {
		s := dial(t, initiator.Config{Provider: r.nic(t), Addr: r.addr, Name: fmt.Sprintf("host%d", i), LossTimeout: 20 * time.Second})
		vols = append(vols, openNamed(t, ctx, s, name))
	}
	want := bytes.Repeat([]byte("before the cut  "), 256)
	for _, v := range vols {
		if _, err := v.WriteAtFUA(ctx, want, 0); err != nil {
			t.Fatal(err)
		}
	}
	r.hold()
	for _, q := range r.tp.QPs() {
		if err := r.tp.CutLink(q); err != nil {
			t.Fatal(err)
		}
	}
	r.waitHeld(t)
	got := make([]byte, len(want))
	for i, v := range vols {
		if _, err := v.ReadAtContext(ctx, got, 0); err != nil {
			t.Fatalf("host%d's read after the cut, with its old QP's destroy held: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("host%d read other data than it wrote before the cut", i)
		}
	}
}

// TestOwnDestroyHeldDuringReconnect: the initiator's own device does not
// return from destroying the QP of a connection whose link was cut. The
// session reconnects over a new QP at once and its I/O goes on; the old
// QP's destroy runs in the background (Session.destroy), and Close,
// which deallocates the PD it belongs to, waits for it.
func TestOwnDestroyHeldDuringReconnect(t *testing.T) {
	r := newRig(t, emu.Config{Wire: emu.WireTCP}, 1<<20, target.Config{})
	fp := faults.Wrap(r.ip, faults.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, initiator.Config{Provider: fp, Addr: r.addr, Name: "host", LossTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	release := fp.HoldDestroys()
	defer release()
	v := openVol0(t, ctx, s)
	want := bytes.Repeat([]byte("before the cut  "), 256)
	if _, err := v.WriteAtFUA(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	for _, q := range r.tp.QPs() {
		if err := r.tp.CutLink(q); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the initiator destroying its old QP", func() bool { return fp.Counters().DestroysHeld > 0 })
	got := make([]byte, len(want))
	for i := range 3 {
		if _, err := v.ReadAtContext(ctx, got, 0); err != nil {
			t.Fatalf("read %d after the cut, with the old QP's destroy held: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("read other data than was written before the cut")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	release()
	if err := <-closed; err != nil {
		t.Fatalf("Close after the held destroy: %v", err)
	}
}
