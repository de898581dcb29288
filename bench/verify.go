package main

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync/atomic"
)

// Verify blocks. Every --bs-sized block a --verify run writes carries a
// header, a payload derived from it and a checksum:
//
//	[0:8)     magic "gosrpBV1"
//	[8:16)    LBA (offset / bs), little endian
//	[16:24)   generation: 1 for the prefill, +1 for every write of the block
//	[24:32)   run ID: random per run, so data of an earlier run is told apart
//	[32:n-4)  xorshift64 stream seeded from LBA, generation and run ID
//	[n-4:n)   CRC-32C of bytes [0:n-4)
//
// A read must return exactly the generation the run last wrote to that
// block (blocks are locked while an I/O on them is in flight, so there is
// one right answer). A block this run never wrote must read as zeros or
// as an intact block of another run for the same LBA ("prior"). Anything
// else is a mismatch: counted, its first few reasons kept, never ignored.
const (
	verifyMagic  = "gosrpBV1"
	verifyHeader = 32
	// minVerifyBS is the smallest block a header and checksum fit in.
	minVerifyBS = 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fillBlock writes the verify pattern of (lba, gen, run) into b.
func fillBlock(b []byte, lba, gen, run uint64) {
	copy(b[0:8], verifyMagic)
	binary.LittleEndian.PutUint64(b[8:], lba)
	binary.LittleEndian.PutUint64(b[16:], gen)
	binary.LittleEndian.PutUint64(b[24:], run)
	x := run ^ lba*0x9e3779b97f4a7c15 ^ gen<<40 | 1
	end := len(b) - 4
	i := verifyHeader
	for ; i+8 <= end; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < end; i++ {
		b[i] = byte(x >> (8 * (i & 7)))
	}
	binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
}

// verifyOutcome classifies one checked block.
type verifyOutcome uint8

const (
	verifyOK       verifyOutcome = iota // the generation this run wrote last
	verifyZero                          // never written by this run, reads zeros
	verifyPrior                         // never written by this run, intact block of another run
	verifyMismatch                      // anything else
)

// checkBlock verifies b, read from lba, against the generation this run
// last wrote there (0: never). The error says what is wrong.
func checkBlock(b []byte, lba, gen, run uint64) (verifyOutcome, error) {
	got, out, err := readBlock(b, lba, run)
	switch {
	case out == verifyMismatch:
		if gen != 0 && isZero(b) {
			return verifyMismatch, fmt.Errorf("lba %d: reads zeros, want generation %d", lba, gen)
		}
		return out, err
	case out != verifyOK && gen == 0:
		return out, nil
	case out == verifyZero:
		return verifyMismatch, fmt.Errorf("lba %d: reads zeros, want generation %d", lba, gen)
	case out == verifyPrior:
		return verifyMismatch, fmt.Errorf("lba %d: holds a block of another run, want generation %d", lba, gen)
	case gen == 0:
		return verifyMismatch, fmt.Errorf("lba %d: never written by this run but holds its generation %d", lba, got)
	case got != gen:
		return verifyMismatch, fmt.Errorf("lba %d: generation %d, want %d (stale or lost write)", lba, got, gen)
	}
	return verifyOK, nil
}

// readBlock tells what b, read from lba, holds: a generation this run
// wrote (verifyOK and the generation), zeros, an intact block of another
// run, or none of these (verifyMismatch, with the reason; a block whose
// checksum fails is torn or corrupt).
func readBlock(b []byte, lba, run uint64) (uint64, verifyOutcome, error) {
	end := len(b) - 4
	if len(b) < minVerifyBS {
		return 0, verifyMismatch, fmt.Errorf("lba %d: %d-byte block is too small to verify", lba, len(b))
	}
	if isZero(b) {
		return 0, verifyZero, nil
	}
	if string(b[0:8]) != verifyMagic {
		return 0, verifyMismatch, fmt.Errorf("lba %d: neither zeros nor a verify block (no verify header)", lba)
	}
	if got, want := binary.LittleEndian.Uint32(b[end:]), crc32.Checksum(b[:end], castagnoli); got != want {
		return 0, verifyMismatch, fmt.Errorf("lba %d: checksum %#08x, computed %#08x: torn or corrupt block", lba, got, want)
	}
	if got := binary.LittleEndian.Uint64(b[8:]); got != lba {
		return 0, verifyMismatch, fmt.Errorf("lba %d: holds block %d (misplaced I/O)", lba, got)
	}
	if binary.LittleEndian.Uint64(b[24:]) != run {
		return 0, verifyPrior, nil
	}
	return binary.LittleEndian.Uint64(b[16:]), verifyOK, nil
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// verifyState is the run's model of the region: the generation of every
// block and a lock bit per block, shared by all jobs.
type verifyState struct {
	run uint64
	// base is the region's first block on the volume (--offset / --bs):
	// blocks are indexed from the region's start and stamped with their
	// place on the volume, as the prefill stamps them.
	base int64
	gens []atomic.Uint64 // generation last acknowledged; bit 63: an I/O is in flight
	// submitted and flushed are the highest generations written and
	// covered by a successful FLUSH, kept for --verify-state (nil
	// without it; see verifystate.go).
	submitted, flushed []atomic.Uint64
	// counters
	checked, zero, prior, mismatches atomic.Uint64
	firstMu                          atomic.Int32
	first                            [4]atomic.Pointer[string] // first mismatch reasons
}

const busyBit = uint64(1) << 63

func newVerifyState(blocks, base int64, run uint64) *verifyState {
	return &verifyState{run: run, base: base, gens: make([]atomic.Uint64, blocks)}
}

// stamp is the LBA a block of the region carries: its place on the volume.
func (v *verifyState) stamp(lba int64) uint64 { return uint64(v.base + lba) }

// tryLock claims lba for one I/O; false if another I/O has it.
func (v *verifyState) tryLock(lba int64) bool {
	g := &v.gens[lba]
	old := g.Load()
	return old&busyBit == 0 && g.CompareAndSwap(old, old|busyBit)
}

// unlock releases lba; gen is its new generation.
func (v *verifyState) unlock(lba int64, gen uint64) { v.gens[lba].Store(gen) }

// gen is lba's current generation (the caller holds its lock).
func (v *verifyState) gen(lba int64) uint64 { return v.gens[lba].Load() &^ busyBit }

// check verifies one read block, the region's lba-th, and counts the
// outcome.
func (v *verifyState) check(b []byte, lba int64) {
	out, err := checkBlock(b, v.stamp(lba), v.gen(lba), v.run)
	v.checked.Add(1)
	switch out {
	case verifyZero:
		v.zero.Add(1)
	case verifyPrior:
		v.prior.Add(1)
	case verifyMismatch:
		v.mismatches.Add(1)
		if i := v.firstMu.Add(1) - 1; int(i) < len(v.first) {
			s := err.Error()
			v.first[i].Store(&s)
		}
	}
}

// reasons are the first mismatches' descriptions.
func (v *verifyState) reasons() []string {
	var out []string
	for i := range v.first {
		if p := v.first[i].Load(); p != nil {
			out = append(out, *p)
		}
	}
	return out
}
