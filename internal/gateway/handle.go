package gateway

// One open handle of a shared volume: I/O passes only while the volume
// is active here.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
)

// atomicState is a State the I/O path reads without a lock.
type atomicState struct{ v atomic.Uint32 }

func (a *atomicState) load() State   { return State(a.v.Load()) }
func (a *atomicState) store(s State) { a.v.Store(uint32(s)) }

// errNotServing is what a standby handle's I/O fails with; one value, so
// that refusing I/O allocates nothing.
var errNotServing = fmt.Errorf("gateway: this gateway does not serve the volume now: %w", target.ErrStandby)

// handle is a block.Volume of a shared store, gated by its entry's state
// (target.PathStater).
type handle struct {
	block.Volume
	c      *Catalog
	e      *entry
	closed sync.Once
}

var (
	_ target.Identifier  = (*handle)(nil)
	_ target.PathStater  = (*handle)(nil)
	_ target.Fencer      = (*handle)(nil)
	_ target.Deallocator = (*handle)(nil)
)

// Identity implements target.Identifier: the shared volume's, the same
// at every gateway.
func (h *handle) Identity() uint64 {
	if id, ok := h.Volume.(target.Identifier); ok {
		return id.Identity()
	}
	return 0
}

// Standby implements target.PathStater.
func (h *handle) Standby() bool { return h.e.state.load() != Active }

// Fenced implements target.Fencer.
func (h *handle) Fenced() bool { return h.e.state.load() == Fenced }

// TakeOver implements target.PathStater.
func (h *handle) TakeOver() error {
	s, err := h.c.run(h.e, EvTakeover)
	if s != Active {
		return errTakeover(h.e.name, s, err)
	}
	return nil
}

// check refuses I/O unless the volume is active here.
func (h *handle) check() error {
	if h.e.state.load() != Active {
		return errNotServing
	}
	return nil
}

// done notes a fenced failure: the volume is no longer served here, and
// the initiator is told so (target.ErrStandby) to fail over.
func (h *handle) done(err error) error {
	if err != nil && errors.Is(err, block.ErrFenced) {
		h.c.fenced(h.e)
		return fmt.Errorf("%w: %w", target.ErrStandby, err)
	}
	return err
}

// ReadAt implements target.Volume.
func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.Volume.ReadAt(p, off)
	return n, h.done(err)
}

// WriteAt implements target.Volume.
func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.Volume.WriteAt(p, off)
	return n, h.done(err)
}

// WriteAtFUA implements target.Volume.
func (h *handle) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.Volume.WriteAtFUA(p, off)
	return n, h.done(err)
}

// Flush implements target.Volume.
func (h *handle) Flush() error {
	if err := h.check(); err != nil {
		return err
	}
	return h.done(h.Volume.Flush())
}

// Discard implements target.Volume.
func (h *handle) Discard(off, n int64) error {
	if err := h.check(); err != nil {
		return err
	}
	return h.done(h.Volume.Discard(off, n))
}

// WriteZeroes implements target.Volume.
func (h *handle) WriteZeroes(off, n int64) error {
	if err := h.check(); err != nil {
		return err
	}
	return h.done(h.Volume.WriteZeroes(off, n))
}

// Close closes the volume and, with its last handle here, the entry.
func (h *handle) Close() error {
	var err error
	h.closed.Do(func() {
		err = h.Volume.Close()
		h.c.release(h.e)
	})
	return err
}

// Deallocates implements target.Deallocator, which the embedded
// block.Volume does not carry: without it the SRP personality would
// offer a gateway's volume as fully provisioned, without UNMAP, though
// the store behind it discards (target/core_srp_login.go).
func (h *handle) Deallocates() bool { return h.Volume.Caps().Has(block.CapDiscard) }

// Allocated implements block.Allocator (the target's extents requests)
// while this gateway serves the volume, with the store volume's own
// answer when it has one (rbd's object map); otherwise the whole range
// is reported allocated, which is always true enough.
func (h *handle) Allocated(off, n int64, yield func(off, n int64) bool) (int64, error) {
	if err := h.check(); err != nil {
		return off, err
	}
	a, ok := h.Volume.(block.Allocator)
	if !ok {
		yield(off, n)
		return off + n, nil
	}
	end, err := a.Allocated(off, n, yield)
	return end, h.done(err)
}
