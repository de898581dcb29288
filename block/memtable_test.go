package block

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// stampBlock fills a block with the stamp v so that a block read back
// shows which write stored it.
func stampBlock(b []byte, v uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], v+uint64(i))
	}
}

// tableModel is a blockTable's reference: block number → stamp.
type tableModel map[int64]uint64

func (m tableModel) clone() tableModel {
	c := make(tableModel, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestBlockTable runs random writes, reads, range deletes, clones and
// writes to clones against a plain map, and checks after each step the
// counts, the blocks around the step's range, every slab's mapping, and
// every block every 250 steps (seeded; the seed is in the log).
func TestBlockTable(t *testing.T) {
	for _, bs := range []int{512, 4096} {
		t.Run(fmt.Sprint("bs=", bs), func(t *testing.T) { testBlockTable(t, bs) })
	}
}

func testBlockTable(t *testing.T, bs int) {
	seed := uint64(rand.Int64())
	t.Logf("seed=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	per := int64(chunkBytes / bs)
	space := 3 * per // writes span a few chunks and their edges
	type side struct {
		tab blockTable
		ref tableModel
	}
	sides := []*side{{tab: newBlockTable(bs), ref: tableModel{}}}
	seen := map[*slab]bool{}
	want, got := make([]byte, bs), make([]byte, 2*per*int64(bs))
	check := func(step int, s *side, first, end int64, full bool) {
		t.Helper()
		tb := &s.tab
		if tb.len() != len(s.ref) {
			t.Fatalf("step %d: len %d, want %d", step, tb.len(), len(s.ref))
		}
		n := 0
		for k, c := range tb.chunks {
			seen[c.slab] = true
			if c.slab.done.Load() {
				t.Fatalf("step %d: chunk %d reads an unmapped slab", step, k)
			}
			live := 0
			for _, w := range c.present {
				live += bits.OnesCount64(w)
			}
			if live == 0 || live != c.n {
				t.Fatalf("step %d: chunk %d counts %d, holds %d", step, k, c.n, live)
			}
			n += live
		}
		if n != len(s.ref) {
			t.Fatalf("step %d: %d blocks in chunks, want %d", step, n, len(s.ref))
		}
		if full {
			first, end = 0, space+per
		}
		for lo := first; lo < end; lo += 2 * per {
			hi := min(end, lo+2*per)
			p := got[:(hi-lo)*int64(bs)]
			tb.read(p, lo)
			for i := lo; i < hi; i++ {
				clear(want)
				if v, ok := s.ref[i]; ok {
					stampBlock(want, v)
				}
				if !bytes.Equal(p[(i-lo)*int64(bs):(i-lo+1)*int64(bs)], want) {
					t.Fatalf("step %d: block %d reads wrong bytes (reading %d..%d)", step, i, lo, hi)
				}
			}
		}
	}
	for step := range 1000 {
		s := sides[rng.IntN(len(sides))]
		first := rng.Int64N(space)
		long := per / 8
		if rng.IntN(8) == 0 {
			long = per + per/2 // across a chunk or two
		}
		end := min(first+1+rng.Int64N(long), space+per)
		switch r := rng.IntN(10); {
		case r < 6:
			p := make([]byte, (end-first)*int64(bs))
			for i := first; i < end; i++ {
				v := uint64(step)<<32 | uint64(i)
				stampBlock(p[(i-first)*int64(bs):(i-first+1)*int64(bs)], v)
				s.ref[i] = v
			}
			if err := s.tab.write(p, first); err != nil {
				t.Fatalf("step %d: write: %v", step, err)
			}
		case r < 9:
			if rng.IntN(8) == 0 {
				end = maxBlocks // a resize to below first
			}
			s.tab.deleteRange(first, end)
			for i := range s.ref {
				if i >= first && i < end {
					delete(s.ref, i)
				}
			}
			end = min(end, space+per)
		default:
			if len(sides) == 3 {
				// Drop a clone, as deleting a snapshot does.
				i := 1 + rng.IntN(2)
				sides[i].tab.release()
				if sides[i] == s {
					s = sides[0]
				}
				sides = append(sides[:i], sides[i+1:]...)
			}
			sides = append(sides, &side{tab: s.tab.clone(), ref: s.ref.clone()})
		}
		for _, o := range sides {
			// A write or delete in one table changes no other.
			check(step, o, max(first-1, 0), min(end+1, space+per), step%250 == 249)
		}
	}
	for _, s := range sides {
		s.tab.release()
	}
	for sl := range seen {
		if !sl.done.Load() {
			t.Fatalf("a slab is still mapped after every table released it")
		}
	}
}

// TestMemStoreUnmaps checks that deleting a snapshot, deleting a volume and
// closing the store give their chunks' memory back, and no chunk another
// volume still reads.
func TestMemStoreUnmaps(t *testing.T) {
	s := NewMemStore()
	const size = 3 * chunkBytes
	v, err := s.Create("v", size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, size)
	stampBlock(p, 1)
	if _, err := v.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot("v", "s"); err != nil {
		t.Fatal(err)
	}
	slabs := func(name string) (out []*slab) {
		c := s.vols[name]
		if c == nil {
			c = s.snaps["v"][name]
		}
		for _, ch := range c.blocks.chunks {
			out = append(out, ch.slab)
		}
		return out
	}
	mapped := func(want bool, ss ...*slab) {
		t.Helper()
		for _, sl := range ss {
			if !sl.done.Load() != want {
				t.Fatalf("slab mapped=%v, want %v", !want, want)
			}
		}
	}
	shared := slabs("s")
	// One chunk rewritten: the volume copies it, the snapshot keeps the old.
	if _, err := v.WriteAt(p[:4096], chunkBytes); err != nil {
		t.Fatal(err)
	}
	copy(p[chunkBytes:], p[:4096])
	own := slabs("v")
	if err := s.DeleteSnapshot("v", "s"); err != nil {
		t.Fatal(err)
	}
	mapped(true, own...)
	var gone int
	for _, sl := range shared {
		if sl.done.Load() {
			gone++
		}
	}
	if gone != 1 {
		t.Fatalf("deleting the snapshot unmapped %d chunks, want the 1 the volume had copied", gone)
	}
	got := make([]byte, size)
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Fatal("the volume reads other bytes after its snapshot was deleted")
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	wv, err := s.Create("w", size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wv.WriteAt(p[:4096], 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("v"); err != nil {
		t.Fatal(err)
	}
	mapped(false, own...)
	w := slabs("w")
	if len(w) != 1 {
		t.Fatalf("volume w has %d chunks after one write, want 1", len(w))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mapped(false, w...)
}
