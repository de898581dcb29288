package target

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/wire"
)

// batchVol is a volume that takes write batches, on top of a memory volume
// (which it hides as not Immediate, so its writes take the batch path).
type batchVol struct {
	Volume
	stalled   bool  // what Stalled reports
	failBatch bool  // WriteBatch fails before writing anything
	badOff    int64 // WriteAt fails at this offset (-1: never)

	mu      sync.Mutex
	batches []int // requests per WriteBatch call
	singles atomic.Int64
}

var errBad = errors.New("batchVol: bad block")

func (v *batchVol) WriteBatch(bufs [][]byte, offs []int64) error {
	v.mu.Lock()
	v.batches = append(v.batches, len(bufs))
	v.mu.Unlock()
	if v.failBatch {
		return errBad
	}
	for i := range bufs {
		if _, err := v.Volume.WriteAt(bufs[i], offs[i]); err != nil {
			return err
		}
	}
	return nil
}

func (v *batchVol) Stalled() bool { return v.stalled }

func (v *batchVol) WriteAt(p []byte, off int64) (int, error) {
	v.singles.Add(1)
	if off == v.badOff {
		return 0, errBad
	}
	return v.Volume.WriteAt(p, off)
}

// TestWriteBatches runs rounds of eight concurrent writes against volumes
// that take batches: on the loop, on a worker while the volume reports a
// stall, with batches that fail, where every write must get its own
// status, and spread over two volumes, each with its own batch.
func TestWriteBatches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stalled   bool
		failBatch bool
		vols      int
	}{{"loop", false, false, 1}, {"stalled", true, false, 1}, {"failing", false, true, 1}, {"two-volumes", false, false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			vols := map[string]*batchVol{}
			r := newRig(t, env{wire: "loop", profile: "strict"}, Config{})
			r.cat.wrap = func(v Volume) Volume {
				bv := &batchVol{Volume: v, stalled: tc.stalled, failBatch: tc.failBatch, badOff: -1}
				if tc.failBatch {
					bv.badOff = 3 * bs
				}
				mu.Lock()
				vols[v.(interface{ Name() string }).Name()] = bv
				mu.Unlock()
				return bv
			}
			c := r.dial(t)
			c.login("ini")
			names := []string{"vol0", "vol1"}[:tc.vols]
			handles := make([]uint32, tc.vols)
			for i, n := range names {
				handles[i] = c.open(n, false)
			}
			// Write i goes to volume i%vols, block i/vols.
			where := func(i int) (int, int64) { return i % tc.vols, int64(i/tc.vols) * bs }
			const n = 8 // the rig's credits
			for round := range 20 {
				want := map[uint64]int{} // tag -> write index
				for i := range n {
					v, off := where(i)
					copy(c.data(i*bs, bs), pattern(bs, byte(round*n+i)))
					cmd := c.io(wire.OpWrite, handles[v], uint64(off), i*bs, bs, 1)
					c.postCommand(&cmd)
					want[cmd.Tag] = i
				}
				for range n {
					rsp, _ := c.readResponse()
					i, ok := want[rsp.Tag]
					if !ok {
						t.Fatalf("response for unknown tag %d", rsp.Tag)
					}
					delete(want, rsp.Tag)
					if v, off := where(i); off == vols[names[v]].badOff {
						expectSense(t, rsp, wire.SenseMediumError)
					} else {
						expectGood(t, rsp)
					}
				}
				for i := range n {
					v, off := where(i)
					if off == vols[names[v]].badOff {
						continue
					}
					got := make([]byte, bs)
					if _, err := r.openVol(t, names[v]).ReadAt(got, off); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, pattern(bs, byte(round*n+i))) {
						t.Fatalf("round %d: %s block %d does not hold its write", round, names[v], off/bs)
					}
				}
			}
			inBatches, batches, singles := 0, 0, 0
			for name, bv := range vols {
				bv.mu.Lock()
				if !tc.stalled && len(bv.batches) == 0 {
					t.Errorf("%s: no write went through WriteBatch", name)
				}
				for _, k := range bv.batches {
					inBatches += k
				}
				batches += len(bv.batches)
				bv.mu.Unlock()
				singles += int(bv.singles.Load())
			}
			if tc.failBatch {
				singles -= inBatches // the retries of failed batches
			}
			if !tc.stalled && singles != 0 {
				// On the loop every plain write goes through WriteBatch,
				// alone or not.
				t.Errorf("%d writes bypassed WriteBatch", singles)
			}
			if inBatches+singles != 20*n {
				t.Fatalf("%d writes in %d batches and %d alone, want %d writes", inBatches, batches, singles, 20*n)
			}
			t.Logf("%d writes in %d batches, %d alone", inBatches, batches, singles)
		})
	}
}

// fakeBatcher records WriteBatch calls for TestRunBatch.
type fakeBatcher struct {
	Volume
	err   error
	calls int
	offs  []int64
	lens  []int
}

func (f *fakeBatcher) WriteBatch(bufs [][]byte, offs []int64) error {
	f.calls++
	f.offs = append(f.offs, offs...)
	for _, b := range bufs {
		f.lens = append(f.lens, len(b))
	}
	return f.err
}

func (f *fakeBatcher) Stalled() bool { return false }

func (f *fakeBatcher) WriteAt(p []byte, off int64) (int, error) {
	if off == 2*bs {
		return 0, errBad
	}
	return len(p), nil
}

// TestRunBatch checks runBatch on a chain of three slots: one WriteBatch
// call in chain order, or, when it fails, one WriteAt per slot with its
// own result; the volume's in-flight count is released either way.
func TestRunBatch(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			f := &fakeBatcher{}
			if fail {
				f.err = errors.New("batch failed")
			}
			ov := &openVol{vol: f, batch: f}
			slots := make([]slot, 4)
			chain := []int32{3, 0, 2} // slot 3 leads
			for k, idx := range chain {
				s := &slots[idx]
				s.idx, s.ov, s.job, s.next = idx, ov, jobWrite, -1
				s.data = make([]byte, 2*bs)
				s.cmd.Offset, s.cmd.Length = uint64(k)*bs, uint32(bs*(k+1)/2+bs/2)
				s.err = errors.New("stale")
				if k > 0 {
					slots[chain[k-1]].next = idx
				}
				ov.inflight.Add(1)
			}
			bufs, offs := runBatch(slots, 3, nil, nil)
			if len(bufs) != 3 || len(offs) != 3 {
				t.Fatalf("scratch of %d buffers and %d offsets, want 3", len(bufs), len(offs))
			}
			if f.calls != 1 || fmt.Sprint(f.offs) != fmt.Sprint([]int64{0, bs, 2 * bs}) ||
				fmt.Sprint(f.lens) != fmt.Sprint([]int{bs, bs + bs/2, 2 * bs}) {
				t.Fatalf("WriteBatch calls %d with offsets %v, lengths %v", f.calls, f.offs, f.lens)
			}
			for k, idx := range chain {
				err := slots[idx].err
				wantErr := fail && k == 2 // WriteAt fails at 2*bs
				if (err != nil) != wantErr {
					t.Errorf("slot %d (offset %d): err %v, want error %v", idx, k*bs, err, wantErr)
				}
			}
			waited := make(chan struct{})
			go func() { ov.inflight.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(10 * time.Second):
				t.Fatal("runBatch left the volume's in-flight count raised")
			}
		})
	}
}
