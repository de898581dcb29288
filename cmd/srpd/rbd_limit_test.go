//go:build ceph && pacific

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDBreakLimit: two hosts that each reach one gateway only (an
// asymmetric partition) take vol0 back and forth, each opening it with
// a takeover in turn, through two srpd started with --break-limit 2/1m.
// The first open takes the free lock; then each gateway breaks the lock
// twice, and from then on a takeover through the gateway that does not
// hold the lock fails, saying why, while the gateway that serves goes
// on serving (its own host's takeover is a no-op). A third srpd without
// the bound takes the volume over at once.
func TestRBDBreakLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, srpd, args := rbdGatewaySetup(t)
	dir := t.TempDir()
	addrs := []string{e2etest.FreeAddr(t), e2etest.FreeAddr(t), e2etest.FreeAddr(t)}
	limited := append(append([]string{}, args...), "--break-limit", "2/1m")
	gws := []*e2etest.Daemon{
		e2etest.StartDaemon(t, srpd, filepath.Join(dir, "gw0"), addrs[0], e2etest.FreeAddr(t), limited...),
		e2etest.StartDaemon(t, srpd, filepath.Join(dir, "gw1"), addrs[1], e2etest.FreeAddr(t), limited...),
	}
	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	// open opens vol0 on gateway i as host, with a takeover.
	open := func(i int, host string) (*initiator.Volume, error) {
		t.Helper()
		s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addrs[i], Name: host})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		v, err := s.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
		if err == nil {
			t.Cleanup(func() { v.Close() })
		}
		return v, err
	}
	blk := make([]byte, 4096)
	// Rounds 0-4 are served (the first takes the free lock), 5 and 7
	// are past the bound of gateway 1 (it broke the lock in rounds 1
	// and 3), 6 asks gateway 0, which serves already.
	for round := range 8 {
		i := round % 2
		host := fmt.Sprintf("host-%c", 'a'+i)
		v, err := open(i, host)
		wantRefused := round == 5 || round == 7
		switch {
		case wantRefused && (err == nil || !strings.Contains(err.Error(), "not breaking the lock again")):
			t.Fatalf("round %d: %s's takeover through gateway %d past the bound: %v; want refused, saying why", round, host, i, err)
		case !wantRefused && err != nil:
			t.Fatalf("round %d: %s's takeover through gateway %d: %v", round, host, i, err)
		case !wantRefused:
			if v.Standby() {
				t.Fatalf("round %d: %s's takeover through gateway %d left it standby", round, host, i)
			}
			if _, err := v.WriteAtContext(ctx, blk, 0); err != nil {
				t.Fatalf("round %d: %s's write through gateway %d: %v", round, host, i, err)
			}
		}
		states := [2]string{gwPathState(t, srpd, gws[0]), gwPathState(t, srpd, gws[1])}
		if (states[0] == "active") == (states[1] == "active") {
			t.Fatalf("round %d: gateways say %v; want exactly one active", round, states)
		}
		t.Logf("round %d: %s's takeover through gateway %d: %v; gateways %v", round, host, i, err, states)
	}

	// Each gateway's metrics tell the story: two breaks each; the
	// second refused twice and fenced twice.
	for i, want := range [][]string{
		{`srpd_gateway_lock_breaks_total{volume="vol0"} 2`, `srpd_gateway_takeovers_refused_total{volume="vol0"} 0`, `srpd_gateway_path_state{state="active",volume="vol0"} 1`},
		{`srpd_gateway_lock_breaks_total{volume="vol0"} 2`, `srpd_gateway_takeovers_refused_total{volume="vol0"} 2`, `srpd_gateway_fencings_total{volume="vol0"} 2`},
	} {
		resp, err := http.Get("http://" + gws[i].Metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(body), w+"\n") {
				t.Errorf("gateway %d's metrics lack %s:\n%s", i, w, grepLines(string(body), "srpd_gateway_"))
			}
		}
	}

	// A gateway without the bound takes it over at once.
	free := e2etest.StartDaemon(t, srpd, filepath.Join(dir, "gw2"), addrs[2], "", args...)
	if v, err := open(2, "host-c"); err != nil || v.Standby() || gwPathState(t, srpd, free) != "active" {
		t.Fatalf("a takeover through a gateway without the bound: %v", err)
	}
}

// grepLines returns the lines of s that start with prefix.
func grepLines(s, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
