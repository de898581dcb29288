package initiator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestReservationsTwoHosts: host A registers and reserves Write
// Exclusive; host B's write is refused with ErrReservationConflict and
// its read works; B preempts A (with abort), after which A's write is
// refused and B's works; the report says so at each step. Without
// reservations both hosts write.
func TestReservationsTwoHosts(t *testing.T) {
	r := newRig(t, emu.Config{Wire: emu.WireLoop}, 1<<20, target.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := openVol0(t, ctx, r.dial(t, initiator.Config{Name: "hostA", Channels: 2}))
	b := openVol0(t, ctx, r.dial(t, initiator.Config{Name: "hostB"}))
	buf := make([]byte, 4096)
	write := func(v *initiator.Volume) error { _, err := v.WriteAtContext(ctx, buf, 0); return err }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ra, rb := a.Reservations(), b.Reservations()
	must(ra.Register(ctx, 0, 0xa))
	must(ra.Reserve(ctx, 0xa, initiator.WriteExclusive))
	// Every channel of A's session writes: the reservation is the host's.
	for range 4 {
		must(write(a))
	}
	err := write(b)
	if !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("B's write under A's write-exclusive reservation: %v, want ErrReservationConflict", err)
	}
	if _, err := b.ReadAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("B's read under a write-exclusive reservation: %v", err)
	}
	// B cannot reserve, and cannot preempt without registering.
	if err := rb.Reserve(ctx, 0xb, initiator.WriteExclusive); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("B reserves unregistered: %v", err)
	}
	must(rb.Register(ctx, 0, 0xb))
	rep, err := rb.Report(ctx)
	must(err)
	if rep.Holder != "hostA" || rep.HolderKey != 0xa || rep.Type != initiator.WriteExclusive || rep.Generation != 2 || len(rep.Registrants) != 2 {
		t.Fatalf("report: %+v", rep)
	}
	must(rb.Preempt(ctx, 0xb, 0xa, initiator.WriteExclusive, true))
	if err := write(a); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("A's write after B preempted it: %v, want ErrReservationConflict", err)
	}
	must(write(b))
	rep, err = ra.Report(ctx)
	must(err)
	if rep.Holder != "hostB" || len(rep.Registrants) != 1 || rep.Registrants[0] != (initiator.Registrant{Initiator: "hostB", Key: 0xb}) {
		t.Fatalf("report after the preempt: %+v", rep)
	}
	// A's old key is gone: its release is a conflict, not a silent no-op.
	if err := ra.Release(ctx, 0xa, initiator.WriteExclusive); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("A releases with a preempted key: %v", err)
	}
	must(rb.Release(ctx, 0xb, initiator.WriteExclusive))
	must(write(a))
}

// TestExclusiveOpen: an exclusive open is refused while another session
// has the volume open for writing, and granted once it closed; while it
// lasts another session's write fails with ErrReservationConflict and its
// read works; the exclusive writer's own channels all write; closing
// the volume ends it.
func TestExclusiveOpen(t *testing.T) {
	r := newRig(t, emu.Config{Wire: emu.WireLoop}, 1<<20, target.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sa := r.dial(t, initiator.Config{Name: "hostA", Channels: 2})
	sb := r.dial(t, initiator.Config{Name: "hostB"})
	b := openVol0(t, ctx, sb)
	excl := initiator.OpenOptions{Exclusive: true}
	if _, err := sa.Open(ctx, "vol0", excl); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("exclusive open while another session writes: %v, want ErrReservationConflict", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	a, err := sa.Open(ctx, "vol0", excl)
	if err != nil {
		t.Fatalf("exclusive open of a volume nobody writes: %v", err)
	}
	buf := make([]byte, 4096)
	for range 4 {
		if _, err := a.WriteAtContext(ctx, buf, 0); err != nil {
			t.Fatalf("the exclusive writer's write: %v", err)
		}
	}
	b = openVol0(t, ctx, sb)
	if _, err := b.WriteAtContext(ctx, buf, 0); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("another session's write under an exclusive open: %v, want ErrReservationConflict", err)
	}
	if _, err := b.ReadAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("another session's read under an exclusive open: %v", err)
	}
	if _, err := sb.Open(ctx, "vol0", excl); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("a second exclusive open: %v", err)
	}
	rep, err := b.Reservations().Report(ctx)
	if err != nil || rep.ExclusiveHolder != "hostA" {
		t.Fatalf("report under an exclusive open: %+v, %v", rep, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("write after the exclusive open closed: %v", err)
	}
}
