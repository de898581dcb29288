package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
)

// The verify state file (--verify-state) is what a --verify run knew about
// every block of its region when it ended, however it ended: the
// generation last acknowledged, the highest one ever submitted (a write
// that failed may still have landed) and the highest one a successful
// FLUSH covered. A checker reading the region afterwards (after a target
// crash, say) holds the volume to it: each block must be intact and hold
// a generation between the flushed one and the submitted one, and a run
// that exited 0 must have left exactly the acknowledged one. fio keeps the
// same kind of record with verify_state_save.
//
// The layout, little endian:
//
//	[0:8)    magic "gosrpVS1"
//	[8:16)   run ID
//	[16:24)  first block of the region on the volume (--offset / --bs)
//	[24:32)  --bs
//	[32:40)  number of blocks N
//	then N × (acknowledged, submitted, flushed), 8 bytes each
const verifyStateMagic = "gosrpVS1"

// blockRecord is one block's line of the verify state file.
type blockRecord struct {
	Acked, Submitted, Flushed uint64
}

// verifyRecord is a parsed verify state file.
type verifyRecord struct {
	Run    uint64
	Base   int64
	BS     int64
	Blocks []blockRecord
}

// blockGen is a write of one block: the job's note of what its next FLUSH
// covers.
type blockGen struct {
	lba int64
	gen uint64
}

// record starts keeping what --verify-state saves: the submitted and
// flushed generations of every block.
func (v *verifyState) record() {
	v.submitted = make([]atomic.Uint64, len(v.gens))
	v.flushed = make([]atomic.Uint64, len(v.gens))
}

// recording reports whether record was called.
func (v *verifyState) recording() bool { return v.flushed != nil }

// submit notes that generation gen of lba is being written.
func (v *verifyState) submit(lba int64, gen uint64) { atomicMax(&v.submitted[lba], gen) }

// flush notes that a successful FLUSH covered the writes ws.
func (v *verifyState) flush(ws []blockGen) {
	for _, w := range ws {
		atomicMax(&v.flushed[w.lba], w.gen)
	}
}

func atomicMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// save writes the verify state file; the jobs have ended.
func (v *verifyState) save(path string, bs int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--verify-state: %w", err)
	}
	w := bufio.NewWriter(f)
	var b [8]byte
	put := func(x uint64) {
		binary.LittleEndian.PutUint64(b[:], x)
		w.Write(b[:])
	}
	w.WriteString(verifyStateMagic)
	put(v.run)
	put(uint64(v.base))
	put(uint64(bs))
	put(uint64(len(v.gens)))
	for i := range v.gens {
		put(v.gens[i].Load() &^ busyBit)
		put(v.submitted[i].Load())
		put(v.flushed[i].Load())
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--verify-state: %w", err)
	}
	return nil
}

// loadVerifyState reads a verify state file.
func loadVerifyState(path string) (*verifyRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var hdr [40]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("verify state %s: header: %w", path, err)
	}
	if string(hdr[:8]) != verifyStateMagic {
		return nil, fmt.Errorf("verify state %s: not a verify state file", path)
	}
	le := binary.LittleEndian
	rec := &verifyRecord{Run: le.Uint64(hdr[8:]), Base: int64(le.Uint64(hdr[16:])), BS: int64(le.Uint64(hdr[24:]))}
	n := le.Uint64(hdr[32:])
	if n > 1<<32 {
		return nil, fmt.Errorf("verify state %s: %d blocks", path, n)
	}
	rec.Blocks = make([]blockRecord, n)
	var line [24]byte
	for i := range rec.Blocks {
		if _, err := io.ReadFull(r, line[:]); err != nil {
			return nil, fmt.Errorf("verify state %s: block %d: %w", path, i, err)
		}
		rec.Blocks[i] = blockRecord{le.Uint64(line[0:]), le.Uint64(line[8:]), le.Uint64(line[16:])}
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("verify state %s: trailing bytes", path)
	}
	return rec, nil
}

// check holds block i of the region, read back into b, to the record.
// exact (the run exited 0, and nothing happened to the target since)
// wants the acknowledged generation; otherwise any intact generation
// from the flushed one to the submitted one will do, or, where no flush
// covered a write, zeros or another run's block.
func (rec *verifyRecord) check(b []byte, i int, exact bool) error {
	br := rec.Blocks[i]
	lba := uint64(rec.Base) + uint64(i)
	if exact {
		_, err := checkBlock(b, lba, br.Acked, rec.Run)
		return err
	}
	got, out, err := readBlock(b, lba, rec.Run)
	switch {
	case out == verifyMismatch:
		return err
	case out != verifyOK && br.Flushed > 0:
		return fmt.Errorf("lba %d: flushed generation %d lost: reads zeros or another run's block", lba, br.Flushed)
	case out != verifyOK:
		return nil
	case got < br.Flushed:
		return fmt.Errorf("lba %d: generation %d, but %d was flushed (flushed write lost)", lba, got, br.Flushed)
	case got > br.Submitted:
		return fmt.Errorf("lba %d: generation %d, but only %d was ever written", lba, got, br.Submitted)
	}
	return nil
}
