package initiator_test

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestSRPReservations: an SRP host and a gosrp host share one volume's
// persistent reservations on srpd, the SRP host through PERSISTENT
// RESERVE OUT and IN (initiator.Reservations over ProtocolSRP), the
// gosrp host through its control requests: each sees the other's
// registrations and reservation, each is held off by the other's
// reservation, and a preempt by one fences the other. The SRP host is
// known to the gosrp host's report by its initiator port, in hex.
func TestSRPReservations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := gosrpAndSRPHost(t, ctx)
	port := initiator.SRPPortID("srp-host")
	srpName := hex.EncodeToString(port[:])
	ra, rb := a.Reservations(), b.Reservations()
	buf := make([]byte, 4096)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	conflict := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, initiator.ErrReservationConflict) {
			t.Fatalf("%s: %v, want ErrReservationConflict", what, err)
		}
	}
	keys := func(rep initiator.ReservationReport) []uint64 {
		var k []uint64
		for _, g := range rep.Registrants {
			k = append(k, g.Key)
		}
		slices.Sort(k)
		return k
	}

	must("A registers", ra.Register(ctx, 0, 0xa))
	must("B registers", rb.Register(ctx, 0, 0xb))
	conflict("B registers again with a wrong key", rb.Register(ctx, 0x77, 0xb))
	rep, err := rb.Report(ctx)
	must("B's report", err)
	if !slices.Equal(keys(rep), []uint64{0xa, 0xb}) || rep.Type != initiator.NoReservation || rep.Generation != 2 {
		t.Fatalf("B's report: %+v", rep)
	}

	must("B reserves", rb.Reserve(ctx, 0xb, initiator.WriteExclusive))
	must("B reserves again", rb.Reserve(ctx, 0xb, initiator.WriteExclusive))
	conflict("A reserves", ra.Reserve(ctx, 0xa, initiator.WriteExclusive))
	_, err = a.WriteAtContext(ctx, buf, 0)
	conflict("A's write under B's reservation", err)
	_, err = b.WriteAtContext(ctx, buf, 0)
	must("B's write under its own reservation", err)
	rep, err = ra.Report(ctx)
	must("A's report", err)
	if rep.Holder != srpName || rep.HolderKey != 0xb || rep.Type != initiator.WriteExclusive {
		t.Fatalf("A's report: holder %q key %#x type %v; want %s 0xb write-exclusive", rep.Holder, rep.HolderKey, rep.Type, srpName)
	}

	must("A preempts B", ra.Preempt(ctx, 0xa, 0xb, initiator.ExclusiveAccess, true))
	_, err = b.ReadAtContext(ctx, buf, 0)
	conflict("B's read after A preempted it under exclusive access", err)
	conflict("B's release with its preempted key", rb.Release(ctx, 0xb, initiator.WriteExclusive))
	rep, err = rb.Report(ctx)
	must("B's report after the preempt", err)
	if !slices.Equal(keys(rep), []uint64{0xa}) || rep.HolderKey != 0xa || rep.Type != initiator.ExclusiveAccess || rep.Generation != 3 {
		t.Fatalf("B's report after the preempt: %+v", rep)
	}
	must("B registers ignoring its old key", rb.RegisterIgnoringKey(ctx, 0xc))
	must("A clears", ra.Clear(ctx, 0xa))
	_, err = b.WriteAtContext(ctx, buf, 0)
	must("B's write once cleared", err)
}

// TestSRPReservationConflict: an SRP host (ProtocolSRP) of a volume a
// gosrp host has reserved. Its commands the reservation forbids are
// answered with the status RESERVATION CONFLICT (SPC-4 5.13.1), which
// the initiator returns as ErrReservationConflict, and which Linux's
// dm-multipath does not take for a path failure (BLK_STS_NEXUS): under
// WRITE EXCLUSIVE its write and UNMAP, under EXCLUSIVE
// ACCESS its read and flush too. Until this test, the SRP personality
// checked no reservation at all: an SRP host wrote through another
// host's reservation.
func TestSRPReservationConflict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := gosrpAndSRPHost(t, ctx)
	buf := make([]byte, 4096)
	ra := a.Reservations()
	for _, step := range []struct {
		typ         initiator.ReservationType
		read, flush error
		write       error // and discard (UNMAP)
	}{
		{typ: initiator.WriteExclusive, write: initiator.ErrReservationConflict},
		{typ: initiator.ExclusiveAccess, read: initiator.ErrReservationConflict, flush: initiator.ErrReservationConflict, write: initiator.ErrReservationConflict},
	} {
		if err := ra.Register(ctx, 0, 0xa); err != nil {
			t.Fatal(err)
		}
		if err := ra.Reserve(ctx, 0xa, step.typ); err != nil {
			t.Fatal(err)
		}
		_, rerr := b.ReadAtContext(ctx, buf, 0)
		_, werr := b.WriteAtContext(ctx, buf, 0)
		ferr := b.Flush(ctx)
		derr := b.Discard(ctx, 0, 4096)
		for _, c := range []struct {
			what      string
			got, want error
		}{{"read", rerr, step.read}, {"write", werr, step.write}, {"flush", ferr, step.flush}, {"discard", derr, step.write}} {
			if c.want == nil && c.got != nil || c.want != nil && !errors.Is(c.got, c.want) {
				t.Errorf("the SRP host's %s under %s: %v, want %v", c.what, step.typ, c.got, c.want)
			}
			var se *initiator.SCSIError
			if c.want != nil && (!errors.As(c.got, &se) || se.Status != initiator.SCSIStatusReservationConflict) {
				t.Errorf("the SRP host's %s under %s: %v, want the status RESERVATION CONFLICT", c.what, step.typ, c.got)
			}
		}
		if err := ra.Release(ctx, 0xa, step.typ); err != nil {
			t.Fatal(err)
		}
		if err := ra.Register(ctx, 0xa, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.WriteAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("the SRP host's write once released: %v", err)
	}
}

// gosrpAndSRPHost opens vol0 of an SRP rig (newSRPRig) for two hosts:
// a, gosrp's "hostA", and b, "srp-host" over ProtocolSRP (LUN 0).
func gosrpAndSRPHost(t *testing.T, ctx context.Context) (a, b *initiator.Volume) {
	t.Helper()
	r := newSRPRig(t, emu.Config{Wire: emu.WireLoop})
	a = openVol0(t, ctx, r.dial(t, initiator.Config{Name: "hostA"}))
	s := r.dial(t, initiator.Config{Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort})
	b, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}
