package block

import (
	"runtime"
	"sync/atomic"
)

// chunkBytes is the size of a memory volume's chunk: one transparent huge
// page on x86-64 and arm64 (4 KiB base pages), so that a full chunk is
// mapped by one TLB entry. Random 4 KiB reads across a pre-written 1 GiB
// volume missed the TLB twice per block when every block was its own heap
// object (a block header and its bytes); in a VM each miss is a
// two-dimensional page walk.
const chunkBytes = 2 << 20

// slab is the memory of one chunk: chunkBytes of anonymous memory, mapped
// outside the Go heap so that the pages of dropped blocks go back to the
// kernel at once (madvise(MADV_DONTNEED)) and a full chunk can become a huge
// page (madvise(MADV_COLLAPSE)). Snapshots share slabs; refs counts the
// tables holding one, and the last to drop it unmaps it.
type slab struct {
	*mapping
	refs atomic.Int32
	huge bool // collapse was asked for once (guarded by the owner's lock)
}

// mapping is a slab's memory as the cleanup sees it: a slab that is
// dropped without release (a store that is never closed) is unmapped when
// the garbage collector finds it unreachable.
type mapping struct {
	b    []byte
	done atomic.Bool // unmapped
}

// newSlab maps a zeroed chunk held by one table.
func newSlab() (*slab, error) {
	b, err := mapChunk()
	if err != nil {
		return nil, err
	}
	s := &slab{mapping: &mapping{b: b}}
	s.refs.Store(1)
	runtime.AddCleanup(s, (*mapping).unmap, s.mapping)
	return s, nil
}

// share records one more table holding s.
func (s *slab) share() { s.refs.Add(1) }

// shared reports whether another table holds s too; only the holder of
// the last reference may change s in place.
func (s *slab) shared() bool { return s.refs.Load() > 1 }

// release drops one table's reference and unmaps s after the last one.
// The caller must not touch s.b afterwards.
func (s *slab) release() {
	if s.refs.Add(-1) == 0 {
		s.unmap()
	}
}

func (m *mapping) unmap() {
	if m.done.CompareAndSwap(false, true) {
		unmapChunk(m.b)
	}
}
