package block

import (
	"fmt"
	"sort"
	"time"
)

// MemStore is the memory backend: volumes live in anonymous memory, in
// chunks of contiguous blocks (see blockTable), and vanish with the
// process. It exists for tests and for measuring the transport without
// storage. Flush and FUA succeed trivially (there is
// no stable storage to reach), so its volumes report CapFlush and CapFUA
// but not CapPersistent; I/O never waits, so they report CapImmediate.
// Snapshots share unchanged chunks with the volume.
type MemStore struct {
	storeState[*memCore]
	vols  map[string]*memCore
	snaps map[string]map[string]*memCore // volume → snapshot → frozen core
}

var (
	_ Store       = (*MemStore)(nil)
	_ Snapshotter = (*MemStore)(nil)
)

// NewMemStore returns an empty memory store.
func NewMemStore() *MemStore {
	return &MemStore{storeState: newStoreState[*memCore]("memory store"), vols: map[string]*memCore{}, snaps: map[string]map[string]*memCore{}}
}

// memCore is a memory volume or snapshot.
type memCore struct {
	sizedState
	created time.Time

	// Guarded by mu:
	gen    uint64 // bumped by every snapshot and resize (VolumeInfo.Generation)
	blocks blockTable
}

// Create implements Store.
func (s *MemStore) Create(name string, size int64, blockSize int) (Volume, error) {
	bs, err := s.lockCreate(name, size, blockSize)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if _, ok := s.vols[name]; ok {
		return nil, fmt.Errorf("block: volume %q: create: %w", name, ErrExists)
	}
	now := time.Now()
	c := &memCore{sizedState: sizedState{coreState{nm: name, bs: bs, id: volumeIdentity(name, "", now.UnixNano())}, size},
		created: now, gen: 1, blocks: newBlockTable(bs)}
	s.vols[name] = c
	return s.openLocked(c), nil
}

func (s *MemStore) openLocked(c *memCore) Volume {
	s.refs[c]++
	return newHandle(c, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.unrefLocked(c)
	})
}

// Open implements Store.
func (s *MemStore) Open(name string) (Volume, error) {
	if err := s.lock("open " + name); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	c, ok := s.vols[name]
	if !ok {
		return nil, fmt.Errorf("block: volume %q: open: %w", name, ErrNotFound)
	}
	return s.openLocked(c), nil
}

// List implements Store.
func (s *MemStore) List() ([]VolumeInfo, error) {
	if err := s.lock("list"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make([]VolumeInfo, 0, len(s.vols))
	for _, c := range s.vols {
		c.mu.RLock()
		out = append(out, VolumeInfo{Name: c.nm, Size: c.sz, BlockSize: c.bs, Created: c.created, Generation: c.gen})
		c.mu.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete implements Store.
func (s *MemStore) Delete(name string) error { return s.delete(name, false) }

// DeleteIfNoSnapshots implements Snapshotter.
func (s *MemStore) DeleteIfNoSnapshots(name string) error { return s.delete(name, true) }

// delete removes a volume and its snapshots, or refuses one that has
// snapshots if alone.
func (s *MemStore) delete(name string, alone bool) error {
	if err := s.lock("delete " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	c, ok := s.vols[name]
	if !ok {
		return fmt.Errorf("block: volume %q: delete: %w", name, ErrNotFound)
	}
	if n := len(s.snaps[name]); alone && n > 0 {
		return fmt.Errorf("block: volume %q: delete: %d snapshots: %w", name, n, ErrHasSnapshots)
	}
	if s.refs[c] > 0 {
		return fmt.Errorf("block: volume %q: delete: %d open handles: %w", name, s.refs[c], ErrBusy)
	}
	for sn, sc := range s.snaps[name] {
		if s.refs[sc] > 0 {
			return fmt.Errorf("block: volume %q: delete: snapshot %q is open: %w", name, sn, ErrBusy)
		}
	}
	snaps := s.snaps[name]
	delete(s.vols, name)
	delete(s.snaps, name)
	c.drop()
	for _, sc := range snaps {
		sc.drop()
	}
	return nil
}

// Close implements Store; every open handle then fails with ErrClosed.
func (s *MemStore) Close() error {
	if err := s.lock("close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	for _, c := range s.vols {
		c.drop()
	}
	for _, snaps := range s.snaps {
		for _, sc := range snaps {
			sc.drop()
		}
	}
	s.vols, s.snaps = nil, nil
	return nil
}

// drop closes c and gives its memory back; handles still open then fail
// with ErrClosed. The store drops a core when it removes it from vols or
// snaps, and every core there at Close.
func (c *memCore) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.blocks.release()
}

// Snapshot implements Snapshotter.
func (s *MemStore) Snapshot(volume, snap string) (SnapshotInfo, error) {
	if err := checkName("snapshot", snap); err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.lock("snapshot " + volume); err != nil {
		return SnapshotInfo{}, err
	}
	defer s.mu.Unlock()
	c, ok := s.vols[volume]
	if !ok {
		return SnapshotInfo{}, fmt.Errorf("block: volume %q: snapshot %q: %w", volume, snap, ErrNotFound)
	}
	if _, ok := s.snaps[volume][snap]; ok {
		return SnapshotInfo{}, fmt.Errorf("block: volume %q: snapshot %q: %w", volume, snap, ErrExists)
	}
	c.mu.Lock()
	sc := c.freezeLocked(volume+"@"+snap, true)
	c.mu.Unlock()
	if s.snaps[volume] == nil {
		s.snaps[volume] = map[string]*memCore{}
	}
	s.snaps[volume][snap] = sc
	return SnapshotInfo{Volume: volume, Name: snap, Size: sc.sz, BlockSize: sc.bs, Created: sc.created}, nil
}

// freezeLocked returns a new core sharing c's chunks; each copies a shared
// chunk before changing it. REQUIRES: c.mu.
func (c *memCore) freezeLocked(name string, readOnly bool) *memCore {
	blocks := c.blocks.clone()
	c.gen++
	now := time.Now()
	return &memCore{sizedState: sizedState{coreState{nm: name, bs: c.bs, readOnly: readOnly, id: volumeIdentity(name, "", now.UnixNano())}, c.sz},
		created: now, gen: c.gen + 1, blocks: blocks}
}

// Snapshots implements Snapshotter.
func (s *MemStore) Snapshots(volume string) ([]SnapshotInfo, error) {
	if err := s.lock("snapshots " + volume); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if _, ok := s.vols[volume]; !ok {
		return nil, fmt.Errorf("block: volume %q: snapshots: %w", volume, ErrNotFound)
	}
	out := []SnapshotInfo{}
	for n, sc := range s.snaps[volume] {
		out = append(out, SnapshotInfo{Volume: volume, Name: n, Size: sc.sz, BlockSize: sc.bs, Created: sc.created})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *MemStore) snapLocked(op, volume, snap string) (*memCore, error) {
	if s.closed {
		return nil, s.errClosed(op + " " + volume + "@" + snap)
	}
	sc, ok := s.snaps[volume][snap]
	if !ok {
		return nil, fmt.Errorf("block: volume %q: %s snapshot %q: %w", volume, op, snap, ErrNotFound)
	}
	return sc, nil
}

// OpenSnapshot implements Snapshotter.
func (s *MemStore) OpenSnapshot(volume, snap string) (Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, err := s.snapLocked("open", volume, snap)
	if err != nil {
		return nil, err
	}
	return s.openLocked(sc), nil
}

// DeleteSnapshot implements Snapshotter.
func (s *MemStore) DeleteSnapshot(volume, snap string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, err := s.snapLocked("delete", volume, snap)
	if err != nil {
		return err
	}
	if s.refs[sc] > 0 {
		return fmt.Errorf("block: volume %q: delete snapshot %q: %w", volume, snap, ErrBusy)
	}
	delete(s.snaps[volume], snap)
	sc.drop()
	return nil
}

// Clone implements Snapshotter.
func (s *MemStore) Clone(volume, snap, newName string) (Volume, error) {
	if err := checkName("volume", newName); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, err := s.snapLocked("clone", volume, snap)
	if err != nil {
		return nil, err
	}
	if _, ok := s.vols[newName]; ok {
		return nil, fmt.Errorf("block: volume %q: clone from %s@%s: %w", newName, volume, snap, ErrExists)
	}
	sc.mu.Lock()
	c := sc.freezeLocked(newName, false)
	sc.mu.Unlock()
	s.vols[newName] = c
	return s.openLocked(c), nil
}

func (c *memCore) caps() Caps {
	if c.readOnly {
		return CapFlush | CapImmediate
	}
	return CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapImmediate
}

// check validates a request. REQUIRES: c.mu (read or write).
func (c *memCore) check(op string, off, n int64, write bool) error {
	return c.checkReq(op, off, n, c.sz, write)
}

func (c *memCore) readAt(p []byte, off int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.check("read", off, int64(len(p)), false); err != nil {
		return err
	}
	c.blocks.read(p, off/int64(c.bs))
	return nil
}

func (c *memCore) writeAt(p []byte, off int64, fua bool) error {
	op := writeOp(fua)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(op, off, int64(len(p)), true); err != nil {
		return err
	}
	if err := c.blocks.write(p, off/int64(c.bs)); err != nil {
		return ioErr(c.nm, op, int64(len(p)), off, err)
	}
	return nil
}

func (c *memCore) flush() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.usable("flush", false)
}

// zero drops the blocks of [off, off+n); a dropped block reads as zeros.
func (c *memCore) zero(op string, off, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(op, off, n, true); err != nil {
		return err
	}
	bs := int64(c.bs)
	c.blocks.deleteRange(off/bs, (off+n)/bs)
	return nil
}

func (c *memCore) discard(off, n int64) error     { return c.zero("discard", off, n) }
func (c *memCore) writeZeroes(off, n int64) error { return c.zero("write-zeroes", off, n) }

func (c *memCore) resize(n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.resizable(n); err != nil {
		return err
	}
	c.blocks.deleteRange(n/int64(c.bs), maxBlocks)
	c.sz = n
	c.gen++
	return nil
}
