//go:build ceph && pacific

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDSharedReservations: two srpd gateways over one RBD image, two
// hosts each with one path, to a different gateway. Host A registers
// and takes a Write Exclusive reservation through the active gateway;
// host B, through the other, cannot register while that gateway is
// standby (ErrStandby: it could not record the change where the active
// one reads it), though its report there names A (read from the image),
// and then takes the volume over: that gateway reads
// the reservation recorded with the image before it serves, so B's
// write is refused (reservation conflict) and its report names A. B
// registers and preempts A through its gateway; A takes the volume
// back, and its write is now the refused one. A third host registers
// through a Multipath of both; the gateway it used dies, and its report
// fails over to the other, which knows the registration. A gateway that
// forgot the
// image's reservations would let the other host write over the
// fence (what each srpd did with a reservations file of its own).
func TestRBDSharedReservations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, srpd, args := rbdGatewaySetup(t)
	dir := t.TempDir()
	addrs := []string{e2etest.FreeAddr(t), e2etest.FreeAddr(t)}
	// The first gateway's data directory holds reservations an older
	// srpd kept there: not used, and said so.
	data0 := filepath.Join(dir, "gw0")
	if err := os.MkdirAll(data0, 0o700); err != nil {
		t.Fatal(err)
	}
	old := `{"vol0": {"generation": 1, "registrations": [{"initiator": "old", "key": 1}]}}`
	if err := os.WriteFile(filepath.Join(data0, reservationsFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	var gws []*e2etest.Daemon
	for i, addr := range addrs {
		gws = append(gws, e2etest.StartDaemon(t, srpd, filepath.Join(dir, fmt.Sprint("gw", i)), addr, "", args...))
	}
	if !strings.Contains(gws[0].Log(), "not used by a gateway") {
		t.Errorf("the first gateway does not say it ignores its reservations file:\n%s", gws[0].Log())
	}
	open := func(host, addr string, takeover bool) *initiator.Volume {
		t.Helper()
		_, v := dialOpen(t, ctx, addr, host, initiator.OpenOptions{Takeover: takeover})
		return v
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	buf := make([]byte, 4096)
	a := open("hostA", addrs[0], false)
	if a.Standby() {
		t.Fatal("the first gateway's open is standby")
	}
	must("A registers", a.Reservations().Register(ctx, 0, 0xa))
	must("A reserves", a.Reservations().Reserve(ctx, 0xa, initiator.WriteExclusive))
	_, err := a.WriteAtContext(ctx, buf, 0)
	must("A writes", err)

	// Through the standby gateway the change cannot be recorded where
	// the active one reads it: refused as a path that is not active.
	s := open("hostB", addrs[1], false)
	if !s.Standby() {
		t.Fatal("the second gateway's open is not standby")
	}
	if err := s.Reservations().Register(ctx, 0, 0xb); !errors.Is(err, initiator.ErrStandby) {
		t.Fatalf("B registers through the standby gateway: %v, want ErrStandby", err)
	}
	// It reports them as recorded with the image, not as it last knew.
	if rep, err := s.Reservations().Report(ctx); err != nil || rep.Holder != "hostA" || rep.HolderKey != 0xa {
		t.Fatalf("B's report through the standby gateway: %+v, %v; want hostA holding", rep, err)
	}
	b := open("hostB", addrs[1], true)
	if b.Standby() {
		t.Fatal("B's takeover left the second gateway standby")
	}
	if _, err := b.WriteAtContext(ctx, buf, 4096); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("B's write through the gateway that took the volume over: %v, want ErrReservationConflict", err)
	}
	rep, err := b.Reservations().Report(ctx)
	must("B's report", err)
	if rep.Holder != "hostA" || rep.HolderKey != 0xa || rep.Type != initiator.WriteExclusive {
		t.Fatalf("B's report through the second gateway: %+v, want hostA's write-exclusive", rep)
	}
	_, err = b.ReadAtContext(ctx, buf, 0)
	must("B reads (Write Exclusive lets it)", err)
	must("B registers", b.Reservations().Register(ctx, 0, 0xb))
	must("B preempts A", b.Reservations().Preempt(ctx, 0xb, 0xa, initiator.WriteExclusive, false))
	_, err = b.WriteAtContext(ctx, buf, 4096)
	must("B writes, holding the reservation", err)

	a2 := open("hostA", addrs[0], true)
	if a2.Standby() {
		t.Fatal("A's takeover left the first gateway standby")
	}
	if _, err := a2.WriteAtContext(ctx, buf, 0); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("A's write after B preempted it, through the first gateway again: %v, want ErrReservationConflict", err)
	}
	rep, err = a2.Reservations().Report(ctx)
	must("A's report", err)
	if rep.Holder != "hostB" || rep.HolderKey != 0xb {
		t.Fatalf("A's report through the first gateway: %+v, want hostB holding", rep)
	}

	// A host with both paths registers through the active one (the
	// first, since A took the volume back); that gateway dies, and its
	// report fails over to the other, which reads the registration with
	// the image when it takes the volume over.
	mv := openMultipath(t, ctx, initiator.MultipathConfig{}, addrs)
	must("C registers through its Multipath", mv.Reservations().Register(ctx, 0, 0xc))
	gws[0].Kill(t)
	rep, err = mv.Reservations().Report(ctx)
	must("C's report after the first gateway died", err)
	if mv.Failovers() != 1 || rep.Holder != "hostB" || len(rep.Registrants) != 2 || rep.Registrants[1] != (initiator.Registrant{Initiator: "host", Key: 0xc}) {
		t.Fatalf("C's report through the second gateway: %+v after %d failovers; want hostB holding and registered, then C (A was preempted)", rep, mv.Failovers())
	}
	// A change right after the failover: librbd tells the image's
	// watchers of the metadata change, the dead gateway's among them
	// until its watch is gone.
	start := time.Now()
	must("C changes its key through the second gateway", mv.Reservations().Register(ctx, 0xc, 0xd))
	t.Logf("a reservation change right after the failover took %v", time.Since(start).Round(time.Millisecond))
}

// TestRBDReservationsGarbage: a gateway reads the reservations recorded
// with the image before it serves the volume, so a record it cannot
// use must keep it from serving, not let it serve as if the volume had
// no reservation. Host A holds a Write Exclusive reservation through
// the first gateway; someone then writes a record that is not JSON
// into the image's metadata by hand (`rbd image-meta set`), and later
// one that is JSON but names a holder with no registration. Each time,
// host B's takeover through the second gateway fails, B's write is not
// served, and srpd's log says why. With the record mended (A's
// reservation as it was), the takeover succeeds and B's write is
// refused by A's reservation, as before the damage.
func TestRBDReservationsGarbage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startGateways(t)
	conf, image, addrs, gws := p.conf, p.image, p.addrs, p.gws
	buf := make([]byte, 4096)
	_, a := dialOpen(t, ctx, addrs[0], "hostA", initiator.OpenOptions{})
	if a.Standby() {
		t.Fatal("the first gateway's open is standby")
	}
	if err := a.Reservations().Register(ctx, 0, 0xa); err != nil {
		t.Fatalf("A registers: %v", err)
	}
	if err := a.Reservations().Reserve(ctx, 0xa, initiator.WriteExclusive); err != nil {
		t.Fatalf("A reserves: %v", err)
	}
	good := strings.TrimSpace(string(rbdToolOutput(t, conf, "image-meta", "get", image, reservationsKey)))
	if !strings.Contains(good, `"hostA"`) {
		t.Fatalf("the image records %q as its reservations, want hostA's", good)
	}

	for _, tc := range []struct{ name, record, why string }{
		{"not-json", `{"generation": 3, "holder": "hostA"`, "unexpected end of JSON input"},
		{"holder-unregistered", `{"generation": 3, "holder": "hostZ", "type": "write-exclusive", "registrations": [{"initiator": "hostA", "key": 10}]}`, "hostZ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rbdTool(t, conf, "image-meta", "set", image, reservationsKey, tc.record)
			gw := gws[1]
			before := len(gw.Log())
			s := dialHost(t, ctx, gw.Addr, "hostB")
			_, err := s.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
			if !errors.Is(err, initiator.ErrStandby) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("B's takeover over a damaged reservations record: %v, want ErrStandby saying %q", err, tc.why)
			}
			t.Logf("B's takeover: %v", err)
			if log := gw.Log()[before:]; !strings.Contains(log, tc.why) {
				t.Errorf("the gateway does not say why it does not serve the volume (%q):\n%s", tc.why, log)
			}
			b, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !b.Standby() {
				t.Fatal("after a failed takeover the gateway serves the volume")
			}
			if _, err := b.WriteAtContext(ctx, buf, 4096); !errors.Is(err, initiator.ErrStandby) {
				t.Fatalf("B's write through the gateway that could not read the reservations: %v, want ErrStandby", err)
			}
			s.Close()
		})
	}

	// Mended: the takeover succeeds, and A's reservation fences B again.
	rbdTool(t, conf, "image-meta", "set", image, reservationsKey, good)
	_, b := dialOpen(t, ctx, addrs[1], "hostB", initiator.OpenOptions{Takeover: true})
	if b.Standby() {
		t.Fatal("B's takeover after the record was mended left the gateway standby")
	}
	if _, err := b.WriteAtContext(ctx, buf, 4096); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("B's write once the record was mended: %v, want ErrReservationConflict", err)
	}
}

// TestRBDSRPReservations: SRP hosts (T10 SRP, SCSI persistent
// reservations) through two srpd gateways over one RBD image, each
// gateway its own ALUA target port group. Host X takes the volume
// through the first gateway (SET TARGET PORT GROUPS), registers and
// takes a Write Exclusive reservation. Host Y, on the standby gateway,
// cannot register there (NOT READY: that gateway could not record it
// where the active one reads it), but its PERSISTENT RESERVE IN reads
// the reservation recorded with the image. Y takes the volume over: the
// gateway reads the reservation before it serves, so Y's write is a
// RESERVATION CONFLICT and its read goes through; Y registers and
// preempts X. X's write through its fenced gateway is refused standby;
// Y's gateway is SIGKILLed, and once X takes the volume back, X's write
// is a conflict: each gateway holds the SRP hosts to the reservation
// the other recorded before it answered.
func TestRBDSRPReservations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, srpd, args := rbdGatewaySetup(t)
	dir := t.TempDir()
	addrs := []string{e2etest.FreeAddr(t), e2etest.FreeAddr(t)}
	var gws []*e2etest.Daemon
	for i, addr := range addrs {
		gws = append(gws, e2etest.StartDaemon(t, srpd, filepath.Join(dir, fmt.Sprint("gw", i)), addr, "", append(args, "--srp-port-group", fmt.Sprint(i+1))...))
	}
	// A host has one session: the port identifier is the name's
	// (initiator.SRPPortID), and two sessions of one I_T nexus would end
	// each other's channels at every login (SINGLE), so open ends the
	// host's earlier session first, as a host logging in again does.
	sessions := map[string]*initiator.Session{}
	open := func(host string, gw int, takeover bool) *initiator.Volume {
		t.Helper()
		if old := sessions[host]; old != nil {
			if err := old.Close(); err != nil {
				t.Fatalf("%s: close the earlier session: %v", host, err)
			}
		}
		nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nic.Close() })
		s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addrs[gw], Name: host, Protocol: initiator.ProtocolSRP, LossTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sessions[host] = s
		v, err := s.Open(ctx, "lun0", initiator.OpenOptions{Takeover: takeover})
		if err != nil {
			t.Fatalf("%s: open lun0 on gateway %d (takeover %v): %v", host, gw, takeover, err)
		}
		return v
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	is := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
	}
	holds := func(what string, v *initiator.Volume, key uint64) {
		t.Helper()
		rep, err := v.Reservations().Report(ctx)
		must(what, err)
		if rep.HolderKey != key || rep.Type != initiator.WriteExclusive {
			t.Fatalf("%s: %+v, want key %#x holding write-exclusive", what, rep, key)
		}
	}
	buf := make([]byte, 4096)

	x := open("hostX", 0, true)
	if x.Standby() {
		t.Fatal("lun0 standby on the first gateway after X's SET TARGET PORT GROUPS")
	}
	must("X registers", x.Reservations().Register(ctx, 0, 0xa))
	must("X reserves", x.Reservations().Reserve(ctx, 0xa, initiator.WriteExclusive))
	_, err := x.WriteAtContext(ctx, buf, 0)
	must("X writes", err)

	y := open("hostY", 1, false)
	if !y.Standby() {
		t.Fatal("lun0 active on the second gateway")
	}
	is("Y registers through the standby gateway", y.Reservations().Register(ctx, 0, 0xb), initiator.ErrStandby)
	holds("Y's report through the standby gateway", y, 0xa)

	y = open("hostY", 1, true)
	if y.Standby() {
		t.Fatal("lun0 standby on the second gateway after Y's SET TARGET PORT GROUPS")
	}
	_, err = y.WriteAtContext(ctx, buf, 4096)
	is("Y's write through the gateway that took the volume over", err, initiator.ErrReservationConflict)
	_, err = y.ReadAtContext(ctx, buf, 0)
	must("Y reads (Write Exclusive lets it)", err)
	holds("Y's report through the active gateway", y, 0xa)
	must("Y registers", y.Reservations().Register(ctx, 0, 0xb))
	must("Y preempts X", y.Reservations().Preempt(ctx, 0xb, 0xa, initiator.WriteExclusive, false))
	_, err = y.WriteAtContext(ctx, buf, 4096)
	must("Y writes, holding the reservation", err)

	_, err = x.WriteAtContext(ctx, buf, 0)
	is("X's write through the fenced gateway", err, initiator.ErrStandby)
	gws[1].Kill(t) // what it acknowledged is with the image, not in it
	x = open("hostX", 0, true)
	_, err = x.WriteAtContext(ctx, buf, 0)
	is("X's write after it took the volume back", err, initiator.ErrReservationConflict)
	holds("X's report through the first gateway again", x, 0xb)
}
