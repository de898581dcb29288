//go:build ceph && pacific

package block

// Shared opens: the images a gateway exports, locked only while it
// serves them (SharedOpener).

import (
	"fmt"

	"github.com/ceph/go-ceph/rbd"
)

var _ SharedOpener = (*RBDStore)(nil)

// OpenShared implements SharedOpener. A volume this store already has
// open, shared or not, gets another handle to the same image.
func (s *RBDStore) OpenShared(name string) (Volume, error) { return s.openVolume(name, false) }

// AcquireLock implements SharedOpener: librbd's rbd_lock_acquire in
// exclusive mode, which another owner that took the lock the same way
// refuses (it never hands it over). A lock another client holds is
// ErrBusy before librbd is asked at all: librbd would send the owner a
// lock request and, when the owner is dead but its watch not yet timed
// out, wait for the OSD to time the watch out (osd_client_watch_timeout,
// 30 s) before it fails.
func (s *RBDStore) AcquireLock(name string) error {
	if err := s.lock("lock " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	c := s.open[name]
	if c == nil || c.readOnly {
		return fmt.Errorf("block: volume %q: lock: not open for writing here: %w", name, ErrInvalid)
	}
	if c.fenced.Load() {
		// A blocklisted client stays so: it can never own the image
		// again (rbd_lock_acquire would fail with ESHUTDOWN anyway).
		return fmt.Errorf("block: volume %q: lock: this client was fenced: %w", name, ErrFenced)
	}
	if own, err := c.img.LockIsExclusiveOwner(); err != nil || !own {
		if owners, err := c.img.LockGetOwners(); err == nil && len(owners) > 0 {
			return fmt.Errorf("block: volume %q: the exclusive lock is held by %s: %w", name, owners[0].Owner, ErrBusy)
		}
		if err := c.img.LockAcquire(rbd.LockModeExclusive); err != nil {
			return fmt.Errorf("block: volume %q: take the exclusive lock (held by another client?): %w: %w", name, ErrBusy, err)
		}
	}
	c.locked.Store(true)
	return nil
}
