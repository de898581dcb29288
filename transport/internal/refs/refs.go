// Package refs counts, for the providers, what keeps a verbs resource in
// use: the memory regions, windows and queue pairs on a protection
// domain, the protection domains and completion queues on a device. The
// verbs refuse to free a resource while anything is still on it
// (ibv_dealloc_pd(3) and ibv_close_device(3) fail with EBUSY), and a
// closed resource takes nothing new. Creating an object on a resource
// holds it; destroying the object releases it:
//
//	if !pd.refs.Hold() {
//		return nil, fmt.Errorf("pd: %w", transport.ErrClosed)
//	}
//	...                 // on failure, and when the object is destroyed:
//	pd.refs.Release()
//
//	if n, _ := pd.refs.Close(); n > 0 { // in the PD's Close
//		return fmt.Errorf("pd with %d objects: %w", n, transport.ErrBusy)
//	}
package refs

import "sync"

// Count is how many objects hold a resource, and whether the resource is
// closed. Its zero value is an open resource that nothing holds.
type Count struct {
	mu     sync.Mutex
	closed bool
	n      int
}

// Hold counts one more holder; it reports false, counting nothing, once
// the resource is closed.
func (c *Count) Hold() bool {
	c.mu.Lock()
	ok := !c.closed
	if ok {
		c.n++
	}
	c.mu.Unlock()
	return ok
}

// Release drops a holder that Hold counted.
func (c *Count) Release() {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
}

// Close closes the resource unless something holds it. It returns how
// many holders keep it open, and whether this call closed it: 0 and
// false once it is closed already (even by a Shut that left holders).
func (c *Count) Close() (held int, closed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, false
	case c.n > 0:
		return c.n, false
	}
	c.closed = true
	return 0, true
}

// Shut closes the resource even while something holds it, for a teardown
// that cannot wait. It returns how many holders are left, and whether
// this call closed the resource (false once it is closed already).
func (c *Count) Shut() (held int, closed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	closed, c.closed = !c.closed, true
	return c.n, closed
}

// Closed reports whether the resource is closed.
func (c *Count) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
