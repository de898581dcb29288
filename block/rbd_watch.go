//go:build ceph && pacific

package block

// The fence watch: a gateway hears that another gateway broke a lock it
// held as soon as the cluster has blocklisted its client, without
// waiting for a request of its own to fail.

import (
	"errors"
	"sync"
)

// fenceWatch is an RBDStore's watch over the locks its shared images
// hold. librbd tells an image's update watchers (rbd_update_watch) when
// its header changes, and a lock break is one such change: the old
// owner's callback runs as the break completes, and from then on its
// rbd_is_exclusive_lock_owner fails with ESHUTDOWN (measured on Ceph
// 16.2: the callback came 0.67 s after the break started, the break's
// own duration). The callback runs on a librbd thread, where nothing may
// block or call back into librbd, so it only notes the image; the
// store's watch goroutine asks librbd and tells WatchFenced's function.
type fenceWatch struct {
	mu      sync.Mutex
	f       func(volume string) // WatchFenced's; never nil once set
	pending map[*rbdCore]bool
	kick    chan struct{} // capacity 1: pending has entries
	stop    chan struct{} // closed by halt; nil: nobody watches
	done    chan struct{} // closed when the goroutine returns
}

// WatchFenced has f called with each volume whose lock this store held
// when another client broke it, as soon as the cluster says so (the
// gateway catalog's FenceWatcher). f is called from a goroutine the
// store owns, one volume at a time, and may block (the catalog
// reconnects the volume in it); Close stops it.
func (s *RBDStore) WatchFenced(f func(volume string)) {
	w := &s.fw
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f = f
	if w.stop != nil {
		return
	}
	w.pending = map[*rbdCore]bool{}
	w.kick = make(chan struct{}, 1)
	w.stop, w.done = make(chan struct{}), make(chan struct{})
	go s.watchLoop(w.stop, w.done)
}

// watchImage starts watching a shared image whose lock AcquireLock just
// took, unless nobody watches or it is watched already; a watch that
// cannot be set up leaves fencing to be found at the next request.
// REQUIRES: s.mu.
func (s *RBDStore) watchImage(c *rbdCore) {
	s.fw.mu.Lock()
	on := s.fw.stop != nil
	s.fw.mu.Unlock()
	if !on || c.watch != nil || c.client == nil {
		return
	}
	if w, err := c.img.UpdateWatch(func(interface{}) { s.fw.note(c) }, nil); err == nil {
		c.watch = w
	}
}

// note records that c's header changed; it runs on librbd's callback
// thread and never blocks.
func (w *fenceWatch) note(c *rbdCore) {
	w.mu.Lock()
	w.pending[c] = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// watchLoop checks each noted image until halt.
func (s *RBDStore) watchLoop(stop, done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-s.fw.kick:
		}
		s.fw.mu.Lock()
		cores, f := s.fw.pending, s.fw.f
		s.fw.pending = map[*rbdCore]bool{}
		s.fw.mu.Unlock()
		for c := range cores {
			if name, ok := c.lostLock(); ok {
				f(name)
			}
		}
	}
}

// lostLock reports whether an image that held its lock and was not
// fenced now finds its client blocklisted, and marks it fenced if so. A
// header change of another kind (a resize, a snapshot, image metadata)
// leaves it as it was: only librbd's ESHUTDOWN is taken as proof, the
// other signs (the lock not ours, without an error) are left to the next
// flush to judge.
func (c *rbdCore) lostLock() (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed || !c.locked.Load() || c.fenced.Load() {
		return "", false
	}
	if _, err := c.io.LockIsExclusiveOwner(); err == nil || !errors.Is(rbdErr(err), ErrFenced) {
		return "", false
	}
	c.fenced.Store(true)
	return c.nm, true
}

// halt stops the watch goroutine and waits for it (a call of f under
// way finishes first); no image is watched after it. f stays set: the
// goroutine may have taken a kick before the stop and still call it.
// It must not be called with s.mu held: f may reconnect a volume, which
// takes it.
func (w *fenceWatch) halt() {
	w.mu.Lock()
	stop, done := w.stop, w.done
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}
