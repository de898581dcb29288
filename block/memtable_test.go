package block

import (
	"math/rand/v2"
	"testing"
)

// TestBlockTable runs random sets, range deletes and clones against a
// plain map and checks every present block and the counts after each
// step (seeded; the seed is in the log).
func TestBlockTable(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const space = 5 * chunkBlocks // blocks span a few chunks and their edges
	tab := newBlockTable()
	ref := map[int64]*memBlock{}
	var frozen blockTable
	var frozenRef map[int64]*memBlock
	check := func(step int, tb *blockTable, want map[int64]*memBlock) {
		t.Helper()
		if tb.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, tb.len(), len(want))
		}
		n := 0
		for k, c := range tb.chunks {
			live := 0
			for j, b := range c.b {
				if b == nil {
					continue
				}
				live++
				if want[k<<chunkShift+int64(j)] != b {
					t.Fatalf("step %d: block %d present, not in the reference", step, k<<chunkShift+int64(j))
				}
			}
			if live == 0 || live != c.n {
				t.Fatalf("step %d: chunk %d counts %d, holds %d", step, k, c.n, live)
			}
			n += live
		}
		for i, b := range want {
			if tb.get(i) != b {
				t.Fatalf("step %d: block %d missing", step, i)
			}
		}
		if n != len(want) {
			t.Fatalf("step %d: %d blocks in chunks, want %d", step, n, len(want))
		}
	}
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 6:
			i := rng.Int64N(space)
			b := &memBlock{gen: uint64(step)}
			tab.set(i, b)
			ref[i] = b
		case r < 9:
			first := rng.Int64N(space)
			end := first + rng.Int64N(2*chunkBlocks)
			if rng.IntN(8) == 0 {
				end = maxBlocks // a resize to below first
			}
			tab.deleteRange(first, end)
			for i := range ref {
				if i >= first && i < end {
					delete(ref, i)
				}
			}
		default:
			frozen, frozenRef = tab.clone(), map[int64]*memBlock{}
			for k, v := range ref {
				frozenRef[k] = v
			}
		}
		check(step, &tab, ref)
		if frozenRef != nil {
			check(step, &frozen, frozenRef) // a clone is not changed by its origin
		}
	}
}
