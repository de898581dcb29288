package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/servetest"
)

// TestShrinkRefusedWhileOpen: srpd refuses to shrink a volume a session
// has open, with a one-line error that says how many sessions, unless
// forced; the channels of one session count once; a grow is never
// refused, and a session on a snapshot does not
// hold the volume (the snapshot's size does not change with it). Before,
// the shrink was accepted and the session's reads past the new end
// failed as "medium error".
func TestShrinkRefusedWhileOpen(t *testing.T) {
	r := servetest.NewRig(t)
	svc := &service{store: r.Store, tgt: r.Target}
	if _, err := svc.CreateVolume(admin.CreateVolume{Name: "v", Size: 64 << 20, BlockSize: 4096}); err != nil {
		t.Fatal(err)
	}
	shrink := func(size int64, force bool) error {
		_, err := svc.ResizeVolume("v", admin.ResizeVolume{Size: size, Force: force})
		return err
	}
	if _, err := svc.CreateSnapshot("v", "s"); err != nil {
		t.Fatal(err)
	}
	r.Open(t, "v@s", initiator.Config{})
	if err := shrink(60<<20, false); err != nil {
		t.Fatalf("shrink with only a snapshot open: %v", err)
	}
	_, v1 := r.Open(t, "v", initiator.Config{})
	_, v2 := r.Open(t, "v", initiator.Config{Channels: 2}) // one session over two connections
	err := shrink(32<<20, false)
	if !errors.Is(err, admin.ErrBusy) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "2 sessions have it open") ||
		!strings.Contains(err.Error(), "--force") {
		t.Fatalf("shrink under two sessions: %v, want a one-line busy error naming 2 sessions and --force", err)
	}
	t.Log(err)
	if err := shrink(80<<20, false); err != nil {
		t.Fatalf("grow under two sessions: %v", err)
	}
	// The open session learns the grow with its next command.
	if _, err := v2.ReadAt(make([]byte, 4096), 0); err != nil || v2.Size() != 80<<20 {
		t.Fatalf("session after the grow: size %d, read %v; want 80 MiB", v2.Size(), err)
	}
	if err := v1.Close(); err != nil {
		t.Fatal(err)
	}
	err = shrink(32<<20, false)
	if !errors.Is(err, admin.ErrBusy) || !strings.Contains(err.Error(), "1 session has it open") {
		t.Fatalf("shrink under one session: %v", err)
	}
	if err := shrink(32<<20, true); err != nil {
		t.Fatalf("forced shrink: %v", err)
	}
	if v, err := svc.volume("v"); err != nil || v.Size != 32<<20 {
		t.Fatalf("after the forced shrink: %+v, %v", v, err)
	}
}

// startSrpd skips a -short run; otherwise it builds the binaries and
// starts srpd with extra flags on a fresh data directory and a free
// address, which it returns with the binaries' paths.
func startSrpd(t *testing.T, extra ...string) (srpd, srpc, data, addr string) {
	t.Helper()
	srpd, srpc = e2etest.Binaries(t)
	data = filepath.Join(t.TempDir(), "data")
	addr = e2etest.FreeAddr(t)
	e2etest.StartDaemon(t, srpd, data, addr, "", extra...)
	return srpd, srpc, data, addr
}

// TestResizeUnderSessionCLI is TestShrinkRefusedWhileOpen as a user meets
// it: with `srpc import` writing to a volume, `srpd volume resize`
// refuses a shrink in one line that names the session and --force,
// grows, and shrinks with --force; the import goes on within the new
// size.
func TestResizeUnderSessionCLI(t *testing.T) {
	srpd, srpc, data, addr := startSrpd(t, "--no-default-volume")
	e2etest.MustRun(t, srpd, "volume", "create", "--data", data, "--size", "64MiB", "A")
	imp := startImport(t, srpc, "--target", addr, "--name", "host-r", "A", "-")
	if _, err := imp.stdin.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	waitSession(t, srpd, data, "host-r")
	r := e2etest.Run(t, nil, srpd, "volume", "resize", "--data", data, "--size", "32MiB", "A")
	if msg := strings.TrimSpace(r.Stderr); r.Code != 1 || strings.Contains(msg, "\n") || !strings.Contains(msg, "1 session has it open") ||
		!strings.Contains(msg, "--force") {
		t.Fatalf("shrink under a session: exit %d, stderr %q; want one line naming 1 session and --force", r.Code, r.Stderr)
	}
	t.Log(strings.TrimSpace(r.Stderr))
	e2etest.MustRun(t, srpd, "volume", "resize", "--data", data, "--size", "128MiB", "A")
	e2etest.MustRun(t, srpd, "volume", "resize", "--data", data, "--size", "32MiB", "--force", "A")
	if _, err := imp.stdin.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	imp.stdin.Close()
	imp.Wait(t, time.Minute, "srpc import after its input ended")
	if code := imp.ExitCode(); code != 0 {
		t.Errorf("srpc import across the resizes: exit %d, stderr:\n%s", code, imp.Output())
	}
}
