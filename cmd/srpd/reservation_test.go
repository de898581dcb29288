package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestReservationSurvivesRestart: a registration and a Write Exclusive
// reservation that srpd acknowledged survive a SIGKILL of srpd and its
// restart on the same data directory: afterwards another host's write is
// still refused with ErrReservationConflict, the report shows the same
// holder, key and generation, and a preempt made after the restart
// survives the next one. Without the state file the restarted srpd has
// forgotten the reservation and the other host writes.
func TestReservationSurvivesRestart(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, data, addr, "", "--default-volume-size", "8MiB")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(host string) (*initiator.Session, *initiator.Volume) {
		t.Helper()
		return dialOpen(t, ctx, addr, host, initiator.OpenOptions{})
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sa, a := open("hostA")
	must(a.Reservations().Register(ctx, 0, 0xa))
	must(a.Reservations().Reserve(ctx, 0xa, initiator.WriteExclusive))
	sa.Close()

	d.Kill(t)
	d = e2etest.StartDaemon(t, srpd, data, addr, "")

	sb, b := open("hostB")
	buf := make([]byte, 4096)
	if _, err := b.WriteAtContext(ctx, buf, 0); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("hostB's write after the restart: %v, want ErrReservationConflict (the reservation was lost)", err)
	}
	rep, err := b.Reservations().Report(ctx)
	must(err)
	if rep.Holder != "hostA" || rep.HolderKey != 0xa || rep.Type != initiator.WriteExclusive || rep.Generation != 1 {
		t.Fatalf("report after the restart: %+v", rep)
	}
	must(b.Reservations().Register(ctx, 0, 0xb))
	must(b.Reservations().Preempt(ctx, 0xb, 0xa, initiator.ExclusiveAccess, false))
	sb.Close()

	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, d.Log())
	}
	e2etest.StartDaemon(t, srpd, data, addr, "")
	_, a = open("hostA")
	if _, err := a.ReadAtContext(ctx, buf, 0); !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("hostA's read under hostB's exclusive-access reservation after a restart: %v", err)
	}
	rep, err = a.Reservations().Report(ctx)
	must(err)
	if rep.Holder != "hostB" || rep.Type != initiator.ExclusiveAccess || rep.Generation != 3 || len(rep.Registrants) != 1 {
		t.Fatalf("report after the second restart: %+v", rep)
	}
	// The state file is for people too: it names the holder.
	b2, err := os.ReadFile(filepath.Join(data, reservationsFile))
	if err != nil || !strings.Contains(string(b2), `"holder": "hostB"`) {
		t.Fatalf("%s: %v\n%s", reservationsFile, err, b2)
	}
}

// dialOpen logs host in to the srpd at addr over an emu NIC of its own
// and opens vol0 with opts; the session and the NIC close when the test
// ends, if the test has not closed them.
func dialOpen(t *testing.T, ctx context.Context, addr, host string, opts initiator.OpenOptions) (*initiator.Session, *initiator.Volume) {
	t.Helper()
	s := dialHost(t, ctx, addr, host)
	v, err := s.Open(ctx, "vol0", opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

// dialHost logs host in to the srpd at addr over an emu NIC of its own;
// the session and the NIC close when the test ends.
func dialHost(t *testing.T, ctx context.Context, addr, host string) *initiator.Session {
	t.Helper()
	prov, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prov.Close() })
	s, err := initiator.Dial(ctx, initiator.Config{Provider: prov, Addr: addr, Name: host, LossTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
