package block

import (
	"bytes"
	"fmt"
	"sort"
	"time"
)

// The pebble store's snapshots and clones: layers frozen under a name,
// and volumes that start from one.

// the snapshot's top layer and is never written again; the volume gets a
// fresh empty top layer. Cost: two small records, no data copied.
func (s *PebbleStore) Snapshot(volume, snap string) (SnapshotInfo, error) {
	if err := checkName("snapshot", snap); err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.lock("snapshot " + volume); err != nil {
		return SnapshotInfo{}, err
	}
	defer s.mu.Unlock()
	what := fmt.Sprintf("volume %q: snapshot %q", volume, snap)
	m, err := s.getMetaLocked(volume, "")
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, err)
	}
	ok, err := s.exists(snapshotKey(volume, snap))
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, err)
	}
	if ok {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, ErrExists)
	}
	c := s.open[volume]
	if c != nil {
		// Exclude I/O: no write may land in the layer being frozen after
		// the snapshot is taken, and the open core's view must switch.
		c.mu.Lock()
		defer c.mu.Unlock()
		m = c.meta.clone()
	}
	sm := m.clone()
	sm.Snapshot, sm.Created = snap, time.Now().UnixNano()
	b := s.db.NewBatch()
	m.Layers = append([]uint64{s.newLayerLocked(b)}, m.Layers...)
	m.Generation++
	if len(m.Layers) > maxLayers {
		_ = b.Close()
		return SnapshotInfo{}, fmt.Errorf("block: %s: chain of %d layers: %w", what, len(m.Layers), ErrInvalid)
	}
	_ = b.Set(volumeKey(volume), encodeRecord(m), nil)
	_ = b.Set(snapshotKey(volume, snap), encodeRecord(sm), nil)
	if err := s.commitMetaLocked(b, what); err != nil {
		return SnapshotInfo{}, err
	}
	if c != nil {
		c.meta = m
	}
	return sm.snapInfo(), nil
}

// Snapshots implements Snapshotter.
func (s *PebbleStore) Snapshots(volume string) ([]SnapshotInfo, error) {
	if err := s.lock("snapshots " + volume); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if _, err := s.getMetaLocked(volume, ""); err != nil {
		return nil, err
	}
	out := []SnapshotInfo{}
	err := s.scanMetaLocked(snapshotPrefix(volume), func(_ []byte, m *volumeMeta) error {
		out = append(out, m.snapInfo())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: snapshots: %w", volume, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// OpenSnapshot implements Snapshotter.
func (s *PebbleStore) OpenSnapshot(volume, snap string) (Volume, error) {
	if err := s.lock("open " + volume + "@" + snap); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	key := volume + "@" + snap
	if c := s.open[key]; c != nil {
		return s.openCoreLocked(key, nil), nil
	}
	m, err := s.getMetaLocked(volume, snap)
	if err != nil {
		return nil, err
	}
	return s.openCoreLocked(key, m), nil
}

// DeleteSnapshot implements Snapshotter. Layers the volume or a clone
// still reads through stay; only layers nothing references are dropped.
func (s *PebbleStore) DeleteSnapshot(volume, snap string) error {
	if err := s.lock("delete " + volume + "@" + snap); err != nil {
		return err
	}
	defer s.mu.Unlock()
	m, err := s.getMetaLocked(volume, snap)
	if err != nil {
		return err
	}
	if err := s.busyLocked(volume, snap, false); err != nil {
		return fmt.Errorf("block: volume %q: delete snapshot %q: %w", volume, snap, err)
	}
	key := snapshotKey(volume, snap)
	b := s.db.NewBatch()
	_ = b.Delete(key, nil)
	if err := s.gcLocked(b, m.Layers, func(k []byte) bool { return bytes.Equal(k, key) }); err != nil {
		_ = b.Close()
		return fmt.Errorf("block: volume %q: delete snapshot %q: %w", volume, snap, err)
	}
	return s.commitMetaLocked(b, fmt.Sprintf("volume %q: delete snapshot %q", volume, snap))
}

// Clone implements Snapshotter: the new volume reads through the
// snapshot's layers below a fresh top layer, so no data is copied.
func (s *PebbleStore) Clone(volume, snap, newName string) (Volume, error) {
	if err := checkName("volume", newName); err != nil {
		return nil, err
	}
	if err := s.lock("clone " + volume + "@" + snap); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	sm, err := s.getMetaLocked(volume, snap)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: clone: %w", newName, err)
	}
	if len(sm.Layers)+1 > maxLayers {
		return nil, fmt.Errorf("block: volume %q: clone: chain of %d layers: %w", newName, len(sm.Layers)+1, ErrInvalid)
	}
	if err := s.checkOvercommitLocked(fmt.Sprintf("volume %q: clone of %d bytes", newName, sm.Size), 0, sm.Size); err != nil {
		return nil, err
	}
	return s.createLocked(&volumeMeta{Name: newName, Size: sm.Size, BlockSize: sm.BlockSize}, sm.Layers)
}

func (m *volumeMeta) clone() *volumeMeta {
	c := *m
	c.Layers = append([]uint64(nil), m.Layers...)
	return &c
}
