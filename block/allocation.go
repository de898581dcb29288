package block

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// Allocator is implemented by every Volume of this package: it tells which
// parts of a volume hold data, so that a copy or a map (nbdinfo --map,
// qemu-img map, through srpc nbd) can skip the rest. Pebble knows the
// blocks that have a key, the memory store the blocks it holds, the file
// store asks the file system (lseek SEEK_DATA and SEEK_HOLE).
type Allocator interface {
	// Allocated describes [off, off+n), which must lie inside the volume
	// and need not be block aligned. It calls yield with each run of
	// allocated bytes, as offset and length, in increasing order and cut
	// to the range, until yield returns false, and returns the end of
	// what it described: every byte before end outside the runs yielded
	// reads as zeros. end is off+n unless yield stopped it or the volume
	// bounded the work of one call (a long run of allocated blocks on
	// pebble is a key per block); the caller asks again from end. A
	// volume may call allocated what holds zeros (a block written with
	// zeros, one masked by a newer layer's discard), never the reverse.
	Allocated(off, n int64, yield func(off, n int64) bool) (end int64, err error)
}

var _ Allocator = (*handle)(nil)

// allocCore is a core that knows its allocation. allocated describes the
// block-aligned [off, end) like Allocator.Allocated, with block-aligned
// runs; it may describe less than asked when the volume shrank meanwhile.
type allocCore interface {
	allocated(off, end int64, yield func(off, end int64) bool) (int64, error)
}

// maxAllocScan bounds the blocks one allocated call visits, so that a
// query over a large, fully written volume costs at most this many key
// visits before it returns a prefix.
const maxAllocScan = 1 << 16

// Allocated implements Allocator. A core that cannot tell reports the
// whole range allocated, which is never wrong.
func (h *handle) Allocated(off, n int64, yield func(off, n int64) bool) (int64, error) {
	if h.closed.Load() {
		return 0, h.closedErr("allocated", n, off)
	}
	size, bs := h.c.size(), int64(h.c.blockSize())
	switch {
	case n <= 0:
		return 0, fmt.Errorf("block: volume %q: allocated %d bytes at %d: %w", h.c.name(), n, off, ErrZeroLength)
	case off < 0 || off > size || n > size-off:
		return 0, fmt.Errorf("block: volume %q: allocated %d bytes at %d (size %d): %w", h.c.name(), n, off, size, ErrOutOfRange)
	}
	end := off + n
	ac, ok := h.c.(allocCore)
	if !ok {
		yield(off, n)
		return end, nil
	}
	done, err := ac.allocated(off/bs*bs, (end+bs-1)/bs*bs, func(ro, re int64) bool {
		ro, re = max(ro, off), min(re, end)
		return re <= ro || yield(ro, re-ro)
	})
	if err != nil {
		return 0, err
	}
	return max(off, min(done, end)), nil
}

// allocated merges the block keys of every layer of the chain in [off,
// end): a block is allocated if any layer holds it. Masks are not
// consulted, so a block a newer layer discarded over an older one counts
// as allocated (reads give zeros): more than the truth, never less. At
// most maxAllocScan keys are visited.
func (c *pebbleCore) allocated(off, end int64, yield func(off, end int64) bool) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	end, err := c.allocRange(off, end, c.meta.Size)
	bs := int64(c.bs)
	first, last := off/bs, end/bs
	if err != nil || first >= last {
		return off, err
	}
	its := make([]*pebble.Iterator, 0, len(c.meta.Layers))
	defer func() {
		for _, it := range its {
			_ = it.Close()
		}
	}()
	for _, layer := range c.meta.Layers {
		it, err := c.db.NewIter(&pebble.IterOptions{LowerBound: dataKey(layer, first), UpperBound: dataKey(layer, last)})
		if err != nil {
			return 0, ioErr(c.nm, "allocated", end-off, off, err)
		}
		its = append(its, it)
		it.First()
	}
	runStart, runEnd := int64(-1), int64(-1)
	emit := func() bool { return runStart < 0 || yield(runStart*bs, runEnd*bs) }
	for visited := 0; ; visited++ {
		next := int64(-1) // the smallest block any layer holds from here
		for _, it := range its {
			if !it.Valid() {
				continue
			}
			_, blk, ok := parseDataKey(it.Key())
			if !ok || blk < first || blk >= last {
				return 0, ioErr(c.nm, "allocated", end-off, off, fmt.Errorf("unexpected key %x: %w", it.Key(), ErrCorrupt))
			}
			if next < 0 || blk < next {
				next = blk
			}
		}
		if next < 0 {
			break
		}
		if visited == maxAllocScan {
			// Budget spent: everything before next is described.
			if !emit() {
				return runEnd * bs, nil
			}
			return next * bs, nil
		}
		for _, it := range its {
			if it.Valid() {
				if _, blk, _ := parseDataKey(it.Key()); blk == next {
					it.Next()
				}
			}
		}
		if next == runEnd {
			runEnd++
			continue
		}
		if !emit() {
			return runEnd * bs, nil
		}
		runStart, runEnd = next, next+1
	}
	for _, it := range its {
		if err := it.Error(); err != nil {
			return 0, ioErr(c.nm, "allocated", end-off, off, err)
		}
	}
	if !emit() {
		return runEnd * bs, nil
	}
	return last * bs, nil
}

// allocated reports the blocks the table holds, chunk by chunk; a range
// wider than the chunks present walks the sorted chunk numbers instead.
// At most maxAllocScan blocks of present chunks are looked at.
func (c *memCore) allocated(off, end int64, yield func(off, end int64) bool) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	end, err := c.allocRange(off, end, c.sz)
	bs := int64(c.bs)
	first, last := off/bs, end/bs
	if err != nil || first >= last {
		return off, err
	}
	t := &c.blocks
	per := int64(1) << t.shift
	lo, hi := first>>t.shift, (last-1)>>t.shift
	var ks []int64
	if hi-lo+1 > int64(len(t.chunks)) {
		for k := range t.chunks {
			if k >= lo && k <= hi {
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
	} else {
		for k := lo; k <= hi; k++ {
			if t.chunks[k] != nil {
				ks = append(ks, k)
			}
		}
	}
	runStart, runEnd := int64(-1), int64(-1)
	emit := func() bool { return runStart < 0 || yield(runStart*bs, runEnd*bs) }
	visited := int64(0)
	for _, k := range ks {
		ch := t.chunks[k]
		base := k << t.shift
		from, to := max(first-base, 0), min(last-base, per)
		if visited >= maxAllocScan {
			// Budget spent: everything before this chunk is described.
			if !emit() {
				return runEnd * bs, nil
			}
			return (base + from) * bs, nil
		}
		visited += to - from
		for j := from; j < to; j++ {
			if !ch.has(j) {
				continue
			}
			if b := base + j; b == runEnd {
				runEnd++
			} else {
				if !emit() {
					return runEnd * bs, nil
				}
				runStart, runEnd = b, b+1
			}
		}
	}
	if !emit() {
		return runEnd * bs, nil
	}
	return last * bs, nil
}
