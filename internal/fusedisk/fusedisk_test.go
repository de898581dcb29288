package fusedisk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// memDev is an in-memory Device that records Discard/WriteZeroes ranges.
// A mount serves it from the FUSE server's goroutines (mu).
type memDev struct {
	mu    sync.Mutex
	b     []byte
	zeros [][2]int64
}

func (m *memDev) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(p, m.b[off:]), nil
}
func (m *memDev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.b[off:], p), nil
}
func (m *memDev) Flush(context.Context) error { return nil }
func (m *memDev) Discard(_ context.Context, off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.zeros = append(m.zeros, [2]int64{off, n})
	clear(m.b[off : off+n])
	return nil
}

// bytes returns a copy of what m holds.
func (m *memDev) bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.b)
}
func (m *memDev) WriteZeroes(ctx context.Context, off, n int64) error { return m.Discard(ctx, off, n) }
func (m *memDev) Size() int64                                         { return int64(len(m.b)) }
func (m *memDev) BlockSize() int                                      { return 4096 }
func (m *memDev) ReadOnly() bool                                      { return false }

func TestAllocate(t *testing.T) {
	dev := &memDev{b: bytes.Repeat([]byte{1}, 64<<10)}
	d := &disk{dev: dev}
	// Unaligned punch: the aligned middle is discarded, the edges zeroed by writes.
	if e := d.Allocate(context.Background(), nil, 1000, 20000, fallocPunchHole|fallocKeepSize); e != 0 {
		t.Fatal(e)
	}
	if len(dev.zeros) != 1 || dev.zeros[0] != [2]int64{4096, 16384} {
		t.Fatalf("discarded %v", dev.zeros)
	}
	for i, c := range dev.b {
		if want := byte(1); (i >= 1000 && i < 21000) == (c == want) {
			t.Fatalf("byte %d = %d", i, c)
		}
	}
	// Past the end with KEEP_SIZE is clipped; plain allocate past the end fails.
	if e := d.Allocate(context.Background(), nil, 60<<10, 1<<20, fallocZeroRange|fallocKeepSize); e != 0 {
		t.Fatal(e)
	}
	if e := d.Allocate(context.Background(), nil, 60<<10, 1<<20, 0); e != syscall.ENOSPC {
		t.Fatalf("allocate past the end: %v", e)
	}
	if e := d.Allocate(context.Background(), nil, 0, 4096, 0x08 /* COLLAPSE_RANGE */); e != syscall.EOPNOTSUPP {
		t.Fatalf("collapse: %v", e)
	}
}

// TestMountOpenTruncate mounts a device and writes it as `dd if=img
// of=DIR/disk` does, opening with O_TRUNC: the open succeeds, as a block
// device's does, the size stays the device's and what lies past the
// write is untouched. It was refused with EPERM (the kernel turned
// O_TRUNC into a SETATTR of size 0), so the first command a user tried
// on a mount failed with "Operation not permitted". An explicit
// truncate is still refused.
func TestMountOpenTruncate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: FUSE direct mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("needs /dev/fuse")
	}
	const size = 1 << 20
	dev := &memDev{b: bytes.Repeat([]byte{7}, size)}
	dir := t.TempDir()
	srv, err := Mount(dir, dev, Options{})
	if err != nil {
		t.Skipf("cannot mount FUSE here: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
	})
	if err := srv.WaitMount(); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, FileName)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatalf("open with O_TRUNC, as dd does: %v", err)
	}
	img := bytes.Repeat([]byte{9}, 8192)
	if _, err := f.WriteAt(img, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != size {
		t.Fatalf("size after an O_TRUNC open and a write: %d, want %d", st.Size(), size)
	}
	if b := dev.bytes(); !bytes.Equal(b[:len(img)], img) || !bytes.Equal(b[len(img):], bytes.Repeat([]byte{7}, size-len(img))) {
		t.Fatal("the device is not the image followed by what it held before")
	}
	if err := os.Truncate(name, 0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("truncate to 0: %v, want EPERM", err)
	}
}
