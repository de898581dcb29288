//go:build ceph && pacific

package block

// One open RBD image: the reads, writes, flushes, discards and resizes
// an rbd volume's handle runs.

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ceph/go-ceph/rbd"
)

// closeLocked closes the image once. REQUIRES: c.mu held exclusively.
func (c *rbdCore) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.watch != nil {
		_ = c.watch.Unwatch()
		c.watch = nil
	}
	err := c.io.close()
	if cerr := c.img.Close(); err == nil {
		err = cerr
	}
	if c.client != nil {
		c.client.close()
	}
	if err != nil {
		return fmt.Errorf("block: volume %q: close: %w", c.nm, rbdErr(err))
	}
	return nil
}

// checkWrite is checkReq for a request that writes, which a fenced image
// also refuses (ErrFenced): its client was blocklisted, or Reconnect gave
// it a new one that does not hold the lock yet and must not take it by
// writing (librbd's exclusive-lock feature would acquire a free lock on
// the first write). REQUIRES: c.mu, read or write.
func (c *rbdCore) checkWrite(op string, off, n int64) error {
	if err := c.checkReq(op, off, n, c.sz, true); err != nil {
		return err
	}
	if c.fenced.Load() {
		return ioErr(c.nm, op, n, off, fmt.Errorf("fenced, the lock not taken again: %w", ErrFenced))
	}
	return nil
}

func (c *rbdCore) caps() Caps {
	if c.readOnly {
		return CapFlush | CapFUA | CapPersistent | CapSnapshot
	}
	return CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapPersistent
}

func (c *rbdCore) readAt(p []byte, off int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.checkReq("read", off, n, c.sz, false); err != nil {
		return err
	}
	if _, err := c.io.ReadAt(p, off); err != nil {
		return c.ioFailed("read", n, off, err)
	}
	return nil
}

// writeAt is a write, then for FUA a flush: librbd has no
// per-request FUA, and its flush covers this write and all before it.
func (c *rbdCore) writeAt(p []byte, off int64, fua bool) error {
	op := writeOp(fua)
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.checkWrite(op, off, n); err != nil {
		return err
	}
	_, err := c.io.WriteAt(p, off)
	if err == nil && fua {
		err = c.io.Flush()
	}
	if err != nil {
		return c.ioFailed(op, n, off, err)
	}
	return nil
}

func (c *rbdCore) flush() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.usable("flush", false); err != nil {
		return err
	}
	if c.readOnly {
		return nil
	}
	err := c.io.Flush()
	if err == nil && c.fenced.Load() {
		err = ErrFenced
	}
	if err == nil && (c.st.o.Exclusive || c.locked.Load()) {
		// With librbd's cache off a flush has nothing to wait for and
		// succeeds on a blocklisted client; a gateway must learn here
		// that it no longer owns the image.
		var own bool
		if own, err = c.io.LockIsExclusiveOwner(); err == nil && !own {
			err = fmt.Errorf("lost the exclusive lock: %w", ErrFenced)
		}
	}
	if err != nil {
		err = rbdErr(err)
		if errors.Is(err, ErrFenced) {
			c.fenced.Store(true)
		}
		return fmt.Errorf("block: volume %q: flush: %w", c.nm, err)
	}
	return nil
}

// ioFailed wraps a failed request's error; a fenced one makes the core
// fenced (a blocklisted client stays so), so that later writes and
// flushes fail too, until Reconnect and AcquireLock. It runs under
// c.mu, so the error is the current client's: Reconnect swaps clients
// only while no request runs.
func (c *rbdCore) ioFailed(op string, n, off int64, err error) error {
	err = rbdErr(err)
	if errors.Is(err, ErrFenced) {
		c.fenced.Store(true)
	}
	return ioErr(c.nm, op, n, off, err)
}

// discard is rbd_aio_discard; with rbd_skip_partial_discard off (set when the
// store connects) the range reads as zeros afterwards, whole objects are
// deallocated and partial ones zeroed.
func (c *rbdCore) discard(off, n int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.checkWrite("discard", off, n); err != nil {
		return err
	}
	if err := c.io.Discard(uint64(off), uint64(n)); err != nil {
		return c.ioFailed("discard", n, off, err)
	}
	return nil
}

// writeZeroes is rbd_aio_writesame of a zero block, which librbd turns
// into a discard of the whole objects it covers
// (rbd_discard_on_zeroed_write_same).
func (c *rbdCore) writeZeroes(off, n int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.checkWrite("write-zeroes", off, n); err != nil {
		return err
	}
	if err := c.io.WriteSame(uint64(off), uint64(n), c.zero); err != nil {
		return c.ioFailed("write-zeroes", n, off, err)
	}
	return nil
}

// resize is rbd_resize (a shrink drops the objects beyond the new end, so
// growing again exposes zeros), then the generation is recorded.
func (c *rbdCore) resize(n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.resizable(n); err != nil {
		return err
	}
	what := fmt.Sprintf("volume %q: resize to %d", c.nm, n)
	if err := c.io.Resize(uint64(n)); err != nil {
		return fmt.Errorf("block: %s: %w", what, rbdErr(err))
	}
	c.sz = n
	c.gen++
	if err := c.io.SetMetadata(rbdMetaGeneration, strconv.FormatUint(c.gen, 10)); err != nil {
		return fmt.Errorf("block: %s: record generation: %w", what, rbdErr(err))
	}
	return nil
}

// allocated asks librbd's diff-iterate from the image's creation with
// whole-object granularity, which the object map answers without reading
// data (fast-diff); runs are whole RBD objects (4 MiB by default), more
// than the truth, never less. A clone includes its parent's data.
func (c *rbdCore) allocated(off, end int64, yield func(off, end int64) bool) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	end, err := c.allocRange(off, end, c.sz)
	if err != nil || off >= end {
		return off, err
	}
	bs := int64(c.bs)
	stopped := int64(-1)
	err = c.img.DiffIterate(rbd.DiffIterateConfig{
		Offset:        uint64(off),
		Length:        uint64(end - off),
		IncludeParent: rbd.IncludeParent,
		WholeObject:   rbd.EnableWholeObject,
		Callback: func(o, l uint64, exists int, _ interface{}) int {
			if exists == 0 {
				return 0
			}
			from, to := max(int64(o)/bs*bs, off), min((int64(o+l)+bs-1)/bs*bs, end)
			if to <= from {
				return 0
			}
			if !yield(from, to) {
				stopped = to
				return 1
			}
			return 0
		},
	})
	if stopped >= 0 {
		return stopped, nil
	}
	if err != nil {
		return 0, ioErr(c.nm, "allocated", end-off, off, rbdErr(err))
	}
	return end, nil
}
