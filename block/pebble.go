package block

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// PebbleOptions tunes OpenPebbleStore; the zero value (or nil) gives the defaults.
type PebbleOptions struct {
	// CacheSize is the block cache size in bytes; 0 means 256 MiB. A read
	// of a block held in a blob file also reads the blob file's index
	// block, which a small cache evicts under random reads.
	CacheSize int64
	// MemTableSize is the size of one memtable in bytes; 0 means a 32nd
	// of the store's file system, between 4 and 128 MiB (128 MiB from a
	// 4 GiB file system up; without a measured file system, 128 MiB).
	// Larger memtables absorb more overwrites of hot blocks before they
	// reach an sstable, and each flush's compaction into Lbase, which
	// rewrites the keys of the whole span a flush of random writes covers,
	// is paid for by more writes. Pebble grows a memtable to this size
	// from a small first one, so idle stores stay small.
	MemTableSize uint64
	// FS replaces the file system (tests use pebble's vfs.NewMem or a
	// wrapper that counts syncs); nil means the OS.
	FS vfs.FS
	// Logger receives pebble's errors; nil means the standard logger.
	// Pebble's informational messages are dropped.
	Logger *log.Logger

	// SpaceReserve is the free space, in bytes, below which writes fail
	// with ErrNoSpace (see the package doc, "Out of space"); 0 means
	// max(64 MiB, 1% of the file system), at most a quarter of it; a
	// negative value turns the refusal off (free space is still reported).
	SpaceReserve int64
	// MaxOvercommit bounds the sum of the volume sizes to this multiple
	// of the file system's size: Create, Clone and a growing Resize past
	// it fail with ErrNoSpace. 0 means DefaultMaxOvercommit; a negative
	// value means no bound.
	MaxOvercommit float64
	// Statfs measures the store's file system; nil means Statfs when FS
	// is nil, and no space guard at all with a custom FS (whose space the
	// OS cannot measure).
	Statfs StatfsFunc
	// Clock is the space guard's clock (tests inject one); nil means
	// time.Now.
	Clock func() time.Time
	// SpaceLog receives the out-of-space transitions; nil means
	// slog.Default().
	SpaceLog *slog.Logger
}

// PebbleStore is the pebble backend: many volumes in one pebble database,
// with snapshots and clones. See doc.go for the key layout and the
// durability rules.
type PebbleStore struct {
	dir string
	db  *pebble.DB

	// storeState.mu serializes every metadata change (create, resize,
	// snapshot, delete, ...) and guards the fields below. Lock order: mu
	// before any pebbleCore.mu. The I/O path never takes mu.
	storeState[*pebbleCore]
	nextLayer uint64
	open      map[string]*pebbleCore // by "volume" or "volume@snapshot"

	// stalls counts the writers pebble is holding back (a write stall:
	// too many memtables waiting for a flush, or too many L0 files).
	stalls atomic.Int32

	// space admits data writes against the free space (nil: unmeasured);
	// overcommit bounds the provisioned total (<= 0: unbounded).
	space      *spaceGuard
	overcommit float64
}

var (
	_ Store         = (*PebbleStore)(nil)
	_ Snapshotter   = (*PebbleStore)(nil)
	_ SpaceReporter = (*PebbleStore)(nil)
)

// pebbleLogger drops pebble's chatter and keeps its errors.
type pebbleLogger struct{ l *log.Logger }

func (pebbleLogger) Infof(string, ...any)        {}
func (p pebbleLogger) Errorf(f string, a ...any) { p.l.Printf("block: pebble: "+f, a...) }
func (p pebbleLogger) Fatalf(f string, a ...any) { p.l.Fatalf("block: pebble: "+f, a...) }

// memTableFor is the default memtable size on a file system of total
// bytes: a 32nd of it, between 4 and 128 MiB, in whole MiB.
func memTableFor(total int64) uint64 {
	return uint64(min(max(total/32, 4<<20), 128<<20)) &^ (1<<20 - 1)
}

// OpenPebbleStore opens the pebble store in dir, creating it if dir holds
// no database. A store written by a newer format fails with
// ErrFormatVersion; a directory holding some other pebble database, or a
// store whose store record is damaged, fails with ErrCorrupt.
func OpenPebbleStore(dir string, o *PebbleOptions) (*PebbleStore, error) {
	if o == nil {
		o = &PebbleOptions{}
	}
	cacheSize := o.CacheSize
	if cacheSize <= 0 {
		cacheSize = 256 << 20
	}
	memSize := o.MemTableSize
	if memSize == 0 {
		memSize = 128 << 20
	}
	logger := o.Logger
	if logger == nil {
		logger = log.New(os.Stderr, "", log.LstdFlags)
	}
	cache := pebble.NewCache(cacheSize)
	defer cache.Unref()
	s := &PebbleStore{storeState: newStoreState[*pebbleCore]("pebble store " + dir), dir: dir, open: map[string]*pebbleCore{}}
	opts := &pebble.Options{
		// Pebble calls Begin and End in pairs, once per stalled write
		// (DB.maybeInduceWriteStall).
		EventListener: &pebble.EventListener{
			WriteStallBegin: func(pebble.WriteStallBeginInfo) { s.stalls.Add(1) },
			WriteStallEnd:   func() { s.stalls.Add(-1) },
		},
		Cache:        cache,
		FS:           o.FS,
		MemTableSize: memSize,
		// Never run without a WAL: it is what Flush and FUA sync.
		DisableWAL:                  false,
		MemTableStopWritesThreshold: 4,
		// Range keys (snapshot masks) need at least this format.
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{logger},
		CompactionConcurrencyRange: func() (int, int) {
			return 1, 2
		},
	}
	// Block data goes to blob files (pebble's WiscKey-style value
	// separation): compactions then move keys and 8-byte handles, not
	// 4 KiB values. Random 4 KiB writes over a 1 GiB volume spent 61% of
	// the process's CPU in compactions without it; with it, sustained
	// write IOPS rose from about 95k to 157k (bench --embedded, pebble on
	// tmpfs, 60 s). Every flush writes a blob file that spans the whole
	// volume, so the reference depth that forces values to be rewritten is
	// high (at 10, as in pebble's own benchmark tool, compactions kept
	// rewriting values and gained little). Garbage is reclaimed once it is
	// a fifth of a blob file and the file is 10 s old: during those 60 s
	// of random overwrites, the 1 GiB volume (of bench's compressible
	// blocks) took 0.87-0.99 GB on disk.
	// Metadata records are smaller than MinimumSize and stay in sstables.
	opts.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           512,
			MaxBlobReferenceDepth: 100,
			RewriteMinimumAge:     10 * time.Second,
			TargetGarbageRatio:    0.2,
		}
	}
	// Bloom filters let a read of a never-written block skip sstables.
	// Compression: pebble's fastest profile (MinLZ on amd64, blocks kept
	// raw unless they shrink by 12%). Snappy, the default, took 22% of
	// srpd's CPU in compactions during random writes of incompressible
	// data after a bulk load; no compression at all cost a third of the
	// throughput on compressible data (more bytes to compact).
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.FastestCompression }
	}
	statfs := o.Statfs
	if opts.FS == nil {
		opts.FS = privateFS{vfs.Default}
		if statfs == nil {
			statfs = Statfs
		}
	}
	s.overcommit = o.MaxOvercommit
	if s.overcommit == 0 {
		s.overcommit = DefaultMaxOvercommit
	}
	if statfs != nil {
		// Measured before pebble opens (the directory may not exist yet:
		// then its parent's file system is the one it will be on).
		at := dir
		if _, err := os.Stat(dir); err != nil {
			at = filepath.Dir(dir)
		}
		g, err := newSpaceGuard(at, statfs, o.Clock, o.SpaceLog, o.SpaceReserve)
		if err != nil {
			return nil, err
		}
		s.space = g
		if o.MemTableSize == 0 {
			// A memtable is flushed to the file system it is logged on,
			// which must have room for it then: on a 200 MiB tmpfs, the
			// default 128 MiB memtables left their WALs (120 MiB) unflushed
			// when the guard refused writes at its 50 MiB reserve, and
			// pebble's flushes failed for space over and over, with the
			// file system at 0 bytes free. The reserve keeps room for two
			// (spaceGuard.floor).
			opts.MemTableSize = memTableFor(g.total.Load())
		}
		g.floor = 2 * int64(opts.MemTableSize) // no other goroutine has the guard yet
		g.curRes.Store(g.reserveFor(g.total.Load()))
		// If pebble meets ENOSPC anyway (something else filled the disk
		// between measurements), measure at once so writes stop now;
		// vfs.OnDiskFull then retries pebble's operation once.
		opts.FS = vfs.OnDiskFull(opts.FS, func() { g.refresh(g.now(), true) })
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("block: pebble store %s: open: %w", dir, err)
	}
	s.db = db
	if s.space != nil {
		s.space.dir = dir // exists now; no other goroutine uses the guard yet
	}
	if err := s.init(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// init checks (or, for an empty database, writes) the store record and
// loads the layer counter.
func (s *PebbleStore) init() error {
	v, closer, err := s.db.Get(keyFormat)
	if errors.Is(err, pebble.ErrNotFound) {
		it, err := s.db.NewIter(nil)
		if err != nil {
			return fmt.Errorf("block: pebble store %s: %w", s.dir, err)
		}
		empty := !it.First()
		if err := firstErr(it.Error(), it.Close()); err != nil {
			return fmt.Errorf("block: pebble store %s: %w", s.dir, err)
		}
		if !empty {
			return fmt.Errorf("block: pebble store %s: database has keys but no store record (not a gosrp store?): %w", s.dir, ErrCorrupt)
		}
		b := s.db.NewBatch()
		_ = b.Set(keyFormat, encodeRecord(&storeMeta{Format: formatVersion, Created: time.Now().UnixNano()}), nil)
		_ = b.Set(keyNextLayer, binary.BigEndian.AppendUint64(nil, 1), nil)
		if err := s.db.Apply(b, pebble.Sync); err != nil {
			return fmt.Errorf("block: pebble store %s: create: %w", s.dir, err)
		}
		_ = b.Close()
		s.nextLayer = 1
		return nil
	}
	if err != nil {
		return fmt.Errorf("block: pebble store %s: %w", s.dir, err)
	}
	var m storeMeta
	err = decodeRecord(fmt.Sprintf("pebble store %s: store record", s.dir), v, &m)
	_ = closer.Close()
	if err != nil {
		return err
	}
	v, closer, err = s.db.Get(keyNextLayer)
	if err != nil {
		return fmt.Errorf("block: pebble store %s: layer counter: %v: %w", s.dir, err, ErrCorrupt)
	}
	if len(v) != 8 {
		_ = closer.Close()
		return fmt.Errorf("block: pebble store %s: layer counter of %d bytes: %w", s.dir, len(v), ErrCorrupt)
	}
	s.nextLayer = binary.BigEndian.Uint64(v)
	_ = closer.Close()
	// The counter must be above every layer holding data, or a new volume
	// would see a deleted one's blocks.
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindData}, UpperBound: []byte{kindData + 1}})
	if err != nil {
		return fmt.Errorf("block: pebble store %s: %w", s.dir, err)
	}
	if it.Last() {
		if l, _, ok := parseDataKey(it.Key()); !ok || l >= s.nextLayer {
			_ = it.Close()
			return fmt.Errorf("block: pebble store %s: data key %x beyond layer counter %d: %w", s.dir, it.Key(), s.nextLayer, ErrCorrupt)
		}
	}
	if err := firstErr(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("block: pebble store %s: %w", s.dir, err)
	}
	if s.nextLayer == 0 || s.nextLayer >= maxLayerID {
		return fmt.Errorf("block: pebble store %s: layer counter %d: %w", s.dir, s.nextLayer, ErrCorrupt)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// Dir returns the directory of the store.
func (s *PebbleStore) Dir() string { return s.dir }

// Metrics returns pebble's metrics (write amplification, disk usage, WAL
// bytes), for benchmarks and the daemon's stats.
func (s *PebbleStore) Metrics() *pebble.Metrics { return s.db.Metrics() }

// getMetaLocked reads and decodes one volume or snapshot record.
func (s *PebbleStore) getMetaLocked(volume, snap string) (*volumeMeta, error) {
	key := volumeKey(volume)
	if snap != "" {
		key = snapshotKey(volume, snap)
	}
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		if snap != "" {
			return nil, fmt.Errorf("block: volume %q: snapshot %q: %w", volume, snap, ErrNotFound)
		}
		return nil, fmt.Errorf("block: volume %q: %w", volume, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: read metadata: %w", volume, err)
	}
	defer closer.Close()
	return decodePebbleMeta(v, volume, snap)
}

// decodePebbleMeta is decodeVolumeMeta plus the pebble backend's own
// invariant: a record names at least one layer.
func decodePebbleMeta(b []byte, volume, snap string) (*volumeMeta, error) {
	m, err := decodeVolumeMeta(b, volume, snap)
	if err == nil && len(m.Layers) == 0 {
		err = fmt.Errorf("block: volume %q metadata (snapshot %q): no layers: %w", volume, snap, ErrCorrupt)
	}
	return m, err
}

// exists reports whether key is present.
func (s *PebbleStore) exists(key []byte) (bool, error) {
	_, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, closer.Close()
}

// newLayerLocked allocates a layer id; the caller persists s.nextLayer in
// the same batch as the record that uses the id. REQUIRES: s.mu.
func (s *PebbleStore) newLayerLocked(b *pebble.Batch) uint64 {
	l := s.nextLayer
	s.nextLayer++
	_ = b.Set(keyNextLayer, binary.BigEndian.AppendUint64(nil, s.nextLayer), nil)
	return l
}

// commitMetaLocked applies a metadata batch durably. On failure the
// in-memory layer counter is left advanced, which only skips ids. On a
// file system with almost no space left the batch is refused before
// pebble logs it (admitWAL): pebble would die of ENOSPC in its WAL.
func (s *PebbleStore) commitMetaLocked(b *pebble.Batch, what string) error {
	defer b.Close()
	if err := s.space.admitWAL(true); err != nil {
		return fmt.Errorf("block: %s: %w", what, err)
	}
	if err := s.db.Apply(b, pebble.Sync); err != nil {
		return fmt.Errorf("block: %s: commit: %w", what, err)
	}
	return nil
}

// Create implements Store.
func (s *PebbleStore) Create(name string, size int64, blockSize int) (Volume, error) {
	bs, err := s.lockCreate(name, size, blockSize)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := s.checkOvercommitLocked(fmt.Sprintf("volume %q: create of %d bytes", name, size), 0, size); err != nil {
		return nil, err
	}
	return s.createLocked(&volumeMeta{Name: name, Size: size, BlockSize: bs}, nil)
}

// createLocked stores a new volume record with a fresh top layer over
// parents, and opens it. REQUIRES: s.mu.
func (s *PebbleStore) createLocked(m *volumeMeta, parents []uint64) (Volume, error) {
	key := volumeKey(m.Name)
	ok, err := s.exists(key)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: create: %w", m.Name, err)
	}
	if ok {
		return nil, fmt.Errorf("block: volume %q: create: %w", m.Name, ErrExists)
	}
	b := s.db.NewBatch()
	m.Format, m.Created, m.Generation = formatVersion, time.Now().UnixNano(), 1
	m.Layers = append([]uint64{s.newLayerLocked(b)}, parents...)
	_ = b.Set(key, encodeRecord(m), nil)
	if err := s.commitMetaLocked(b, fmt.Sprintf("volume %q: create", m.Name)); err != nil {
		return nil, err
	}
	return s.openCoreLocked(m.Name, m), nil
}

// openCoreLocked returns a new handle on the shared core for key,
// creating the core from m if no handle is open. REQUIRES: s.mu.
func (s *PebbleStore) openCoreLocked(key string, m *volumeMeta) Volume {
	c := s.open[key]
	if c == nil {
		c = newPebbleCore(s, m)
		s.open[key] = c
	}
	s.refs[c]++
	return newVolumeHandle(c, func() { s.release(key, c) })
}

func (s *PebbleStore) release(key string, c *pebbleCore) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unrefLocked(c) && s.open[key] == c {
		delete(s.open, key)
	}
}

// Open implements Store. A record that fails to decode gives ErrCorrupt,
// one from a newer format ErrFormatVersion.
func (s *PebbleStore) Open(name string) (Volume, error) {
	if err := s.lock("open " + name); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if c := s.open[name]; c != nil {
		return s.openCoreLocked(name, nil), nil
	}
	m, err := s.getMetaLocked(name, "")
	if err != nil {
		return nil, err
	}
	return s.openCoreLocked(name, m), nil
}

// scanMetaLocked decodes every record under prefix (volumes or snapshots).
func (s *PebbleStore) scanMetaLocked(prefix []byte, fn func(key []byte, m *volumeMeta) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		vol, snap := string(k[1:]), ""
		if k[0] == kindSnapshot {
			i := bytes.IndexByte(k[1:], 0)
			if i < 0 {
				_ = it.Close()
				return fmt.Errorf("block: snapshot key %q: %w", k, ErrCorrupt)
			}
			vol, snap = string(k[1:1+i]), string(k[2+i:])
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return err
		}
		m, err := decodePebbleMeta(v, vol, snap)
		if err == nil {
			err = fn(k, m)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	return firstErr(it.Error(), it.Close())
}

// List implements Store. A damaged record fails the whole list with
// ErrCorrupt naming the volume rather than hiding the volume.
func (s *PebbleStore) List() ([]VolumeInfo, error) {
	if err := s.lock("list"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := []VolumeInfo{}
	err := s.scanMetaLocked([]byte{kindVolume}, func(_ []byte, m *volumeMeta) error {
		out = append(out, m.info())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("block: pebble store %s: list: %w", s.dir, err)
	}
	return out, nil
}

// busyLocked reports ErrBusy if a handle on volume (or on one of its
// snapshots when snaps is set) is open. REQUIRES: s.mu.
func (s *PebbleStore) busyLocked(volume, snap string, snaps bool) error {
	for key, c := range s.open {
		if c.vol != volume || s.refs[c] == 0 {
			continue
		}
		if c.snap == snap || (snaps && c.snap != "") {
			return fmt.Errorf("block: %s is open: %w", key, ErrBusy)
		}
	}
	return nil
}

// Delete implements Store: the volume and all its snapshots go; layers no
// longer referenced by any volume, snapshot or clone are range-deleted in
// the same batch.
func (s *PebbleStore) Delete(name string) error { return s.delete(name, false) }

// DeleteIfNoSnapshots implements Snapshotter.
func (s *PebbleStore) DeleteIfNoSnapshots(name string) error { return s.delete(name, true) }

// delete is Delete, refusing a volume that has snapshots if alone.
func (s *PebbleStore) delete(name string, alone bool) error {
	if err := s.lock("delete " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	m, err := s.getMetaLocked(name, "")
	if err != nil {
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	if alone {
		n := 0
		err := s.scanMetaLocked(snapshotPrefix(name), func([]byte, *volumeMeta) error { n++; return nil })
		if err == nil && n > 0 {
			err = fmt.Errorf("%d snapshots: %w", n, ErrHasSnapshots)
		}
		if err != nil {
			return fmt.Errorf("block: volume %q: delete: %w", name, err)
		}
	}
	if err := s.busyLocked(name, "", true); err != nil {
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	b := s.db.NewBatch()
	_ = b.Delete(volumeKey(name), nil)
	candidates := append([]uint64(nil), m.Layers...)
	err = s.scanMetaLocked(snapshotPrefix(name), func(k []byte, sm *volumeMeta) error {
		candidates = append(candidates, sm.Layers...)
		return b.Delete(k, nil)
	})
	if err != nil {
		_ = b.Close()
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	drop := func(k []byte) bool {
		return bytes.Equal(k, volumeKey(name)) || bytes.HasPrefix(k, snapshotPrefix(name))
	}
	if err := s.gcLocked(b, candidates, drop); err != nil {
		_ = b.Close()
		return fmt.Errorf("block: volume %q: delete: %w", name, err)
	}
	return s.commitMetaLocked(b, fmt.Sprintf("volume %q: delete", name))
}

// gcLocked adds to b the deletion of every candidate layer that no record
// other than those matched by dropped still references. It refuses (and
// deletes nothing) if any record fails to decode: data is never dropped on
// a guess. REQUIRES: s.mu.
func (s *PebbleStore) gcLocked(b *pebble.Batch, candidates []uint64, dropped func([]byte) bool) error {
	used := map[uint64]bool{}
	mark := func(k []byte, m *volumeMeta) error {
		if !dropped(k) {
			for _, l := range m.Layers {
				used[l] = true
			}
		}
		return nil
	}
	if err := s.scanMetaLocked([]byte{kindVolume}, mark); err != nil {
		return err
	}
	if err := s.scanMetaLocked([]byte{kindSnapshot}, mark); err != nil {
		return err
	}
	for _, l := range candidates {
		if !used[l] {
			used[l] = true // once
			_ = b.DeleteRange(dataKey(l, 0), layerEnd(l), nil)
			_ = b.RangeKeyDelete(dataKey(l, 0), layerEnd(l), nil)
		}
	}
	return nil
}

// Close implements Store: it closes every open handle's volume (their
// calls then fail with ErrClosed) and closes pebble, which syncs the WAL.
func (s *PebbleStore) Close() error {
	if err := s.lock("close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	for _, c := range s.open {
		// Waits for in-flight I/O: pebble must not be used after Close.
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
	}
	// A final sync so writes acknowledged without FUA are durable too;
	// but not on a file system with no room left for its record
	// (admitWAL): pebble would die of it, in the middle of the close.
	// pebble's Close syncs the WAL all the same (LogWriter.Close), only
	// without a record of its own.
	var err error
	if s.space.admitWAL(true) == nil {
		err = s.db.LogData(nil, pebble.Sync)
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("block: pebble store %s: close: %w", s.dir, err)
	}
	return nil
}
