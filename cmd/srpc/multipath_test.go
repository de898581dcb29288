package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
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
// root, with FUSE), and an nbd export; list and info answer from the
// live one, and reserve registers and shows through the live one.
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
	// nbd through the same two paths, the dead one first: nbdcopy reads
	// what was imported (the NBD client's requests go through Submit and
	// the extents through the Multipath).
	if _, err := exec.LookPath("nbdcopy"); err == nil {
		sock := filepath.Join(dir, "nbd.sock")
		p := startNBDWith(t, srpc, append([]string{"nbd", "--socket", sock}, append(paths, "vol0")...)...)
		viaNBD := filepath.Join(dir, "nbd.img")
		if out, err := exec.Command("nbdcopy", "nbd+unix:///vol0?socket="+sock, viaNBD).CombinedOutput(); err != nil {
			t.Fatalf("nbdcopy: %v: %s\n%s", err, out, p.Output())
		}
		b, err := os.ReadFile(viaNBD)
		if err != nil || len(b) < len(buf) || !bytes.Equal(b[:len(buf)], buf) {
			t.Fatalf("the volume served over NBD through two paths reads other bytes than were imported (%v)", err)
		}
	}
	// list and info ask the first path that answers.
	if r := e2etest.MustRun(t, srpc, append([]string{"list"}, paths...)...); !strings.Contains(r.Stdout, "vol0") {
		t.Errorf("srpc list with a dead and a live --target: %q, want vol0 listed", r.Stdout)
	}
	if r := e2etest.MustRun(t, srpc, append([]string{"info"}, append(paths, "vol0")...)...); !strings.Contains(r.Stdout, addr) {
		t.Errorf("srpc info with a dead and a live --target: %q, want the live one named", r.Stdout)
	}
	// reserve goes through the active path (gateways keep a volume's
	// reservations with it).
	e2etest.MustRun(t, srpc, append([]string{"reserve", "register"}, append(paths, "vol0", "0xc")...)...)
	if r := e2etest.MustRun(t, srpc, append([]string{"reserve", "show"}, append(paths, "vol0")...)...); !strings.Contains(r.Stdout, "key 0xc") {
		t.Errorf("srpc reserve show with a dead and a live --target: %q, want the registration made through them", r.Stdout)
	}
}
