package main

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestSRPWriteCacheLost: an SRP host cannot count the target's unflushed
// writes as gosrp's initiator does, so srpd marks a volume dirty (a file
// in its data directory) before it acknowledges the first write after a
// flush. An import over SRP is cut off mid-stream (nothing flushed) and
// srpd SIGKILLed: the mark is there. srpd started again tells the same
// host, once: its next import's final flush fails with the lost write
// cache, the one after succeeds. A clean stop leaves no mark. The file
// backend, whose writes are in the kernel when acknowledged, loses
// nothing when srpd is killed: its mark of the running boot is dropped
// and nothing is reported. The memory backend loses everything at any
// exit, flushed or not, clean or not: its mark outlives flushes and
// clean stops, and the restart after a clean stop reports the loss too
// (before, an import over SRP across a SIGKILL exited 0 with the volume
// empty).
func TestSRPWriteCacheLost(t *testing.T) {
	for _, tc := range []struct {
		backend        string
		lost, volatile bool
	}{{"pebble", true, false}, {"file", false, false}, {"memory", true, true}} {
		t.Run(tc.backend, func(t *testing.T) { srpWriteCacheLost(t, tc.backend, tc.lost, tc.volatile) })
	}
}

func srpWriteCacheLost(t *testing.T, backend string, lost, volatile bool) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	data, addr := filepath.Join(dir, "data"), e2etest.FreeAddr(t)
	start := func() *e2etest.Daemon {
		return e2etest.StartDaemon(t, srpd, data, addr, "", "--backend", backend, "--default-volume-size", "16MiB")
	}
	marks := func() []string {
		ents, _ := os.ReadDir(filepath.Join(data, "dirty"))
		var names []string
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".tmp") {
				continue // a mark being written
			}
			b, _ := os.ReadFile(filepath.Join(data, "dirty", e.Name()))
			name, _, _ := strings.Cut(string(b), "\n") // then the boot ID
			names = append(names, name)
		}
		return names
	}
	conn := []string{"--target", addr, "--name", "srp-h", "--protocol", "srp", "--timeout", "10s"}
	d := start()
	p, stdin := e2etest.StartPiped(t, srpc, append(append([]string{"import"}, conn...), "lun0", "-")...)
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	if _, err := stdin.Write(chunk); err != nil {
		t.Fatal(err)
	}
	p.WaitFor(t, 30*time.Second, "a dirty mark", func() bool { return len(marks()) > 0 })
	if m := marks(); len(m) != 1 || m[0] != "vol0" {
		t.Fatalf("marks while the import writes: %q, want vol0", m)
	}
	t0 := time.Now()
	d.Kill(t)
	p.Kill(t)
	t.Logf("killed in %v", time.Since(t0).Round(time.Millisecond))
	if m := marks(); len(m) != 1 {
		t.Fatalf("marks after SIGKILL: %q, want vol0", m)
	}

	d = start()
	img := filepath.Join(dir, "img")
	os.WriteFile(img, chunk, 0o644)
	t0 = time.Now()
	r := e2etest.Run(t, nil, srpc, append(append([]string{"import"}, conn...), "lun0", img)...)
	t.Logf("the first import after the restart: exit %d in %v: %s", r.Code, time.Since(t0).Round(time.Millisecond), strings.TrimSpace(r.Stderr))
	switch {
	case lost && (r.Code != 1 || !strings.Contains(r.Stderr, "lost writes it had acknowledged")):
		t.Fatalf("the first import after the restart: exit %d, stderr %q; want 1 and the lost write cache", r.Code, r.Stderr)
	case !lost && r.Code != 0:
		t.Fatalf("the first import after the restart: exit %d, stderr %q; want 0: the file backend lost nothing", r.Code, r.Stderr)
	}
	e2etest.MustRun(t, srpc, append(append([]string{"import"}, conn...), "lun0", img)...)
	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, d.Log())
	}
	if m := marks(); !volatile && len(m) != 0 {
		t.Fatalf("marks after a clean stop: %q", m)
	}
	if !volatile {
		return
	}
	if m := marks(); len(m) != 1 {
		t.Fatalf("marks of a memory volume after a clean stop: %q, want vol0: the stop lost it all", m)
	}
	start()
	r = e2etest.Run(t, nil, srpc, append(append([]string{"import"}, conn...), "lun0", img)...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "lost writes it had acknowledged") {
		t.Fatalf("the first import after a clean restart of a memory volume: exit %d, stderr %q; want 1 and the loss", r.Code, r.Stderr)
	}
}
