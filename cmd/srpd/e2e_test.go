package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
)

func TestMain(m *testing.M) { e2etest.Main(m) }

// importExport writes n random bytes to a file, imports it into vol0 of
// the srpd at addr with srpc, exports as much back and fails the test
// unless the checksums match; it returns the bytes.
func importExport(t *testing.T, srpc, addr, dir string, n int) []byte {
	t.Helper()
	img := filepath.Join(dir, "in.img")
	buf := make([]byte, n)
	rand.Read(buf)
	if err := os.WriteFile(img, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(buf)
	e2etest.MustRun(t, srpc, "import", "--target", addr, "vol0", img)
	out := filepath.Join(dir, "out.img")
	e2etest.MustRun(t, srpc, "export", "--target", addr, "--length", strconv.Itoa(n), "vol0", out)
	if e2etest.FileSum(t, out) != want {
		t.Fatal("exported image differs from the imported one")
	}
	return buf
}

// TestNewUser walks the path a new user takes: start srpd on an empty
// directory, import and export an image, create and list a volume, survive
// SIGKILL and garbage on the port, and stop cleanly on SIGTERM.
func TestNewUser(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr, metrics := e2etest.FreeAddr(t), e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, data, addr, metrics)
	if !strings.Contains(d.Log(), "created default volume") || !strings.Contains(d.Log(), "vol0") {
		t.Errorf("no log line about the default volume:\n%s", d.Log())
	}
	// Import 64 MiB of random data into vol0 and export it back.
	buf := importExport(t, srpc, addr, dir, 64<<20)
	want, out := sha256.Sum256(buf), filepath.Join(dir, "out.img")
	// A range through stdout, unaligned length.
	r := e2etest.MustRun(t, srpc, "export", "--target", addr, "--offset", "4KiB", "--length", "10000", "vol0", "-")
	if !bytes.Equal([]byte(r.Stdout), buf[4096:4096+10000]) {
		t.Fatal("export of a range to stdout differs")
	}

	// A second volume through the admin socket.
	e2etest.MustRun(t, srpd, "volume", "create", "--data", data, "--size", "256MiB", "second")
	r = e2etest.MustRun(t, srpd, "volume", "list", "--data", data)
	if !strings.Contains(r.Stdout, "second") || !strings.Contains(r.Stdout, "256 MiB") {
		t.Fatalf("volume list:\n%s", r.Stdout)
	}
	r = e2etest.MustRun(t, srpc, "list", "--target", addr)
	if !strings.Contains(r.Stdout, "second") || !strings.Contains(r.Stdout, "268435456") {
		t.Fatalf("srpc list:\n%s", r.Stdout)
	}
	r = e2etest.Run(t, nil, srpd, "volume", "create", "--data", data, "--size", "1MiB", "second")
	if r.Code != 1 || !strings.Contains(r.Stderr, "already exists") || strings.Count(r.Stderr, "\n") != 1 {
		t.Fatalf("duplicate create: exit %d, stderr %q", r.Code, r.Stderr)
	}
	r = e2etest.Run(t, nil, srpd, "volume", "create", "--data", data, "third")
	if r.Code != 2 {
		t.Fatalf("create without --size: exit %d, stderr %q", r.Code, r.Stderr)
	}

	checkMetrics(t, metrics)

	// SIGKILL, restart on the same directory: acknowledged imports survive.
	d.Kill(t)
	d = e2etest.StartDaemon(t, srpd, data, addr, "")
	if strings.Contains(d.Log(), "created default volume") {
		t.Errorf("restart created a default volume again:\n%s", d.Log())
	}
	os.Remove(out)
	e2etest.MustRun(t, srpc, "export", "--target", addr, "--length", "64MiB", "vol0", out)
	if e2etest.FileSum(t, out) != want {
		t.Fatal("after SIGKILL and restart the exported image differs")
	}

	// Garbage on the port does not hurt the daemon.
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		junk := make([]byte, 4096)
		rand.Read(junk)
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	r = e2etest.MustRun(t, srpc, "list", "--target", addr)
	if !strings.Contains(r.Stdout, "vol0") {
		t.Fatalf("srpc list after garbage:\n%s", r.Stdout)
	}

	// Status reports the counters as JSON.
	r = e2etest.MustRun(t, srpd, "status", "--data", data, "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.Stdout)
	}
	if len(st.Volumes) != 2 || st.Accepted == 0 {
		t.Errorf("status: %+v", st)
	}

	// SIGTERM: clean exit 0, then offline administration works.
	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exit %d after SIGTERM\n%s", code, d.Log())
	}
	if !strings.Contains(d.Log(), "store is flushed") {
		t.Errorf("no shutdown line:\n%s", d.Log())
	}
	r = e2etest.MustRun(t, srpd, "volume", "list", "--data", data)
	if !strings.Contains(r.Stdout, "second") {
		t.Fatalf("offline volume list:\n%s", r.Stdout)
	}
	r = e2etest.Run(t, nil, srpc, "list", "--target", addr, "--timeout", "3s")
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 {
		t.Fatalf("srpc list with srpd stopped: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

func checkMetrics(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	get := func(name string, labels map[string]string) float64 {
		f := fams[name]
		if f == nil {
			t.Fatalf("no metric %s", name)
		}
	next:
		for _, m := range f.Metric {
			for k, v := range labels {
				found := false
				for _, lp := range m.Label {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("no metric %s%v", name, labels)
		return 0
	}
	vol0 := map[string]string{"volume": "vol0"}
	if n := get("srpd_volume_bytes_total", map[string]string{"volume": "vol0", "op": "write"}); n < 64<<20 {
		t.Errorf("vol0 write bytes %v, want >= 64 MiB", n)
	}
	if n := get("srpd_volume_ops_total", map[string]string{"volume": "vol0", "op": "flush"}); n < 1 {
		t.Errorf("vol0 flushes %v", n)
	}
	if n := get("srpd_volume_latency_seconds", vol0); n < 64 {
		t.Errorf("vol0 latency samples %v", n)
	}
	get("srpd_volume_errors_total", map[string]string{"volume": "vol0", "op": "read"})
	get("srpd_connections", nil)
	get("srpd_credits_in_use", nil)
	if n := get("srpd_connections_accepted_total", nil); n < 2 {
		t.Errorf("accepted %v", n)
	}
	if n := get("srpd_volume_size_bytes", map[string]string{"volume": "second"}); n != 256<<20 {
		t.Errorf("size of second %v", n)
	}
	if f := fams["srpd_volume_latency_seconds"]; f.GetType().String() != "HISTOGRAM" {
		t.Errorf("latency type %v", f.GetType())
	}
}
