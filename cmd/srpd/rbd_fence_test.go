//go:build ceph && pacific

package main

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDFenceWatch: a gateway whose lock another gateway breaks hears
// it from the cluster (librbd's update watch) with no request of its
// own. A host has vol0 open on the first srpd, idle; another host takes
// it over through the second; the first reconnects and stands by (srpd
// status), and its idle host is told so by a path notice. Without the
// watch the first srpd said active, and its host heard nothing, until a
// request failed. (The multipath host of gatewayPair moves to the second
// gateway too, and closes its handle on the first: the idle host's
// handle is what keeps the volume open there.)
func TestRBDFenceWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := gatewayPair(t, ctx, initiator.MultipathConfig{})
	open := func(i int, host string, opts initiator.OpenOptions) *initiator.Volume {
		v, err := p.hostOpen(ctx, t, i, host, opts)
		if err != nil {
			t.Fatalf("%s: open on gateway %d: %v", host, i, err)
		}
		return v
	}
	told := make(chan bool, 4)
	idle := open(0, "idle-host", initiator.OpenOptions{OnPathState: func(standby bool) { told <- standby }})
	if idle.Standby() {
		t.Fatal("the idle host's open on the first gateway answered standby")
	}
	if s := p.pathState(t, p.gws[0]); s != "active" {
		t.Fatalf("first gateway: vol0 %q, want active", s)
	}

	took := time.Now()
	open(1, "other-host", initiator.OpenOptions{Takeover: true})
	t.Logf("takeover through the second gateway took %v", time.Since(took).Round(time.Millisecond))
	select {
	case standby := <-told:
		if !standby {
			t.Fatal("the idle host was told its path is active")
		}
		t.Logf("the idle host was told standby %v after the takeover began", time.Since(took).Round(time.Millisecond))
	case <-ctx.Done():
		t.Fatal("the idle host was never told that its gateway lost the volume")
	}
	if s := p.pathState(t, p.gws[0]); s != "standby" {
		t.Fatalf("first gateway after the takeover, with no I/O of its own: vol0 %q, want standby (fenced, heard from the cluster, reconnected)", s)
	}
}

// pathState is vol0's path state at gateway d (srpd status).
func (p *pair) pathState(t *testing.T, d *e2etest.Daemon) string {
	t.Helper()
	return gwPathState(t, p.srpd, d)
}

// gwPathState is vol0's path state at gateway d, asked with the srpd
// binary srpd (srpd status).
func gwPathState(t *testing.T, srpd string, d *e2etest.Daemon) string {
	t.Helper()
	var st admin.Status
	if err := json.Unmarshal([]byte(e2etest.MustRun(t, srpd, "status", "--data", d.Data, "--json").Stdout), &st); err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Name == "vol0" {
			return v.PathState
		}
	}
	return ""
}

// TestRBDLoneSurvivor: the standby srpd is SIGKILLed, then the active
// one's lock is broken from outside (rbd lock rm, as a gateway that broke
// it and died before it took the lock would leave it), so the only
// gateway left is the fenced one. It hears of it, reconnects and stands
// by; the multipath host, its other path refused, asks it to take the
// volume back and goes on, and every write it had acknowledged reads
// back. While a fenced srpd stayed fenced until restarted, the volume was
// out of service here until someone restarted it.
func TestRBDLoneSurvivor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := gatewayPair(t, ctx, initiator.MultipathConfig{})
	const blocks = 64
	buf := make([]byte, 4096)
	write := func(gen uint32) {
		t.Helper()
		for lba := range blocks {
			stamp(buf, uint64(lba), gen)
			if _, err := p.mv.WriteAtContext(ctx, buf, int64(lba)*4096); err != nil {
				t.Fatalf("write of generation %d at %d: %v", gen, lba, err)
			}
		}
		if err := p.mv.Flush(ctx); err != nil {
			t.Fatalf("flush of generation %d: %v", gen, err)
		}
	}
	write(1)
	p.gws[1].Kill(t)

	var locks []struct{ ID, Locker string }
	if err := json.Unmarshal(rbdToolOutput(t, p.conf, "lock", "ls", "--format", "json", p.image), &locks); err != nil || len(locks) != 1 {
		t.Fatalf("rbd lock ls %s: %+v, %v; want one lock, the first gateway's", p.image, locks, err)
	}
	rbdToolOutput(t, p.conf, "lock", "rm", p.image, locks[0].ID, locks[0].Locker)
	t.Logf("the first gateway's lock (%s, %s) broken by rbd lock rm", locks[0].ID, locks[0].Locker)

	start := time.Now()
	write(2)
	t.Logf("generation 2 written and flushed in %v, through %s (the first gateway is %s); %d failovers",
		time.Since(start).Round(time.Millisecond), p.mv.Path(), p.addrs[0], p.mv.Failovers())
	if p.mv.Path() != p.addrs[0] {
		t.Fatalf("the multipath volume is on %s, want the surviving gateway %s", p.mv.Path(), p.addrs[0])
	}
	if s := p.pathState(t, p.gws[0]); s != "active" {
		t.Fatalf("the surviving gateway after the host's takeover: vol0 %q, want active", s)
	}
	gens := make([]uint32, blocks)
	for i := range gens {
		gens[i] = 2
	}
	verifyStamps(t, ctx, p.mv, gens)
}

// TestRBDReconnectKilled: a gateway is SIGKILLed while it replaces its
// fenced client. The multipath host writes stamped blocks at QD8
// through the first gateway; another host takes vol0 over through the
// second, which blocklists the first's client; the first hears it
// (librbd's watch) and reconnects: a new client connects to the
// cluster, opens the image and takes the handles over. It is killed at
// a moment drawn each run: during the takeover (before or after its
// lock is broken) or 0-100 ms after it (before, during or after its
// reconnect). It is a race with the cluster, which no seed replays: the
// moment and the state changes it had logged are logged. Whatever it left behind (a
// half-made client, a watch the OSD has yet to time out), the takeover
// succeeds, the host's writes go on through the second gateway; the
// first, restarted, is not active, and takes vol0 back for a third host
// through one more lock break; the host follows, and every write it had
// acknowledged reads back.
func TestRBDReconnectKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := gatewayPair(t, ctx, initiator.MultipathConfig{})
	// takeover opens vol0 with a takeover through gateway i as host.
	takeover := func(i int, host string) error {
		v, err := p.hostOpen(ctx, t, i, host, initiator.OpenOptions{Takeover: true})
		if err == nil && v.Standby() {
			err = errors.New("answered standby")
		}
		return err
	}
	if p.mv.Path() != p.addrs[0] {
		t.Fatalf("the host opened vol0 on %s, want the first gateway %s", p.mv.Path(), p.addrs[0])
	}
	w := startStampWriters(ctx, p.mv, 8, 16, 16, nil)
	defer w.halt()
	w.more(t, "before the takeover", 200)

	// Half the runs kill it while the takeover runs (its lock not yet
	// broken, or broken and not yet heard of), half 0-100 ms after the
	// takeover returned, when it reconnects (it has logged standby
	// once the reconnect is done).
	during := rand.IntN(2) == 0
	took := make(chan error, 1)
	began := time.Now()
	var tookFor time.Duration
	go func() {
		err := takeover(1, "other-host")
		tookFor = time.Since(began)
		took <- err
	}()
	var err error
	if during {
		time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
	} else {
		err = <-took
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
	}
	killed := time.Since(began)
	p.gws[0].Kill(t)
	if during {
		err = <-took
	}
	if err != nil {
		t.Fatalf("other-host: takeover through the second gateway: %v", err)
	}
	var states []string
	for _, l := range strings.Split(p.gws[0].Log(), "\n") {
		if _, st, ok := strings.Cut(l, `msg="volume path state changed" volume=vol0 `); ok {
			states = append(states, st)
		}
	}
	t.Logf("the first gateway killed %v after the takeover began, which took %v; its state changes: %v",
		killed.Round(time.Millisecond), tookFor.Round(time.Millisecond), states)

	w.more(t, "through the second gateway after the kill", 200)
	if p.mv.Path() != p.addrs[1] {
		t.Fatalf("the host writes through %s, want the second gateway %s", p.mv.Path(), p.addrs[1])
	}
	p.gws[0] = p.start(0)
	if s := p.pathState(t, p.gws[0]); s == "active" {
		t.Fatal("the restarted first gateway says vol0 is active while the second holds its lock")
	}
	if err := takeover(0, "third-host"); err != nil {
		t.Fatalf("third-host: takeover through the restarted first gateway: %v", err)
	}
	w.more(t, "after the takeover back", 200)
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	if p.mv.Path() != p.addrs[0] {
		t.Fatalf("after the takeover back the host writes through %s, want %s", p.mv.Path(), p.addrs[0])
	}
	t.Logf("%d writes acknowledged, %d failovers", w.acks.Load(), p.mv.Failovers())
	verifyStamps(t, ctx, p.mv, w.gens)
}

// hostOpen dials gateway i as host, over a NIC of its own, and opens
// vol0 there with opts; NIC, session and volume close when the test
// ends. It does not fail t: it may run on a goroutine of the test's.
func (p *pair) hostOpen(ctx context.Context, t *testing.T, i int, host string, opts initiator.OpenOptions) (*initiator.Volume, error) {
	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { nic.Close() }) // after the session's and volume's
	s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: p.addrs[i], Name: host})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Open(ctx, "vol0", opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { v.Close() })
	return v, nil
}
