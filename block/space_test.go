package block

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

// fullFS is an in-memory file system of limit bytes: a Write or WriteAt
// that would take the files in dir past it fails with ENOSPC, as a full
// disk does. statfs reports the same limit and usage.
type fullFS struct {
	vfs.FS
	dir    string
	limit  atomic.Int64
	enospc atomic.Int64 // ENOSPC errors returned to pebble's WAL and MANIFEST
	// tables counts ENOSPC errors returned to a flush's or a compaction's
	// table (or any other file): pebble fails that job and retries it,
	// as it must on a real disk, where a compaction may need more than
	// any reserve.
	tables atomic.Int64
}

func newFullFS(dir string, limit int64) *fullFS {
	f := &fullFS{FS: vfs.NewMem(), dir: dir}
	f.limit.Store(limit)
	return f
}

// used sums the sizes of the files in dir.
func (f *fullFS) used() int64 {
	names, err := f.FS.List(f.dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, name := range names {
		if st, err := f.FS.Stat(f.FS.PathJoin(f.dir, name)); err == nil && !st.IsDir() {
			n += st.Size()
		}
	}
	return n
}

func (f *fullFS) statfs(string) (SpaceUsage, error) {
	l := f.limit.Load()
	return SpaceUsage{Total: l, Avail: max(l-f.used(), 0)}, nil
}

func (f *fullFS) wrap(name string, file vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	base := filepath.Base(name)
	// What pebble cannot survive ENOSPC in (the space guard's doc):
	// its write-ahead log and its MANIFEST.
	fatal := strings.HasSuffix(base, ".log") || strings.HasPrefix(base, "MANIFEST")
	return fullFile{File: file, fs: f, fatal: fatal}, nil
}

func (f *fullFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, c)
	return f.wrap(name, file, err)
}

func (f *fullFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, c, o...)
	return f.wrap(name, file, err)
}

func (f *fullFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(old, name, c)
	return f.wrap(name, file, err)
}

func (f *fullFS) room(n int, fatal bool) error {
	if f.used()+int64(n) > f.limit.Load() {
		if fatal {
			f.enospc.Add(1)
		} else {
			f.tables.Add(1)
		}
		return syscall.ENOSPC
	}
	return nil
}

type fullFile struct {
	vfs.File
	fs    *fullFS
	fatal bool // the WAL or the MANIFEST
}

func (w fullFile) Write(p []byte) (int, error) {
	if err := w.fs.room(len(p), w.fatal); err != nil {
		return 0, err
	}
	return w.File.Write(p)
}

func (w fullFile) WriteAt(p []byte, off int64) (int, error) {
	if err := w.fs.room(len(p), w.fatal); err != nil {
		return 0, err
	}
	return w.File.WriteAt(p, off)
}

// fakeClock is a clock the test advances.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// within runs fn and fails the test if it takes longer than d: a write on a
// full store must fail fast, not hang.
func within(t *testing.T, d time.Duration, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if el := time.Since(start); el > d {
			t.Fatalf("%s took %s, want under %s", what, el, d)
		}
		return err
	case <-time.After(d + 5*time.Second):
		t.Fatalf("%s hung (over %s)", what, d+5*time.Second)
		return nil
	}
}

// TestPebbleDiskFull fills a store on a file system that fails writes with
// ENOSPC. Without the space guard pebble meets ENOSPC in its WAL and either
// hangs the writer or dies in DB.rotateWAL ("sync: unlock of unlocked
// mutex"); with it, writes fail fast with ErrNoSpace before pebble ever
// sees ENOSPC, reads, flushes and discards keep working, and writes work
// again once space is freed.
func TestPebbleDiskFull(t *testing.T) {
	const dir = "/store"
	const limit = 48 << 20
	fs := newFullFS(dir, limit)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	s, err := OpenPebbleStore(dir, &PebbleOptions{
		FS: fs, Statfs: fs.statfs, Clock: clk.now, CacheSize: 8 << 20, MemTableSize: 4 << 20,
		SpaceReserve: 12 << 20,
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	a, err := s.Create("a", 32<<20, 4096)
	require.NoError(t, err)
	defer a.Close()
	b, err := s.Create("b", 8<<20, 4096)
	require.NoError(t, err)
	defer b.Close()

	blockB := bytes.Repeat([]byte{0xbb}, 4096)
	_, err = b.WriteAt(blockB, 0)
	require.NoError(t, err)

	// Random-looking, incompressible chunks: compression must not hide
	// the bytes written.
	chunk := make([]byte, 64<<10)
	fill := func(i int) {
		x := uint64(i)*0x9e3779b97f4a7c15 + 1
		for j := 0; j < len(chunk); j += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			for k := range 8 {
				chunk[j+k] = byte(x >> (8 * k))
			}
		}
	}
	first := make([]byte, len(chunk))
	var werr error
	writes := 0
	for i := 0; i < 10*limit/len(chunk); i++ {
		fill(i)
		if i == 0 {
			copy(first, chunk)
		}
		off := int64(i%(32<<20/len(chunk))) * int64(len(chunk))
		// An admitted write may wait for a memtable flush (slow under
		// -race on a busy machine); only a hang fails it. The refused
		// one must be fast.
		start := time.Now()
		werr = within(t, 20*time.Second, "write", func() error { _, err := a.WriteAt(chunk, off); return err })
		if werr != nil {
			if el := time.Since(start); el > time.Second {
				t.Fatalf("refused write took %s, want under 1s", el)
			}
			break
		}
		writes++
		clk.advance(10 * time.Millisecond)
	}
	t.Logf("%d writes of %d bytes before: %v", writes, len(chunk), werr)
	require.Error(t, werr, "the file system never filled")
	require.ErrorIs(t, werr, ErrNoSpace)
	require.ErrorIs(t, werr, syscall.ENOSPC)
	require.Zero(t, fs.enospc.Load(), "pebble's WAL or MANIFEST met ENOSPC: the guard let the disk fill")
	if n := fs.tables.Load(); n > 0 {
		t.Logf("%d flush or compaction writes met ENOSPC (pebble retries them)", n)
	}

	// The other volume is refused too (same file system), fast.
	err = within(t, time.Second, "write b", func() error { _, err := b.WriteAt(blockB, 4096); return err })
	require.ErrorIs(t, err, ErrNoSpace)
	err = within(t, time.Second, "write-fua b", func() error { _, err := b.WriteAtFUA(blockB, 4096); return err })
	require.ErrorIs(t, err, ErrNoSpace)
	err = within(t, time.Second, "write batch", func() error {
		return a.(BatchWriter).WriteBatch([][]byte{chunk[:4096]}, []int64{0})
	})
	require.ErrorIs(t, err, ErrNoSpace)

	// Reads, flushes of what was written and discards still work.
	got := make([]byte, len(chunk))
	_, err = a.ReadAt(got, 0)
	require.NoError(t, err)
	if writes <= 32<<20/len(chunk) {
		require.Equal(t, first, got)
	}
	_, err = b.ReadAt(got[:4096], 0)
	require.NoError(t, err)
	require.Equal(t, blockB, got[:4096])
	require.NoError(t, a.Flush())
	require.NoError(t, b.Discard(4096, 4096))

	info, err := s.Space()
	require.NoError(t, err)
	require.True(t, info.Known && info.Full, "%+v", info)
	require.GreaterOrEqual(t, info.RefusedWrites, uint64(4))
	// Full once free space minus the bytes admitted since the last
	// measurement (at most refreshBytes, 3 MiB here) is under the reserve.
	require.Less(t, info.Free, info.Reserve+3<<20)
	require.Equal(t, int64(40<<20), info.Provisioned)

	// Space comes back (the operator deleted something): once the guard
	// measures again, writes succeed.
	fs.limit.Store(2 * limit)
	clk.advance(spaceRefreshInterval)
	_, err = a.WriteAt(chunk, 0)
	require.NoError(t, err)
	_, err = b.WriteAt(blockB, 4096)
	require.NoError(t, err)
	require.NoError(t, a.Flush())
	info, err = s.Space()
	require.NoError(t, err)
	require.False(t, info.Full, "%+v", info)
	require.Zero(t, fs.enospc.Load())
}

// TestPebbleOvercommit: volume sizes are bounded by MaxOvercommit × the
// file system's size, on create, clone and growing resize.
func TestPebbleOvercommit(t *testing.T) {
	const fsSize = 64 << 20
	statfs := func(string) (SpaceUsage, error) { return SpaceUsage{Total: fsSize, Avail: fsSize / 2}, nil }
	open := func(ratio float64) *PebbleStore {
		s, err := OpenPebbleStore("/store", &PebbleOptions{FS: vfs.NewMem(), Statfs: statfs, MaxOvercommit: ratio,
			CacheSize: 8 << 20, MemTableSize: 4 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := open(0) // the default, 10×: 640 MiB
	_, err := s.Create("huge", 1<<40, 4096)
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorIs(t, err, ErrOvercommit)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorContains(t, err, "max overcommit")
	require.NotContains(t, err.Error(), "\n")
	_, err = s.Create("petabytes", 88<<50/10/4096*4096, 4096)
	require.Error(t, err)
	v, err := s.Create("v", 512<<20, 4096)
	require.NoError(t, err)
	defer v.Close()
	_, err = s.Create("w", 256<<20, 4096)
	require.ErrorIs(t, err, ErrNoSpace)
	r := v
	require.NoError(t, r.Resize(600<<20))
	require.ErrorIs(t, r.Resize(700<<20), ErrNoSpace)
	require.NoError(t, r.Resize(100<<20))
	_, err = s.Snapshot("v", "s")
	require.NoError(t, err)
	c, err := s.Clone("v", "s", "c")
	require.NoError(t, err)
	c.Close()
	info, err := s.Space()
	require.NoError(t, err)
	require.Equal(t, int64(200<<20), info.Provisioned)
	require.Equal(t, DefaultMaxOvercommit, info.MaxOvercommit)
	_, err = s.Create("x", 500<<20, 4096)
	require.ErrorIs(t, err, ErrNoSpace)
	require.False(t, errors.Is(err, ErrInvalid))

	u := open(-1) // unbounded
	big, err := u.Create("huge", 1<<40, 4096)
	require.NoError(t, err)
	big.Close()
}

// TestSpaceGuardRefresh: statfs runs at most every refresh interval or
// refreshBytes, the bytes admitted meanwhile count as used, and a refused
// store admits again once a measurement shows space.
func TestSpaceGuardRefresh(t *testing.T) {
	var avail atomic.Int64
	avail.Store(70 << 20)
	calls := 0
	statfs := func(string) (SpaceUsage, error) {
		calls++
		return SpaceUsage{Total: 1 << 30, Avail: avail.Load()}, nil
	}
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	g, err := newSpaceGuard("d", statfs, clk.now, nil, 64<<20)
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	// Below refreshBytes (16 MiB) and the interval: no statfs per write.
	// The bytes admitted count against the free space before statfs
	// sees them: 70 - 6 >= 64 is admitted, 70 - 7 < 64 refused.
	for range 6 {
		require.NoError(t, g.admit(1<<20))
	}
	require.ErrorIs(t, g.admit(1<<20), ErrNoSpace)
	require.Equal(t, 1, calls)
	require.True(t, g.full.Load())
	require.Equal(t, uint64(1), g.refused.Load())
	// statfs now says 200 MiB free: after the interval, admitted again.
	avail.Store(200 << 20)
	clk.advance(spaceRefreshInterval)
	require.NoError(t, g.admit(4096))
	require.False(t, g.full.Load())
	// A negative reserve never refuses.
	off, err := newSpaceGuard("d", statfs, clk.now, nil, -1)
	require.NoError(t, err)
	avail.Store(0)
	clk.advance(spaceRefreshInterval)
	require.NoError(t, off.admit(1<<30))
}

// TestMemTableForFileSystem: a pebble store's default memtable is a 32nd
// of its file system, between 4 and 128 MiB, and its default reserve
// keeps room for two memtables' flushes (at most a quarter of the file
// system). On a 200 MiB tmpfs the 128 MiB memtables of before left
// 120 MiB of WAL unflushed when writes were refused at the 50 MiB
// reserve, and pebble's flushes then failed for space, the file system
// at 0 bytes free.
func TestMemTableForFileSystem(t *testing.T) {
	for _, tc := range []struct {
		total        int64
		mem, reserve int64
	}{
		{64 << 20, 4 << 20, 16 << 20},
		{200 << 20, 6 << 20, 50 << 20},
		{1 << 30, 32 << 20, 64 << 20},
		{2 << 30, 64 << 20, 128 << 20},
		{8 << 30, 128 << 20, 256 << 20},
		{100 << 30, 128 << 20, 1 << 30},
	} {
		statfs := func(string) (SpaceUsage, error) { return SpaceUsage{Total: tc.total, Avail: tc.total}, nil }
		s, err := OpenPebbleStore("/store", &PebbleOptions{FS: vfs.NewMem(), Statfs: statfs, CacheSize: 8 << 20})
		require.NoError(t, err)
		mem := memTableFor(tc.total)
		res := s.space.curRes.Load()
		require.NoError(t, s.Close())
		require.Equal(t, tc.mem, int64(mem), "memtable on %d MiB", tc.total>>20)
		require.Equal(t, tc.reserve, res, "reserve on %d MiB", tc.total>>20)
	}
}
