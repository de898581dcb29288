//go:build ceph && pacific

package block

// RBD snapshots and clones behind the rbd store's Snapshotter.

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/ceph/go-ceph/rbd"
)

// Snapshot implements Snapshotter.
func (s *RBDStore) Snapshot(volume, snap string) (SnapshotInfo, error) {
	if err := s.lock("snapshot " + volume); err != nil {
		return SnapshotInfo{}, err
	}
	defer s.mu.Unlock()
	if err := checkName("volume", volume); err != nil {
		return SnapshotInfo{}, err
	}
	if err := checkName("snapshot", snap); err != nil {
		return SnapshotInfo{}, err
	}
	what := fmt.Sprintf("volume %q: snapshot %q", volume, snap)
	c := s.open[volume]
	if c != nil {
		// Writes hold c.mu shared: the snapshot waits for those in
		// flight, and librbd's snapshot flushes its cache first.
		c.mu.Lock()
		defer c.mu.Unlock()
	} else {
		var err error
		if c, err = s.openHandles(s.ioctx, volume, ""); err != nil {
			return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, rbdErr(err))
		}
		defer c.closeHandles()
	}
	// Through the handle that may hold the lock: a snapshot needs it.
	if err := c.io.CreateSnapshot(snap); err != nil {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	size, err := c.io.GetSize()
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	bs, gen := rbdImageMeta(c.img, int64(size))
	if err := c.io.SetMetadata(rbdMetaGeneration, strconv.FormatUint(gen+1, 10)); err != nil {
		return SnapshotInfo{}, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	c.gen = gen + 1
	return SnapshotInfo{Volume: volume, Name: snap, Size: int64(size), BlockSize: bs, Created: time.Now()}, nil
}

// Snapshots implements Snapshotter.
func (s *RBDStore) Snapshots(volume string) ([]SnapshotInfo, error) {
	if err := s.lock("snapshots " + volume); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := checkName("volume", volume); err != nil {
		return nil, err
	}
	img, err := rbd.OpenImageReadOnly(s.ioctx, volume, rbd.NoSnapshot)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: snapshots: %w", volume, rbdErr(err))
	}
	defer img.Close()
	size, _ := img.GetSize()
	bs, _ := rbdImageMeta(img, int64(size))
	snaps, err := userSnaps(img)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: snapshots: %w", volume, rbdErr(err))
	}
	out := []SnapshotInfo{}
	for _, sn := range snaps {
		var created time.Time
		if ts, err := img.GetSnapTimestamp(sn.Id); err == nil {
			created = time.Unix(ts.Sec, ts.Nsec)
		}
		out = append(out, SnapshotInfo{Volume: volume, Name: sn.Name, Size: int64(sn.Size), BlockSize: bs, Created: created})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// OpenSnapshot implements Snapshotter.
func (s *RBDStore) OpenSnapshot(volume, snap string) (Volume, error) {
	if err := s.lock("open snapshot " + volume); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if c := s.open[volume+"@"+snap]; c != nil {
		return openNamedLocked(&s.storeState, s.open, c), nil
	}
	if err := checkName("volume", volume); err != nil {
		return nil, err
	}
	if err := checkName("snapshot", snap); err != nil {
		return nil, err
	}
	c, err := s.openImage(s.ioctx, volume, snap)
	if err != nil {
		return nil, err
	}
	return openNamedLocked(&s.storeState, s.open, c), nil
}

// DeleteSnapshot implements Snapshotter; a snapshot with clones is ErrBusy.
func (s *RBDStore) DeleteSnapshot(volume, snap string) error {
	if err := s.lock("delete snapshot " + volume); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := checkName("volume", volume); err != nil {
		return err
	}
	if err := checkName("snapshot", snap); err != nil {
		return err
	}
	what := fmt.Sprintf("volume %q: delete snapshot %q", volume, snap)
	if s.open[volume+"@"+snap] != nil {
		return fmt.Errorf("block: %s: %w", what, ErrBusy)
	}
	img, err := rbd.OpenImage(s.ioctx, volume, rbd.NoSnapshot)
	if err != nil {
		return fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	defer img.Close()
	if err := removeSnap(img.GetSnapshot(snap)); err != nil {
		return fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	return nil
}

// Clone implements Snapshotter: an RBD clone (format 2) of the snapshot.
func (s *RBDStore) Clone(volume, snap, newName string) (Volume, error) {
	if err := s.lock("clone " + volume); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	for _, n := range [][2]string{{"volume", volume}, {"snapshot", snap}, {"volume", newName}} {
		if err := checkName(n[0], n[1]); err != nil {
			return nil, err
		}
	}
	what := fmt.Sprintf("volume %q: clone %q to %q", volume, snap, newName)
	parent, err := rbd.OpenImage(s.ioctx, volume, rbd.NoSnapshot)
	if err != nil {
		return nil, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	size, _ := parent.GetSize()
	bs, _ := rbdImageMeta(parent, int64(size))
	snapSize, err := rbdSnapSize(parent, snap)
	_ = parent.Close()
	if err != nil {
		return nil, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if snapSize == 0 {
		// librbd refuses to attach a parent of size 0 (EINVAL); a
		// clone of an empty snapshot is an empty volume.
		err = rbd.CreateImage(s.ioctx, newName, 0, opts)
	} else {
		err = rbd.CloneImage(s.ioctx, volume, snap, s.ioctx, newName, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	return s.openNewLocked(newName, bs, fmt.Sprintf("clone of %s@%s", volume, snap))
}

// userSnaps lists an image's own snapshots: rbd_snap_list also returns
// those in the snapshot trash (deleted, kept for clones), named by UUIDs.
func userSnaps(img *rbd.Image) ([]rbd.SnapInfo, error) {
	all, err := img.GetSnapshotNames()
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sn := range all {
		if t, err := img.GetSnapNamespaceType(sn.Id); err == nil && t == rbd.SnapNamespaceTypeUser {
			out = append(out, sn)
		}
	}
	return out, nil
}

// rbdSnapSize is the size of an image's snapshot (ErrNotFound if none).
func rbdSnapSize(img *rbd.Image, snap string) (uint64, error) {
	snaps, err := userSnaps(img)
	if err != nil {
		return 0, err
	}
	for _, sn := range snaps {
		if sn.Name == snap {
			return sn.Size, nil
		}
	}
	return 0, fmt.Errorf("snapshot %q: %w", snap, ErrNotFound)
}
