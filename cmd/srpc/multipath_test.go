package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestMultipathCopy: import and export with two --target paths, one of
// them dead (first for the import, last for the export, which a single
// --target, the last one given, would fail on): both go through the
// live one (srpd with a memory store, a gateway that is always active),
// and the bytes come back; so does a mount through the same paths (as
// root, with FUSE). Commands that do not take several paths say
// so.
func TestMultipathCopy(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	dead, addr := e2etest.FreeAddr(t), e2etest.FreeAddr(t)
	e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data"), addr, "", "--backend", "memory", "--default-volume-size", "16MiB")
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	paths := []string{"--target", dead, "--target", addr, "--timeout", "5s"}
	e2etest.MustRun(t, srpc, append([]string{"import"}, append(paths, "vol0", in)...)...)
	e2etest.MustRun(t, srpc, "export", "--length", "4MiB", "--target", addr, "--target", dead, "--timeout", "5s", "vol0", out)
	if e2etest.FileSum(t, out) != sha256.Sum256(buf) {
		t.Fatal("the export through two paths differs from the import")
	}
	if _, err := os.Stat("/dev/fuse"); err == nil && os.Geteuid() == 0 {
		// A mount through the same two paths, the dead one first:
		// the disk reads what was imported.
		mnt := filepath.Join(dir, "mnt")
		os.Mkdir(mnt, 0o755)
		m := e2etest.StartProc(t, srpc, append([]string{"mount"}, append(paths, "vol0", mnt)...)...)
		m.ServesFUSE(mnt)
		m.WaitOutput(t, "srpc: mounted", 30*time.Second)
		f, err := os.Open(filepath.Join(mnt, "disk"))
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(buf))
		_, err = io.ReadFull(f, got)
		f.Close()
		if err != nil || !bytes.Equal(got, buf) {
			t.Fatalf("the disk mounted through two paths reads other bytes than were imported (%v)", err)
		}
		stopMount(t, m)
	}
	r := e2etest.Run(t, nil, srpc, append([]string{"list"}, paths...)...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "import, export and mount only") {
		t.Errorf("srpc list with two --target: exit %d, stderr %q; want a usage error", r.Code, r.Stderr)
	}
}
