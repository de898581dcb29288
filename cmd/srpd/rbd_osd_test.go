//go:build ceph && pacific

package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/testenv"
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
	pid := testenv.CephOSD(t)
	cfg := initiator.MultipathConfig{}
	cfg.IOTimeout = 2 * time.Second
	p := gatewayPair(t, ctx, cfg)
	mv := p.mv

	w := startStampWriters(ctx, mv, 16, 32, 16, nil)
	stopped := false
	defer func() {
		if stopped {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		w.halt()
	}()

	w.more(t, "before the stop", 300)
	path := mv.Path()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	// What the OSD had answered before the stop may still arrive.
	time.Sleep(300 * time.Millisecond)
	before := w.acks.Load()
	time.Sleep(5 * time.Second)
	during := w.acks.Load() - before
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
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
