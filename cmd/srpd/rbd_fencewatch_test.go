//go:build ceph && pacific

package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDFenceWatch: a gateway whose lock another gateway breaks hears
// it from the cluster (librbd's update watch) with no request of its
// own: another host takes the volume over through the second srpd while
// the first is idle, and the first reconnects and stands by (srpd
// status), and the multipath host that had it open there moves to the
// second on the path notice alone, before any I/O of its. Without the
// watch the first srpd would say active until a request failed.
func TestRBDFenceWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, srpd, _ := rbdGatewaySetup(t)
	addrs, gws, _, mv := gatewayPair(t, ctx, initiator.MultipathConfig{})
	buf := make([]byte, 4096)
	if _, err := mv.WriteAtContext(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	if mv.Path() != addrs[0] {
		t.Fatalf("the multipath volume is on %s, want the first gateway %s", mv.Path(), addrs[0])
	}
	pathState := func(d *e2etest.Daemon) string {
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
	if s := pathState(gws[0]); s != "active" {
		t.Fatalf("first gateway: vol0 %q, want active", s)
	}

	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	defer nic.Close()
	s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addrs[1], Name: "other-host"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	took := time.Now()
	v, err := s.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
	if err != nil {
		t.Fatalf("takeover through the second gateway: %v", err)
	}
	defer v.Close()
	t.Logf("takeover through the second gateway took %v", time.Since(took).Round(time.Millisecond))

	var first string
	for first = pathState(gws[0]); first != "standby" && ctx.Err() == nil; first = pathState(gws[0]) {
		time.Sleep(100 * time.Millisecond)
	}
	if first != "standby" {
		t.Fatalf("first gateway after the takeover, with no I/O of its own: vol0 %q, want standby (fenced, heard from the cluster, reconnected)", first)
	}
	t.Logf("the first gateway stood by %v after the takeover began", time.Since(took).Round(time.Millisecond))
	for mv.Path() != addrs[1] && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if mv.Path() != addrs[1] {
		t.Fatalf("the multipath host stayed on %s after its path's notice", mv.Path())
	}
	if _, err := mv.WriteAtContext(ctx, buf, 4096); err != nil {
		t.Fatalf("the multipath host's write on the second gateway: %v", err)
	}
}
