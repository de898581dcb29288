package fusedisk

import (
	"bytes"
	"context"
	"syscall"
	"testing"
)

// memDev is an in-memory Device that records Discard/WriteZeroes ranges.
type memDev struct {
	b     []byte
	zeros [][2]int64
}

func (m *memDev) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	return copy(p, m.b[off:]), nil
}
func (m *memDev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	return copy(m.b[off:], p), nil
}
func (m *memDev) Flush(context.Context) error { return nil }
func (m *memDev) Discard(_ context.Context, off, n int64) error {
	m.zeros = append(m.zeros, [2]int64{off, n})
	clear(m.b[off : off+n])
	return nil
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
