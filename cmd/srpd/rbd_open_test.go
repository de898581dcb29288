//go:build ceph && pacific

package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
)

// TestRBDSrpcOpenStalled: srpc asked to export a volume while the
// cluster's OSD is stopped (SIGSTOP), so that srpd's open of the image
// hangs in librbd. srpc must give up after its --timeout (3 s, under
// srpd's 5 s OpenWait, before any answer) with one line that says the
// volume did not open within it, and exit non-zero; a second srpc with
// a --timeout past OpenWait, which hears NOT READY, must end the same
// way, and so must a third given two gateways (srpc's multipath path),
// both hung. Once the OSD resumes, srpd serves the volume to the next
// srpc at once: the opens it abandoned did not wedge it. Before, srpc
// waited for the unanswered OPEN as it closed (5.0 s for the first,
// 10.1 s for the second); the first said only "context deadline
// exceeded", the third gave a paragraph of path errors.
func TestRBDSrpcOpenStalled(t *testing.T) {
	pid := testenv.CephOSD(t)
	_, srpd, args := rbdGatewaySetup(t)
	_, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data"), addr, "", args...)
	addr2 := e2etest.FreeAddr(t)
	e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data2"), addr2, "", args...)
	out := filepath.Join(dir, "out.img")
	export := func(timeout string, more ...string) e2etest.Result {
		return e2etest.Run(t, nil, srpc, append([]string{"export", "--quiet", "--target", addr, "--timeout", timeout, "--length", "1MiB", "vol0", out}, more...)...)
	}
	if r := export("30s"); r.Code != 0 {
		t.Fatalf("srpc export before the stop: exit %d: %s", r.Code, r.Stderr)
	}

	resume := stopOSD(t, pid)
	for i, timeout := range []time.Duration{3 * time.Second, 7 * time.Second, 3 * time.Second} {
		var more []string
		if i == 2 {
			more = []string{"--target", addr2} // two gateways: srpc's multipath path
		}
		start := time.Now()
		r := export(timeout.String(), more...)
		took := time.Since(start)
		msg := strings.TrimSpace(r.Stderr)
		t.Logf("srpc export --timeout %v with the OSD stopped: exit %d after %v: %s", timeout, r.Code, took.Round(time.Millisecond), msg)
		if r.Code == 0 {
			t.Fatalf("srpc export exited 0 with the OSD stopped")
		}
		if took > timeout+2*time.Second {
			t.Errorf("srpc took %v to give up, want about its --timeout %v", took, timeout)
		}
		if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, `volume "vol0" did not open within --timeout`) {
			t.Errorf("srpc's error is not one line saying the volume did not open within --timeout:\n%s", r.Stderr)
		}
	}
	resume()
	start := time.Now()
	if r := export("30s"); r.Code != 0 {
		t.Fatalf("srpc export after the OSD resumed: exit %d: %s\nsrpd:\n%s", r.Code, r.Stderr, d.Log())
	}
	t.Logf("srpc export after the OSD resumed took %v", time.Since(start).Round(time.Millisecond))
}
