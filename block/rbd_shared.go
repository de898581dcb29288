//go:build ceph && pacific

package block

// Shared opens: the images a gateway exports, each through a client of
// its own and locked only while it serves them (SharedOpener,
// Reconnector).

import (
	"errors"
	"fmt"

	"github.com/ceph/go-ceph/rbd"
)

var (
	_ SharedOpener   = (*RBDStore)(nil)
	_ Reconnector    = (*RBDStore)(nil)
	_ VolumeMetadata = (*RBDStore)(nil)
)

// OpenShared implements SharedOpener. A volume this store already has
// open, shared or not, gets another handle to the same image.
func (s *RBDStore) OpenShared(name string) (Volume, error) { return s.openVolume(name, true) }

// openSharedLocked opens an image through a new client of its own: a
// lock break blocklists a client, that is every image it has open, so
// a gateway whose images shared one client would lose them all when
// another gateway takes one over (tcmu-runner connects each image for
// the same reason). REQUIRES: s.mu.
func (s *RBDStore) openSharedLocked(name string) (Volume, error) {
	cl, err := dialRBD(s.o)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: open: %w", name, err)
	}
	c, err := s.openImage(cl.ioctx, name, "")
	if err != nil {
		cl.close()
		return nil, err
	}
	c.client = cl
	return openNamedLocked(&s.storeState, s.open, c), nil
}

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
	if c.fenced.Load() && !c.reconnected {
		// A blocklisted client stays so: it can never own the image
		// again (rbd_lock_acquire would fail with ESHUTDOWN anyway),
		// and librbd may still think it owns the lock.
		return fmt.Errorf("block: volume %q: lock: this client was fenced (reconnect first): %w", name, ErrFenced)
	}
	if own, err := c.io.LockIsExclusiveOwner(); err != nil || !own {
		if owners, err := c.io.LockGetOwners(); err == nil && len(owners) > 0 {
			return fmt.Errorf("block: volume %q: the exclusive lock is held by %s: %w", name, owners[0].Owner, ErrBusy)
		}
		if err := c.io.LockAcquire(rbd.LockModeExclusive); err != nil {
			return fmt.Errorf("block: volume %q: take the exclusive lock (held by another client?): %w: %w", name, ErrBusy, err)
		}
	}
	c.reconnected = false
	c.fenced.Store(false)
	c.locked.Store(true)
	s.watchImage(c)
	return nil
}

// Reconnect implements Reconnector: a new client opens the image, the
// handles are moved to it while no request runs (the image's lock held
// exclusively), and the old image and client are closed after; librbd
// fails whatever the old client still had in flight (ESHUTDOWN, it is
// blocklisted). The image stays fenced, refusing writes and flushes,
// until AcquireLock.
func (s *RBDStore) Reconnect(name string) error {
	if err := s.lock("reconnect " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	c := s.open[name]
	if c == nil || c.client == nil {
		return fmt.Errorf("block: volume %q: reconnect: not open shared here: %w", name, ErrInvalid)
	}
	cl, err := dialRBD(s.o)
	if err != nil {
		return fmt.Errorf("block: volume %q: reconnect: %w", name, err)
	}
	nc, err := s.openHandles(cl.ioctx, name, "")
	if err != nil {
		cl.close()
		return fmt.Errorf("block: volume %q: reconnect: %w", name, rbdErr(err))
	}
	c.mu.Lock()
	oldIO, oldImg, oldCl, oldWatch := c.io, c.img, c.client, c.watch
	c.io, c.img, c.client, c.watch = nc.io, nc.img, cl, nil
	c.fenced.Store(true)
	c.locked.Store(false)
	c.reconnected = true
	c.mu.Unlock()
	if oldWatch != nil {
		_ = oldWatch.Unwatch()
	}
	_ = oldIO.close()
	_ = oldImg.Close()
	oldCl.close()
	return nil
}

// openCore returns the open image of the volume named name, its lock
// taken for reading (the caller unlocks it): Reconnect does not swap
// its client meanwhile.
func (s *RBDStore) openCore(op, name string) (*rbdCore, error) {
	if err := s.lock(op + " " + name); err != nil {
		return nil, err
	}
	c := s.open[name]
	s.mu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("block: volume %q: %s: not open here: %w", name, op, ErrInvalid)
	}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return nil, fmt.Errorf("block: volume %q: %s: %w", name, op, ErrClosed)
	}
	return c, nil
}

// Metadata implements VolumeMetadata: rbd_metadata_get, which reads the
// image's header object.
func (s *RBDStore) Metadata(name, key string) (string, error) {
	c, err := s.openCore("read metadata", name)
	if err != nil {
		return "", err
	}
	defer c.mu.RUnlock()
	v, err := c.img.GetMetadata(key)
	if err = rbdErr(err); errors.Is(err, ErrNotFound) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("block: volume %q: read metadata %s: %w", name, key, err)
	}
	return v, nil
}

// SetMetadata implements VolumeMetadata: rbd_metadata_set through the
// handle that holds the lock. Without the lock librbd would not refuse:
// it sends the change to the lock's owner, which makes it.
func (s *RBDStore) SetMetadata(name, key, value string) error {
	c, err := s.openCore("write metadata", name)
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	own := false
	if !c.fenced.Load() {
		if own, err = c.io.LockIsExclusiveOwner(); err != nil {
			return fmt.Errorf("block: volume %q: write metadata %s: %w", name, key, rbdErr(err))
		}
	}
	if !own {
		return fmt.Errorf("block: volume %q: write metadata %s: this client does not hold the lock: %w", name, key, ErrFenced)
	}
	if err := c.io.SetMetadata(key, value); err != nil {
		err = rbdErr(err)
		if errors.Is(err, ErrFenced) {
			c.fenced.Store(true)
		}
		return fmt.Errorf("block: volume %q: write metadata %s: %w", name, key, err)
	}
	return nil
}
