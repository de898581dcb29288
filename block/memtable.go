package block

import "math/bits"

// blockTable holds a memory volume's blocks: a map from chunk number to a
// chunk of consecutive blocks stored contiguously in one slab (see
// chunkBytes), with a bitmap of the blocks present. Absent blocks read as
// zeros. A 1 GiB volume of 4 KiB blocks has 512 chunks, a map small enough
// to stay in cache, where one map entry per block (262,144 of them) made
// each random 4 KiB read pay cache misses on the hash table's groups; the
// map keeps sparse volumes of any size cheap.
//
// Tables made by clone share slabs; a write to a shared slab copies the
// chunk first. A table is owned by one memory core and guarded by its lock.
type blockTable struct {
	bs     int64
	shift  uint // log2 of blocks per chunk
	chunks map[int64]*blockChunk
	n      int // blocks present
}

// maxChunkBlocks is the most blocks a chunk holds (512-byte blocks).
const maxChunkBlocks = chunkBytes / 512

type blockChunk struct {
	slab    *slab
	present [maxChunkBlocks / 64]uint64
	n       int // bits set in present
}

func newBlockTable(bs int) blockTable {
	return blockTable{bs: int64(bs), shift: uint(bits.TrailingZeros(uint(chunkBytes / bs))), chunks: map[int64]*blockChunk{}}
}

// len reports how many blocks are present.
func (t *blockTable) len() int { return t.n }

func (c *blockChunk) has(j int64) bool { return c.present[j>>6]&(1<<(j&63)) != 0 }

// all reports whether blocks [j, e) of the chunk are all present.
func (c *blockChunk) all(j, e int64) bool {
	for j < e {
		n := min(64-j&63, e-j)
		mask := uint64(1)<<n - 1 // all ones when n is 64
		if c.present[j>>6]>>(j&63)&mask != mask {
			return false
		}
		j += n
	}
	return true
}

// span locates block i: its chunk k, its index j in the chunk, and how
// many of the n blocks from i on lie in that chunk.
func (t *blockTable) span(i, n int64) (k, j, cnt int64) {
	per := int64(1) << t.shift
	j = i & (per - 1)
	return i >> t.shift, j, min(n, per-j)
}

// read fills p, a whole number of blocks, with the blocks from first on.
func (t *blockTable) read(p []byte, first int64) {
	bs := t.bs
	for len(p) > 0 {
		k, j, cnt := t.span(first, int64(len(p))/bs)
		dst := p[:cnt*bs]
		c := t.chunks[k]
		switch {
		case c == nil:
			clear(dst)
		case c.all(j, j+cnt):
			copy(dst, c.slab.b[j*bs:])
		default:
			for x := range cnt {
				d := dst[x*bs : (x+1)*bs]
				if c.has(j + x) {
					copy(d, c.slab.b[(j+x)*bs:])
				} else {
					clear(d)
				}
			}
		}
		p, first = p[cnt*bs:], first+cnt
	}
}

// write stores p, a whole number of blocks, as the blocks from first on.
// It fails only when the memory for a new chunk cannot be mapped, and then
// may have stored a prefix of p.
func (t *blockTable) write(p []byte, first int64) error {
	bs := t.bs
	for len(p) > 0 {
		k, j, cnt := t.span(first, int64(len(p))/bs)
		c, err := t.own(k)
		if err != nil {
			return err
		}
		copy(c.slab.b[j*bs:], p[:cnt*bs])
		for x := j; x < j+cnt; x++ {
			if !c.has(x) {
				c.present[x>>6] |= 1 << (x & 63)
				c.n++
				t.n++
			}
		}
		if c.n == 1<<t.shift && !c.slab.huge {
			c.slab.huge = true
			collapse(c.slab.b)
		}
		p, first = p[cnt*bs:], first+cnt
	}
	return nil
}

// own returns chunk k ready to be written in place: created if absent,
// copied if its slab is shared with another table.
func (t *blockTable) own(k int64) (*blockChunk, error) {
	c := t.chunks[k]
	if c != nil && !c.slab.shared() {
		return c, nil
	}
	s, err := newSlab()
	if err != nil {
		return nil, err
	}
	if c == nil {
		c = &blockChunk{slab: s}
		t.chunks[k] = c
		return c, nil
	}
	// Copy only the present blocks, so that the pages of absent ones stay
	// uncommitted.
	old, bs := c.slab, t.bs
	for j := int64(0); j < 1<<t.shift; j++ {
		if c.has(j) {
			copy(s.b[j*bs:(j+1)*bs], old.b[j*bs:])
		}
	}
	old.release()
	c.slab = s
	return c, nil
}

// deleteRange drops the blocks of [first, end).
func (t *blockTable) deleteRange(first, end int64) {
	if first >= end {
		return
	}
	lo, hi := first>>t.shift, (end-1)>>t.shift
	if hi-lo+1 > int64(len(t.chunks)) {
		// A range wider than the volume's written chunks: walk the map.
		for k, c := range t.chunks {
			if k >= lo && k <= hi {
				t.clearChunk(k, c, first, end)
			}
		}
		return
	}
	for k := lo; k <= hi; k++ {
		if c := t.chunks[k]; c != nil {
			t.clearChunk(k, c, first, end)
		}
	}
}

// clearChunk drops the blocks of chunk k that fall in [first, end), and
// the chunk itself once it is empty. The pages of dropped blocks go back
// to the kernel unless another table shares the slab and still reads them.
func (t *blockTable) clearChunk(k int64, c *blockChunk, first, end int64) {
	base := k << t.shift
	from, to := max(first-base, 0), min(end-base, 1<<t.shift)
	for j := from; j < to; j++ {
		if c.has(j) {
			c.present[j>>6] &^= 1 << (j & 63)
			c.n--
			t.n--
		}
	}
	switch {
	case c.n == 0:
		c.slab.release()
		delete(t.chunks, k)
	case !c.slab.shared():
		// A huge page splits here. huge stays set: collapsing again when the
		// chunk next fills would copy 2 MiB per block rewritten after a trim
		// of one; the MADV_HUGEPAGE advice stays on the range, and
		// khugepaged collapses it in time.
		dropPages(c.slab.b[from*t.bs : to*t.bs])
	}
}

// clone returns a table sharing t's slabs; either copies a chunk before
// its first write to it.
func (t *blockTable) clone() blockTable {
	u := blockTable{bs: t.bs, shift: t.shift, chunks: make(map[int64]*blockChunk, len(t.chunks)), n: t.n}
	for k, c := range t.chunks {
		c.slab.share()
		cc := *c
		u.chunks[k] = &cc
	}
	return u
}

// release drops every chunk; the table is empty afterwards.
func (t *blockTable) release() {
	for _, c := range t.chunks {
		c.slab.release()
	}
	t.chunks, t.n = map[int64]*blockChunk{}, 0
}
