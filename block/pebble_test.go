package block

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

// syncCountFS counts syncs of WAL files (*.log).
type syncCountFS struct {
	vfs.FS
	syncs atomic.Int64
}

type syncCountFile struct {
	vfs.File
	fs *syncCountFS
}

func (f syncCountFile) Sync() error     { f.fs.syncs.Add(1); return f.File.Sync() }
func (f syncCountFile) SyncData() error { f.fs.syncs.Add(1); return f.File.SyncData() }
func (f syncCountFile) SyncTo(n int64) (bool, error) {
	f.fs.syncs.Add(1)
	return f.File.SyncTo(n)
}

func (fs *syncCountFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return syncCountFile{File: f, fs: fs}, nil
}

func (fs *syncCountFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(old, name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, o...)
	return fs.wrap(name, f, err)
}

// TestPebbleDurabilitySyncsWAL checks the durability rules against the
// file system: a plain write does not sync the WAL; Flush and a FUA write
// do, before they return.
func TestPebbleDurabilitySyncsWAL(t *testing.T) {
	fs := &syncCountFS{FS: vfs.NewMem()}
	s, err := OpenPebbleStore("db", &PebbleOptions{FS: fs})
	require.NoError(t, err)
	defer s.Close()
	v, err := s.Create("v", 1<<20, 4096)
	require.NoError(t, err)
	defer v.Close()
	buf := bytes.Repeat([]byte{7}, 4096)

	before := fs.syncs.Load()
	_, err = v.WriteAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, before, fs.syncs.Load(), "a plain write must not sync")

	require.NoError(t, v.Flush())
	require.Greater(t, fs.syncs.Load(), before, "Flush must sync the WAL")

	before = fs.syncs.Load()
	_, err = v.WriteAtFUA(buf, 4096)
	require.NoError(t, err)
	require.Greater(t, fs.syncs.Load(), before, "a FUA write must sync the WAL")

	// Concurrent flushers all return after a sync; pebble may merge them.
	before = fs.syncs.Load()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := v.WriteAt(buf, int64(i)*4096)
			require.NoError(t, err)
			require.NoError(t, v.Flush())
		}()
	}
	wg.Wait()
	n := fs.syncs.Load() - before
	require.GreaterOrEqual(t, n, int64(1))
	require.LessOrEqual(t, n, int64(16))
	t.Logf("16 concurrent flushes: %d WAL syncs", n)
}

// TestPebbleSnapshotLayers exercises the layer chain by hand: masks over
// older layers, shrink then grow, clones, and persistence of all of it.
func TestPebbleSnapshotLayers(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	v, err := s.Create("v", 8*512, 512)
	require.NoError(t, err)
	blk := func(b byte) []byte { return bytes.Repeat([]byte{b}, 512) }
	read := func(v Volume, i int64) byte {
		p := make([]byte, 512)
		_, err := v.ReadAt(p, i*512)
		require.NoError(t, err)
		require.Equal(t, blk(p[0]), p, "block %d not uniform", i)
		return p[0]
	}
	for i := int64(0); i < 8; i++ {
		_, err := v.WriteAt(blk(byte(i+1)), i*512)
		require.NoError(t, err)
	}
	_, err = s.Snapshot("v", "a")
	require.NoError(t, err)
	require.NoError(t, v.Discard(512, 2*512)) // blocks 1,2 masked
	_, err = v.WriteAt(blk(0xaa), 2*512)      // block 2 rewritten inside the mask
	require.NoError(t, err)
	require.NoError(t, v.Resize(4*512)) // cut 4..7
	require.NoError(t, v.Resize(8*512)) // grow: 4..7 read zero
	require.Equal(t, []byte{1, 0, 0xaa, 4, 0, 0, 0, 0}, []byte{read(v, 0), read(v, 1), read(v, 2), read(v, 3), read(v, 4), read(v, 5), read(v, 6), read(v, 7)})

	c, err := s.Clone("v", "a", "c")
	require.NoError(t, err)
	_, err = c.WriteAt(blk(0xcc), 0)
	require.NoError(t, err)
	require.NoError(t, v.Close())
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())

	s, err = OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	v, err = s.Open("v")
	require.NoError(t, err)
	require.Equal(t, byte(0xaa), read(v, 2))
	require.Equal(t, byte(0), read(v, 5))
	a, err := s.OpenSnapshot("v", "a")
	require.NoError(t, err)
	for i := int64(0); i < 8; i++ {
		require.Equal(t, byte(i+1), read(a, i), "snapshot block %d", i)
	}
	_, err = a.WriteAt(blk(1), 0)
	require.ErrorIs(t, err, ErrReadOnly)
	require.ErrorIs(t, s.DeleteSnapshot("v", "a"), ErrBusy)
	require.NoError(t, a.Close())
	// The clone and the volume still read through the snapshot's layer
	// after the snapshot is deleted.
	require.NoError(t, s.DeleteSnapshot("v", "a"))
	c, err = s.Open("c")
	require.NoError(t, err)
	require.Equal(t, []byte{0xcc, 2, 8}, []byte{read(c, 0), read(c, 1), read(c, 7)})
	require.Equal(t, byte(4), read(v, 3))
	require.NoError(t, c.Close())
	require.NoError(t, v.Close())
	require.NoError(t, s.Delete("v"))
	require.NoError(t, s.Delete("c"))
	// Every layer is gone once nothing references it.
	it, err := s.db.NewIter(&pebble.IterOptions{
		KeyTypes: pebble.IterKeyTypePointsAndRanges, LowerBound: []byte{kindData}, UpperBound: []byte{kindData + 1},
	})
	require.NoError(t, err)
	require.False(t, it.First(), "data left after deleting every volume")
	require.NoError(t, it.Close())
}

// gateFS holds every new sstable and blob file's creation until open is
// closed, so pebble's memtable flushes cannot finish.
type gateFS struct {
	vfs.FS
	open chan struct{}
}

func (fs gateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob") {
		<-fs.open
	}
	return fs.FS.Create(name, c)
}

// TestBatchWriter checks which volumes take write batches and how a batch
// fails; TestModel checks their contents against a model.
func TestBatchWriter(t *testing.T) {
	for _, be := range backends() {
		s := be.open(t, t.TempDir())
		v, err := s.Create("v", 64<<10, 4096)
		require.NoError(t, err)
		_, ok := v.(BatchWriter)
		// Memory volumes run inline on the target's loop already; files
		// have no cheaper form of several scattered writes.
		require.Equal(t, be.name == "pebble", ok, "%s volume implements BatchWriter", be.name)
		require.NoError(t, v.Close())
		require.NoError(t, s.Close())
	}

	s, err := OpenPebbleStore(t.TempDir(), &PebbleOptions{CacheSize: 8 << 20, MemTableSize: 4 << 20})
	require.NoError(t, err)
	defer s.Close()
	v, err := s.Create("v", 64<<10, 4096)
	require.NoError(t, err)
	bw := v.(BatchWriter)
	require.False(t, bw.Stalled())
	a, b := bytes.Repeat([]byte{1}, 8192), bytes.Repeat([]byte{2}, 4096)
	require.NoError(t, bw.WriteBatch([][]byte{a, b}, []int64{0, 4096}))
	got := make([]byte, 8192)
	_, err = v.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, append(a[:4096:4096], b...), got, "the later write of block 1 wins")

	_, err = s.Snapshot("v", "s")
	require.NoError(t, err)
	snap, err := s.OpenSnapshot("v", "s")
	require.NoError(t, err)
	require.ErrorIs(t, snap.(BatchWriter).WriteBatch([][]byte{b}, []int64{0}), ErrReadOnly)
	require.NoError(t, snap.Close())

	require.NoError(t, v.Close())
	require.ErrorIs(t, bw.WriteBatch([][]byte{b}, []int64{0}), ErrClosed)
}

// TestPebbleStalled checks that a pebble volume reports a write stall while
// pebble holds writes back (here: its memtable flushes cannot finish) and
// stops reporting it when the stall ends.
func TestPebbleStalled(t *testing.T) {
	fs := gateFS{FS: vfs.NewMem(), open: make(chan struct{})}
	s, err := OpenPebbleStore("db", &PebbleOptions{CacheSize: 8 << 20, MemTableSize: 1 << 20, FS: fs})
	require.NoError(t, err)
	defer s.Close()
	release := sync.OnceFunc(func() { close(fs.open) })
	defer release() // before s.Close, should the test fail
	const size = 8 << 20
	v, err := s.Create("v", size, 4096)
	require.NoError(t, err)
	defer v.Close()
	bw := v.(BatchWriter)

	// Write until pebble stalls the writer: four full memtables wait
	// for a flush (MemTableStopWritesThreshold).
	done := make(chan error, 1)
	go func() {
		p := make([]byte, 64<<10)
		for i := int64(0); i < 16*size/int64(len(p)); i++ {
			if err := bw.WriteBatch([][]byte{p}, []int64{i * int64(len(p)) % size}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	deadline := time.Now().Add(time.Minute)
	for !bw.Stalled() {
		select {
		case err := <-done:
			t.Fatalf("16 volumes' worth of writes finished (err %v) with flushes held", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "no write stall within a minute")
		time.Sleep(time.Millisecond)
	}
	release()
	require.NoError(t, <-done)
	require.False(t, bw.Stalled(), "stall reported after the writes went through")
}
