package durable

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteFileDiskFull: on a full file system the replacement fails
// with ENOSPC, the old contents stay whole and readable, and the
// temporary file that could not be written is gone, so the space it took
// is given back; once there is room again the same call succeeds. The
// full disk is a real one: a 64 KiB tmpfs, which allocates its pages at
// write time as a disk file system allocates blocks, so the write itself
// is what fails, not the open (root only; CI runs as root).
func TestWriteFileDiskFull(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): this test needs root", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	path := filepath.Join(dir, "state.json")
	old := []byte("the state before the disk filled\n")
	if err := WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	fill(t, filler)

	err := WriteFile(path, bytes.Repeat([]byte{'x'}, 16<<10), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("replacing a file on a full disk: %v, want ENOSPC", err)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, old) {
		t.Fatalf("after the failed replacement: %q (%v), want the old contents", b, err)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary file is still there (%v): its pages stay taken", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{'y'}, 16<<10)
	if err := WriteFile(path, want, 0o600); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, want) {
		t.Fatalf("with room again the file holds %d bytes, want the new %d", len(b), len(want))
	}
}

// fill writes path until the file system refuses with ENOSPC.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for range 1 << 10 {
		if _, err := f.Write(page); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v, want ENOSPC at the end", err)
			}
			return
		}
	}
	t.Fatal("a 64 KiB tmpfs took 4 MiB without filling")
}
