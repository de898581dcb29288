package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestSlowDestroyCLI: srpd over a device that takes ten minutes to
// destroy each QP (--provider-option fault-destroylatency; rxe's destroy
// waited 9 minutes for references on Linux 6.12, docs/performance.md).
// srpc runs one after another, and one SIGKILLed mid-import, are each
// served while the QPs of those before are still being destroyed; the
// data reads back; and SIGTERM stops srpd within its shutdown timeout,
// the store flushed, without waiting for the destroys.
func TestSlowDestroyCLI(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	data := dir + "/data"
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, data, addr, "", "--provider-option", "fault-destroylatency=10m",
		"--shutdown-timeout", "2s", "--default-volume-size", "16MiB")
	buf := importExport(t, srpc, addr, dir, 1<<20)

	imp := startImport(t, srpc, "--target", addr, "--name", "host-k", "vol0", "-")
	if _, err := imp.stdin.Write(buf[:64<<10]); err != nil {
		t.Fatal(err)
	}
	waitSession(t, srpd, data, "host-k")
	imp.Kill(t)
	// Another srpc, a new process: served at once.
	importExport(t, srpc, addr, dir, 1<<20)

	start := time.Now()
	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM, with QP destroys under way:\n%s", code, d.Log())
	}
	t.Logf("srpd stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(d.Log(), "the store is flushed") {
		t.Fatalf("srpd did not flush its store on SIGTERM:\n%s", d.Log())
	}
	// The shutdown's warning names the device's destroys, not I/O.
	if !strings.Contains(d.Log(), "0 connections cut") && !strings.Contains(d.Log(), "the device still destroying the QPs") {
		t.Errorf("srpd's shutdown blamed something other than the QP destroys:\n%s", d.Log())
	}
	e2etest.StartDaemon(t, srpd, data, addr, "")
	out := dir + "/after.img"
	e2etest.MustRun(t, srpc, "export", "--target", addr, "--length", "1048576", "vol0", out)
	if e2etest.FileSum(t, out) != e2etest.FileSum(t, dir+"/in.img") {
		t.Fatal("after the restart, vol0 differs from the last import")
	}
}
