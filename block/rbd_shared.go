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
// refuses (it never hands it over), so the call fails instead of
// waiting for it.
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
		if err := c.img.LockAcquire(rbd.LockModeExclusive); err != nil {
			return fmt.Errorf("block: volume %q: take the exclusive lock (held by another client?): %w: %w", name, ErrBusy, err)
		}
	}
	c.locked.Store(true)
	return nil
}
