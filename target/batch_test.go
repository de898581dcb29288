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

// TestWriteBatches runs rounds of eight concurrent writes against a
// volume that takes batches: on the loop, on a worker while the volume
// reports a stall, and with batches that fail, where every write must get
// its own status.
func TestWriteBatches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stalled   bool
		failBatch bool
	}{{"loop", false, false}, {"stalled", true, false}, {"failing", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var vol *batchVol
			r := newRig(t, env{wire: "loop", profile: "strict"}, Config{})
			r.cat.wrap = func(v Volume) Volume {
				vol = &batchVol{Volume: v, stalled: tc.stalled, failBatch: tc.failBatch, badOff: -1}
				if tc.failBatch {
					vol.badOff = 3 * bs
				}
				return vol
			}
			c := r.dial(t)
			c.login("ini")
			h := c.open("vol0", false)
			const n = 8 // the rig's credits
			for round := range 20 {
				want := map[uint64]int{} // tag -> write index
				for i := range n {
					copy(c.data(i*bs, bs), pattern(bs, byte(round*n+i)))
					cmd := c.io(wire.OpWrite, h, uint64(i)*bs, i*bs, bs, 1)
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
					if int64(i)*bs == vol.badOff {
						expectSense(t, rsp, wire.SenseMediumError)
					} else {
						expectGood(t, rsp)
					}
				}
				got := make([]byte, n*bs)
				if _, err := r.openVol(t, "vol0").ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if int64(i)*bs == vol.badOff {
						continue
					}
					if !bytes.Equal(got[i*bs:(i+1)*bs], pattern(bs, byte(round*n+i))) {
						t.Fatalf("round %d: block %d does not hold its write", round, i)
					}
				}
			}
			vol.mu.Lock()
			defer vol.mu.Unlock()
			inBatches := 0
			for _, k := range vol.batches {
				inBatches += k
			}
			singles := int(vol.singles.Load())
			if tc.failBatch {
				singles -= inBatches // the retries of failed batches
			}
			if inBatches+singles != 20*n {
				t.Fatalf("%d writes in %d batches and %d alone, want %d writes", inBatches, len(vol.batches), singles, 20*n)
			}
			t.Logf("%d writes in %d batches, %d alone", inBatches, len(vol.batches), singles)
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
			bufs, offs := runBatch(slots, &slots[3], nil, nil)
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
