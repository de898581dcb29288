package block

import (
	"fmt"
	"sync"
)

// storeState is the lifecycle every store shares: the mutex its
// metadata changes hold, the closed bit they check under it, and how many
// handles each open core has (a store refuses to delete what is open,
// and forgets a core when its last handle closes).
type storeState[C comparable] struct {
	what string // the store, in errors: "memory store", "file store DIR"

	mu     sync.Mutex
	closed bool
	refs   map[C]int
}

func newStoreState[C comparable](what string) storeState[C] {
	return storeState[C]{what: what, refs: map[C]int{}}
}

func (s *storeState[C]) errClosed(op string) error {
	return fmt.Errorf("block: %s: %s: %w", s.what, op, ErrClosed)
}

// lock takes mu, or fails with ErrClosed, op naming the call, once the
// store is closed.
func (s *storeState[C]) lock(op string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.errClosed(op)
	}
	return nil
}

// lockCreate validates the arguments of a Create (see checkCreate) and
// takes mu as lock does; it returns the block size to use.
func (s *storeState[C]) lockCreate(name string, size int64, blockSize int) (int, error) {
	bs, err := checkCreate(name, size, blockSize)
	if err == nil {
		err = s.lock("create " + name)
	}
	return bs, err
}

// unrefLocked drops one handle's count on c and reports whether it was
// the last. REQUIRES: s.mu.
func (s *storeState[C]) unrefLocked(c C) bool {
	if s.refs[c]--; s.refs[c] > 0 {
		return false
	}
	delete(s.refs, c)
	return true
}

// coreState is what the cores of every backend share: the volume's name
// and block size, and the lock and closed bit their calls check under.
type coreState struct {
	nm       string // "volume", or "volume@snapshot" for a snapshot
	bs       int
	readOnly bool
	id       uint64 // Volume.Identity; 0 if the backend knows none

	// mu: I/O holds it shared, so that a request sees one size from
	// check to end; resize, snapshot and close hold it exclusively and so
	// wait for in-flight I/O.
	mu     sync.RWMutex
	closed bool // store closed or volume deleted
}

func (c *coreState) name() string     { return c.nm }
func (c *coreState) identity() uint64 { return c.id }
func (c *coreState) blockSize() int   { return c.bs }

// sizedState is the coreState of a core that keeps the volume's size
// itself (file, mem, rbd); pebble's is in its metadata.
type sizedState struct {
	coreState
	sz int64 // guarded by mu
}

func (c *sizedState) size() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.sz
}

// checkReq validates an I/O request on a volume of size bytes.
// REQUIRES: c.mu (shared is enough).
func (c *coreState) checkReq(op string, off, n, size int64, write bool) error {
	if c.closed {
		return ioErr(c.nm, op, n, off, ErrClosed)
	}
	if write && c.readOnly {
		return ioErr(c.nm, op, n, off, ErrReadOnly)
	}
	return checkIO(c.nm, op, off, n, size, c.bs)
}

// allocRange is the start of every core's allocated: [off, end) cut to
// the volume's size bytes, or ErrClosed. REQUIRES: c.mu (shared is
// enough).
func (c *coreState) allocRange(off, end, size int64) (int64, error) {
	if c.closed {
		return end, ioErr(c.nm, "allocated", end-off, off, ErrClosed)
	}
	return min(end, size), nil
}

// usable is the check of a call that moves no data (flush, resize):
// what names it. REQUIRES: c.mu.
func (c *coreState) usable(what string, write bool) error {
	if c.closed {
		return fmt.Errorf("block: volume %q: %s: %w", c.nm, what, ErrClosed)
	}
	if write && c.readOnly {
		return fmt.Errorf("block: volume %q: %s: %w", c.nm, what, ErrReadOnly)
	}
	return nil
}

// resizable is the check of a resize to n bytes: the volume is usable
// for writing and n is a size it can have. REQUIRES: c.mu.
func (c *coreState) resizable(n int64) error {
	if err := c.usable(fmt.Sprintf("resize to %d", n), true); err != nil {
		return err
	}
	return checkSize(c.nm, n, c.bs)
}

// namedCore is a core that a store keeps by name in a map of open cores
// (file, rbd): its coreState's lock guards the close.
type namedCore interface {
	comparable
	core
	state() *coreState
	closeLocked() error
}

func (c *coreState) state() *coreState { return c }

// openNamedLocked records c as open under its name and returns a new
// handle on it; the last handle's Close forgets c and closes it.
// REQUIRES: s.mu.
func openNamedLocked[C namedCore](s *storeState[C], open map[string]C, c C) Volume {
	open[c.name()] = c
	s.refs[c]++
	return newHandle(c, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.unrefLocked(c) {
			return
		}
		if open[c.name()] == c {
			delete(open, c.name())
		}
		st := c.state()
		st.mu.Lock()
		_ = c.closeLocked()
		st.mu.Unlock()
	})
}

// closeAllLocked closes every open core (a store's Close) and returns
// the first error. REQUIRES: the store's mu.
func closeAllLocked[C namedCore](open map[string]C) error {
	var err error
	for _, c := range open {
		st := c.state()
		st.mu.Lock()
		if e := c.closeLocked(); err == nil {
			err = e
		}
		st.mu.Unlock()
	}
	return err
}
