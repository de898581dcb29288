package block

// blockTable maps a memory volume's block numbers to its stored blocks.
// It is two-level: a map from chunk number to a chunk of 512 block
// pointers. A 1 GiB volume of 4 KiB blocks has 512 chunks, a map small
// enough to stay in cache, where one map entry per block (262,144 of
// them) made each random 4 KiB read pay cache misses on the hash table's
// groups: the probe was 7 % of a memory srpd's CPU on a pre-written
// volume. The map keeps sparse volumes of any size cheap.
type blockTable struct {
	chunks map[int64]*blockChunk
	n      int // blocks present
}

const (
	chunkShift  = 9
	chunkBlocks = 1 << chunkShift
)

type blockChunk struct {
	b [chunkBlocks]*memBlock
	n int // non-nil entries of b
}

func newBlockTable() blockTable {
	return blockTable{chunks: map[int64]*blockChunk{}}
}

// len reports how many blocks are present.
func (t *blockTable) len() int { return t.n }

// get returns block i, or nil when it is absent (reads as zeros).
func (t *blockTable) get(i int64) *memBlock {
	c := t.chunks[i>>chunkShift]
	if c == nil {
		return nil
	}
	return c.b[i&(chunkBlocks-1)]
}

// set stores b (not nil) as block i.
func (t *blockTable) set(i int64, b *memBlock) {
	c := t.chunks[i>>chunkShift]
	if c == nil {
		c = &blockChunk{}
		t.chunks[i>>chunkShift] = c
	}
	p := &c.b[i&(chunkBlocks-1)]
	if *p == nil {
		c.n++
		t.n++
	}
	*p = b
}

// deleteRange drops the blocks of [first, end).
func (t *blockTable) deleteRange(first, end int64) {
	if first >= end {
		return
	}
	lo, hi := first>>chunkShift, (end-1)>>chunkShift
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
// the chunk itself once it is empty.
func (t *blockTable) clearChunk(k int64, c *blockChunk, first, end int64) {
	base := k << chunkShift
	from, to := max(first-base, 0), min(end-base, chunkBlocks)
	for j := from; j < to; j++ {
		if c.b[j] != nil {
			c.b[j] = nil
			c.n--
			t.n--
		}
	}
	if c.n == 0 {
		delete(t.chunks, k)
	}
}

// clone returns a table sharing t's blocks (not its chunks).
func (t *blockTable) clone() blockTable {
	u := blockTable{chunks: make(map[int64]*blockChunk, len(t.chunks)), n: t.n}
	for k, c := range t.chunks {
		cc := *c
		u.chunks[k] = &cc
	}
	return u
}
