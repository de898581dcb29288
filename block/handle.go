package block

import (
	"fmt"
	"sync/atomic"
)

// core is one backend's shared implementation of an open volume. Cores
// validate requests themselves (under whatever lock guards their size) and
// report ErrClosed once their store is closed or the volume deleted.
type core interface {
	name() string
	identity() uint64
	size() int64
	blockSize() int
	caps() Caps
	readAt(p []byte, off int64) error
	writeAt(p []byte, off int64, fua bool) error
	flush() error
	discard(off, n int64) error
	writeZeroes(off, n int64) error
	resize(n int64) error
}

// handle is one caller's reference to a shared core: every Open returns its
// own handle, so closing one handle does not close another's, and a store
// can refuse to delete a volume while any handle is open.
type handle struct {
	c       core
	closed  atomic.Bool
	release func() // drops this handle's reference; called once by Close
}

var _ Volume = (*handle)(nil)

func newHandle(c core, release func()) *handle { return &handle{c: c, release: release} }

func (h *handle) closedErr(op string, n, off int64) error {
	return ioErr(h.c.name(), op, n, off, ErrClosed)
}

// BatchWriter is implemented by volumes that apply several writes as one
// unit more cheaply than one by one (pebble: one batch, one trip through its
// commit pipeline). The target uses it for the writes that arrive together.
type BatchWriter interface {
	// WriteBatch writes bufs[i] at offs[i] for every i, all or nothing: it
	// validates every request before writing any, and the writes are
	// visible, like WriteAt's, when it returns nil. Overlapping requests
	// land in order, the last one winning.
	WriteBatch(bufs [][]byte, offs []int64) error
	// Stalled reports whether the store is holding writes back (pebble: a
	// write stall, until compactions catch up), so that a write started
	// now may wait for a long time. The target runs write batches on its
	// connection loop only while this is false.
	Stalled() bool
}

// batchCore is a core that applies write batches itself.
type batchCore interface {
	core
	writeBatch(bufs [][]byte, offs []int64) error
	stalled() bool
}

// batchHandle is a handle on a core that writes batches.
type batchHandle struct {
	*handle
	bc batchCore
}

var _ BatchWriter = batchHandle{}

// newVolumeHandle returns a handle on c that also implements BatchWriter
// when c writes batches itself.
func newVolumeHandle(c core, release func()) Volume {
	h := newHandle(c, release)
	if bc, ok := c.(batchCore); ok {
		return batchHandle{h, bc}
	}
	return h
}

// WriteBatch implements BatchWriter.
func (h batchHandle) WriteBatch(bufs [][]byte, offs []int64) error {
	if h.closed.Load() {
		return fmt.Errorf("block: volume %q: write batch: %w", h.c.name(), ErrClosed)
	}
	return h.bc.writeBatch(bufs, offs)
}

// Stalled implements BatchWriter.
func (h batchHandle) Stalled() bool { return h.bc.stalled() }

// Name implements Volume.
func (h *handle) Name() string { return h.c.name() }

// Identity tells this volume from any other that has had, or will have,
// its name: every open of it, in any process, gets the same value, and a
// volume deleted and created again, or one of another store, another
// (target.Identifier). Zero means the backend knows no identity (a
// volume of OpenFileVolume).
func (h *handle) Identity() uint64 { return h.c.identity() }

// Size implements Volume.
func (h *handle) Size() int64 { return h.c.size() }

// BlockSize implements Volume.
func (h *handle) BlockSize() int { return h.c.blockSize() }

// Caps implements Volume.
func (h *handle) Caps() Caps { return h.c.caps() }

// Immediate reports whether I/O on the volume completes without waiting
// (CapImmediate); the target runs such I/O on its connection loop.
func (h *handle) Immediate() bool { return h.c.caps().Has(CapImmediate) }

// Deallocates reports whether Discard deallocates storage (CapDiscard),
// the range reading as zeros afterwards; target.Deallocator.
func (h *handle) Deallocates() bool { return h.c.caps().Has(CapDiscard) }

// ReadAt implements io.ReaderAt.
func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	if h.closed.Load() {
		return 0, h.closedErr("read", int64(len(p)), off)
	}
	if err := h.c.readAt(p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt implements io.WriterAt.
func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if h.closed.Load() {
		return 0, h.closedErr("write", int64(len(p)), off)
	}
	if err := h.c.writeAt(p, off, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAtFUA implements Volume.
func (h *handle) WriteAtFUA(p []byte, off int64) (int, error) {
	if h.closed.Load() {
		return 0, h.closedErr("write-fua", int64(len(p)), off)
	}
	if err := h.c.writeAt(p, off, true); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush implements Volume.
func (h *handle) Flush() error {
	if h.closed.Load() {
		return fmt.Errorf("block: volume %q: flush: %w", h.c.name(), ErrClosed)
	}
	return h.c.flush()
}

// Discard implements Volume.
func (h *handle) Discard(off, n int64) error {
	if h.closed.Load() {
		return h.closedErr("discard", n, off)
	}
	return h.c.discard(off, n)
}

// WriteZeroes implements Volume.
func (h *handle) WriteZeroes(off, n int64) error {
	if h.closed.Load() {
		return h.closedErr("write-zeroes", n, off)
	}
	return h.c.writeZeroes(off, n)
}

// Resize implements Volume.
func (h *handle) Resize(n int64) error {
	if h.closed.Load() {
		return fmt.Errorf("block: volume %q: resize to %d: %w", h.c.name(), n, ErrClosed)
	}
	return h.c.resize(n)
}

// Close implements Volume. Closing twice returns ErrClosed.
func (h *handle) Close() error {
	if h.closed.Swap(true) {
		return fmt.Errorf("block: volume %q: close: %w", h.c.name(), ErrClosed)
	}
	if h.release != nil {
		h.release()
	}
	return nil
}
