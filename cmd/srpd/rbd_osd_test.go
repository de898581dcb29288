//go:build ceph && pacific

package main

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/gosrp/gosrp/target"
)

// TestRBDOSDStalled: the cluster's OSD stops (SIGSTOP) for 5 s under
// QD16 writes through two gateways, longer than the initiator's
// IOTimeout (2 s here). The gateways stay up and answer pings; the
// writes and flushes in flight time out at the initiator, whose channel
// is torn down, and the initiator reconnects or fails over to the other
// gateway, whose takeover (breaking the lock) waits for the OSD too.
// Meanwhile the first gateway still has requests waiting at the OSD.
// Nothing may fail, hang or be lost: once the OSD resumes the writers
// go on, no write was acknowledged while it was stopped, both gateways
// still run, and every acknowledged write reads back with its last
// generation (a copy the first gateway held lands before the takeover's
// blocklisting or is refused by it, never after a newer write).
func TestRBDOSDStalled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid, p := osdGatewayPair(t, ctx)
	mv := p.mv

	w := startStampWriters(ctx, mv, 16, 32, 16, nil)
	defer w.halt()

	w.more(t, "before the stop", 300)
	path := mv.Path()
	resume := stopOSD(t, pid)
	defer resume() // before the writers halt: they wait for the OSD
	// What the OSD had answered before the stop may still arrive.
	time.Sleep(300 * time.Millisecond)
	before := w.acks.Load()
	time.Sleep(5 * time.Second)
	during := w.acks.Load() - before
	resume()
	resumed := time.Now()
	if during != 0 {
		t.Errorf("%d writes acknowledged while the OSD was stopped", during)
	}
	w.more(t, "after the OSD resumed", 1)
	t.Logf("first write %v after the OSD resumed; path %s before the stop, %s after; %d failovers",
		time.Since(resumed).Round(time.Millisecond), path, mv.Path(), mv.Failovers())
	w.more(t, "after the OSD resumed", 300)
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	for i, gw := range p.gws {
		select {
		case <-gw.Exited():
			t.Errorf("gateway %d exited: %v\n%s", i, gw.Err(), gw.Log())
		default:
		}
	}
	verifyStamps(t, ctx, mv, w.gens)
	t.Logf("%d writes acknowledged", w.acks.Load())
}

// TestRBDStopOSDStalled: srpd asked to stop (SIGTERM) while the OSD is
// stopped under QD16 writes. The writes in flight cannot drain, and the
// store cannot flush or close while the cluster does not answer; srpd
// must still exit, bounded by its --shutdown-timeout (2 s here) for the
// drain and again for the store, saying so, and not 0.
func TestRBDStopOSDStalled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pid := testenv.CephOSD(t)
	_, srpd, args := rbdGatewaySetup(t)
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, filepath.Join(t.TempDir(), "data"), addr, "", append(args, "--shutdown-timeout", "2s")...)
	cfg := initiator.MultipathConfig{}
	cfg.LossTimeout = 5 * time.Second
	mv := openMultipath(t, ctx, cfg, []string{addr})
	w := startStampWriters(ctx, mv, 16, 32, 16, nil)
	w.more(t, "before the stop", 200)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	d.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("srpd still running 30 s after SIGTERM with the OSD stopped:\n%s", d.Log())
	}
	took := time.Since(start)
	t.Logf("srpd exited %d, %v after SIGTERM", d.ExitCode(), took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("srpd took %v to exit, want about 2 × --shutdown-timeout (2 s)", took)
	}
	if d.ExitCode() == 0 {
		t.Errorf("srpd exited 0 with its store not closed:\n%s", d.Log())
	}
	if !strings.Contains(d.Log(), "store") {
		t.Errorf("srpd does not say its store did not close:\n%s", d.Log())
	}
	syscall.Kill(pid, syscall.SIGCONT)
	w.halt() // the writes fail: the connection is gone
}

// TestRBDFullTakeover: the pool turns full (the OSD's full ratio set
// below its use) under QD16 writes through two gateways, and the active
// gateway is SIGKILLed while it is full, so that the initiator fails
// over and the other gateway takes the volume over on a full cluster.
// A full pool holds writes at the client, it does not fail them, and
// the takeover waits with them; once the ratio is back, the takeover
// completes, the writers go on without an error (their LossTimeout is
// 90 s here), and every acknowledged write reads back.
func TestRBDFullTakeover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	testenv.CephOSD(t) // not signalled: held for the cluster's exclusive lock
	cfg := initiator.MultipathConfig{}
	cfg.LossTimeout = 90 * time.Second
	p := gatewayPair(t, ctx, cfg)
	full := func(on bool) { t.Helper(); poolFull(t, p.conf, on) }
	t.Cleanup(func() { full(false) }) // the package's later tests need the space

	w := startStampWriters(ctx, p.mv, 16, 32, 16, nil)
	defer w.halt()
	w.more(t, "before the pool is full", 300)
	full(true)
	active := slices.Index(p.addrs, p.mv.Path())
	time.Sleep(time.Second) // the writes in flight reach the full pool
	before := w.acks.Load()
	p.gws[active].Kill(t)
	killed := time.Now()
	// The failover and the takeover, on the full pool. The takeover's
	// lock break and acquisition write the image's header object, so
	// they wait for room as any write does (seen here: the takeover
	// completes only once the pool is writable again).
	took := "not within 5 s"
	for time.Since(killed) < 5*time.Second {
		if p.mv.Failovers() > 0 && took[0] == 'n' {
			took = time.Since(killed).Round(time.Millisecond).String()
		}
		time.Sleep(10 * time.Millisecond)
	}
	during := w.acks.Load() - before
	full(false)
	writable := time.Now()
	w.more(t, "after the pool is writable again", 1)
	t.Logf("takeover on the full pool: %s after the kill; %d writes acknowledged while it was full; first write %v after it was writable again",
		took, during, time.Since(writable).Round(time.Millisecond))
	w.more(t, "after the pool is writable again", 300)
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	if slices.Index(p.addrs, p.mv.Path()) == active {
		t.Errorf("still on the killed gateway %d", active)
	}
	verifyStamps(t, ctx, p.mv, w.gens)
}

// poolFull makes the cluster's pools full (the OSD's full ratio set
// below its use) or writable again, and waits up to 60 s for the pool
// list to say so.
func poolFull(t *testing.T, conf string, on bool) {
	t.Helper()
	ratios := [][2]string{{"set-nearfull-ratio", "0.85"}, {"set-backfillfull-ratio", "0.9"}, {"set-full-ratio", "0.95"}}
	if on {
		ratios = [][2]string{{"set-full-ratio", "0.001"}, {"set-backfillfull-ratio", "0.0008"}, {"set-nearfull-ratio", "0.0005"}}
	}
	for _, r := range ratios {
		cephCLI(t, "ceph", conf, "osd", r[0], r[1])
	}
	deadline := time.Now().Add(60 * time.Second)
	for strings.Contains(string(cephCLI(t, "ceph", conf, "osd", "pool", "ls", "detail")), ",full") != on {
		if time.Now().After(deadline) {
			t.Fatalf("the pool not %s 60 s after the ratios changed", map[bool]string{true: "full", false: "writable"}[on])
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRBDReservationFull: a host changes its reservation key while the
// pool is full. The change is recorded in the image (a metadata write),
// which a full pool holds at the client as it holds a data write: the
// gateway must not answer it done before the record is written, and the
// host's call must end by its deadline (4 s here), not hang. Once the
// pool is writable again the held write lands or not; either way the
// active gateway's report and the image's record agree, with the old key
// or the new, and a change asked again from whichever key is recorded
// succeeds.
func TestRBDReservationFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	testenv.CephOSD(t) // not signalled: held for the cluster's exclusive lock
	p := gatewayPair(t, ctx, initiator.MultipathConfig{})
	mv := p.mv
	if err := mv.Reservations().Register(ctx, 0, 0xa); err != nil {
		t.Fatalf("register: %v", err)
	}
	poolFull(t, p.conf, true)
	t.Cleanup(func() { poolFull(t, p.conf, false) }) // the package's later tests need the space
	cctx, ccancel := context.WithTimeout(ctx, 4*time.Second)
	start := time.Now()
	err := mv.Reservations().Register(cctx, 0xa, 0xb)
	ccancel()
	t.Logf("the key change on the full pool: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err == nil {
		t.Fatal("the key change on a full pool answered done: the record cannot have been written")
	}
	if time.Since(start) > 6*time.Second {
		t.Fatalf("the key change outlived the host's 4 s deadline by %v", time.Since(start)-4*time.Second)
	}
	poolFull(t, p.conf, false)

	// What the gateway reports and the image records agree, once the held
	// write (if it was sent) has landed: the report waits for the change.
	rep, err := mv.Reservations().Report(ctx)
	if err != nil {
		t.Fatalf("report once writable: %v", err)
	}
	rec := p.recordedReservations(t)
	if len(rep.Registrants) != 1 || len(rec.Registrations) != 1 || rep.Registrants[0].Key != rec.Registrations[0].Key ||
		rep.Generation != rec.Generation {
		t.Fatalf("the gateway reports %+v (generation %d), the image records %+v (generation %d)",
			rep.Registrants, rep.Generation, rec.Registrations, rec.Generation)
	}
	key := rep.Registrants[0].Key
	if key != 0xa && key != 0xb {
		t.Fatalf("the recorded key is %#x, want the old 0xa or the new 0xb", key)
	}
	t.Logf("after the pool is writable: key %#x recorded and reported", key)
	if key == 0xa {
		if err := mv.Reservations().Register(ctx, 0xa, 0xb); err != nil {
			t.Fatalf("the change asked again: %v", err)
		}
	}
	if rep, err := mv.Reservations().Report(ctx); err != nil || len(rep.Registrants) != 1 || rep.Registrants[0].Key != 0xb {
		t.Fatalf("report after the change: %+v, %v; want key 0xb", rep, err)
	}
}

// TestRBDStandbyReportOSDStopped: a standby gateway reads a volume's
// reservations from the image for each report (what the active gateway
// last recorded, not what this one last knew), so while the OSD is
// stopped it has nothing to answer from. Host A holds a reservation
// through the active gateway; host B asks through the standby one with
// the OSD stopped. B's report must not come back with a stale answer,
// and neither the host nor the gateway may hang: the report fails
// within the host's deadline, the standby gateway still runs, and once
// the OSD resumes a report on the same session names A.
func TestRBDStandbyReportOSDStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pid := testenv.CephOSD(t)
	gws := startGateways(t).gws
	_, a := dialOpen(t, ctx, gws[0].Addr, "hostA", initiator.OpenOptions{})
	if err := a.Reservations().Register(ctx, 0, 0xa); err != nil {
		t.Fatalf("A registers: %v", err)
	}
	if err := a.Reservations().Reserve(ctx, 0xa, initiator.WriteExclusive); err != nil {
		t.Fatalf("A reserves: %v", err)
	}
	_, b := dialOpen(t, ctx, gws[1].Addr, "hostB", initiator.OpenOptions{})
	if !b.Standby() {
		t.Fatal("the second gateway's open is not standby")
	}

	resume := stopOSD(t, pid)
	const deadline = 3 * time.Second
	rctx, rcancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	rep, err := b.Reservations().Report(rctx)
	rcancel()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("B's report through the standby gateway with the OSD stopped: %+v, want an error (nothing recorded can be read)", rep)
	}
	if took > deadline+time.Second {
		t.Errorf("B's report failed after %v, past its %v deadline", took.Round(time.Millisecond), deadline)
	}
	t.Logf("B's report with the OSD stopped: %v after %v", err, took.Round(time.Millisecond))
	resume()
	resumed := time.Now()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		rep, err = b.Reservations().Report(rctx)
		rcancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		t.Logf("B's report after the OSD resumed: %v; again", err)
	}
	if err != nil || rep.Holder != "hostA" || rep.HolderKey != 0xa {
		t.Fatalf("B's report after the OSD resumed: %+v, %v; want hostA holding", rep, err)
	}
	t.Logf("B's report named hostA %v after the OSD resumed", time.Since(resumed).Round(time.Millisecond))
	for i, gw := range gws {
		select {
		case <-gw.Exited():
			t.Errorf("gateway %d exited: %v\n%s", i, gw.Err(), gw.Log())
		default:
		}
	}
}

// TestRBDReservationChangeKilled: the active gateway is SIGKILLed while
// a host's reservation change is on its way to the image. The OSD is
// stopped first, so the gateway's metadata write waits there when the
// gateway dies; the OSD then resumes and the host's Multipath fails
// over, the other gateway breaking the dead one's lock (blocklisting
// it) before it reads the reservations and serves. The dead gateway's
// write lands before the read or not at all, never after it: whatever
// the re-issued change answers (done, or a conflict because the first
// try landed and the old key is gone), the report of the gateway now
// active and the record in the image must agree, with the new key.
func TestRBDReservationChangeKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pid, p := osdGatewayPair(t, ctx)
	mv := p.mv
	if err := mv.Reservations().Register(ctx, 0, 0xa); err != nil {
		t.Fatalf("register: %v", err)
	}
	active := slices.Index(p.addrs, mv.Path())
	if active < 0 {
		t.Fatalf("no active path (%q)", mv.Path())
	}

	resume := stopOSD(t, pid)
	changed := make(chan error, 1)
	go func() { changed <- mv.Reservations().Register(ctx, 0xa, 0xb) }()
	time.Sleep(500 * time.Millisecond) // the change waits at the OSD
	// librbd reads the image's header before it writes the record, so
	// the write leaves only once the OSD answers. The gateway dies
	// before the OSD resumes (its write never leaves) or a moment
	// after: before, while or after its write lands, or after it
	// answered. The moment is drawn each run: it is a race with the
	// cluster, which no seed replays; the branch taken is logged.
	wait := time.Duration(rand.IntN(20)-5) * time.Millisecond
	t.Logf("the gateway dies %v after the OSD resumes", wait)
	if wait < 0 {
		p.gws[active].Kill(t)
	}
	resume()
	if wait >= 0 {
		time.Sleep(wait)
		p.gws[active].Kill(t)
	}
	err := <-changed
	if err != nil && !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("the change re-issued after the failover: %v, want done or a reservation conflict", err)
	}
	t.Logf("the change re-issued after %d failovers: %v", mv.Failovers(), err)
	rep, rerr := mv.Reservations().Report(ctx)
	if rerr != nil {
		t.Fatalf("report: %v", rerr)
	}
	rec := p.recordedReservations(t)
	want := []initiator.Registrant{{Initiator: "host", Key: 0xb}}
	var recorded []initiator.Registrant
	for _, r := range rec.Registrations {
		recorded = append(recorded, initiator.Registrant{Initiator: r.Initiator, Key: r.Key})
	}
	if !slices.Equal(rep.Registrants, want) || !slices.Equal(recorded, want) || rep.Generation != rec.Generation {
		t.Fatalf("after the failover the gateway reports %+v (generation %d), the image records %+v (generation %d); want both %+v",
			rep.Registrants, rep.Generation, recorded, rec.Generation, want)
	}
}

// stopOSD stops the OSD whose PID is pid (testenv.CephOSD's) with
// SIGSTOP and returns what resumes it (SIGCONT); the OSD is resumed
// when the test ends if the test has not.
func stopOSD(t *testing.T, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume the OSD: %v", err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// osdGatewayPair is a gatewayPair for a test that stops or kills the
// OSD (its PID, testenv.CephOSD's), with an IOTimeout of 2 s, shorter
// than the OSD's stops.
func osdGatewayPair(t *testing.T, ctx context.Context) (pid int, p *pair) {
	t.Helper()
	pid = testenv.CephOSD(t)
	cfg := initiator.MultipathConfig{}
	cfg.IOTimeout = 2 * time.Second
	return pid, gatewayPair(t, ctx, cfg)
}

// recordedReservations reads the reservations recorded with the image
// (rbd image-meta get).
func (p *pair) recordedReservations(t *testing.T) target.ReservationState {
	t.Helper()
	var rec target.ReservationState
	raw := rbdToolOutput(t, p.conf, "image-meta", "get", p.image, reservationsKey)
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("the image's record %q: %v", raw, err)
	}
	return rec
}
