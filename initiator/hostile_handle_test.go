package initiator_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/target/targettest"
)

// TestHostileHandleReuse: the target answers the OPEN of vol1 with the
// handle it gave vol0 on the same connection. Taken, it would send
// vol1's writes to vol0. The initiator refuses the answer as a
// protocol error and ends the connection; the OPEN, re-issued on the
// next one, gets a handle of vol1's own, and each volume reads back
// only what was written to it. An abandoned OPEN's handle counts too:
// the close the initiator owes for it must not name a live volume's.
func TestHostileHandleReuse(t *testing.T) {
	var vol0Handle atomic.Uint32
	var lied atomic.Bool
	r := newHostileRig(t, "strict", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		a, ok := openAnswerOf(rsp)
		if !ok || vol0Handle.CompareAndSwap(0, a.c.Handle) || a.c.Handle == vol0Handle.Load() || lied.Load() {
			return targettest.Pass
		}
		// The first OPEN after vol0's: answer it with vol0's handle.
		if !a.give(vol0Handle.Load()) {
			t.Errorf("the answer could not be rewritten in place")
			return targettest.Pass
		}
		lied.Store(true)
		return targettest.Pass
	}})
	if _, err := r.store.Create("vol1", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	s, v0 := r.dial(t, initiator.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v1, err := s.Open(ctx, "vol1", initiator.OpenOptions{})
	if err != nil {
		t.Fatalf("Open of vol1 re-issued after the lie: %v", err)
	}
	if !lied.Load() {
		t.Fatal("the script never gave vol1 vol0's handle: the test tests nothing")
	}
	a, b := bytes.Repeat([]byte{0xA0}, 4096), bytes.Repeat([]byte{0xB1}, 4096)
	if _, err := v0.WriteAtContext(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := v1.WriteAtContext(ctx, b, 0); err != nil {
		t.Fatal(err)
	}
	readsOwn(t, ctx, v0, a, v1, b)
	if n := s.Stats().ConnectionsLost; n != 1 {
		t.Errorf("connections lost %d, want 1 (the lie ends the connection it came on)", n)
	}
}

// TestHostileReopenHandleReuse: the connection is lost with vol0 and
// vol1 open, and on the next one the target answers the two re-opens
// with one handle. The re-opens do not go through the loop, so Open's
// check does not see them; they are checked on their own: the attempt
// fails as a protocol error, the next gives each volume its own
// handle, and each reads back only what was written to it.
func TestHostileReopenHandleReuse(t *testing.T) {
	var phase atomic.Int32 // 0: open; 1: cut at the next response; 2: lie once on a re-open
	var first atomic.Uint32
	var lied atomic.Bool
	r := newHostileRig(t, "strict", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		switch phase.Load() {
		case 1:
			if rsp.Login {
				return targettest.Pass
			}
			phase.Store(2)
			return targettest.Disconnect
		case 2:
		default:
			return targettest.Pass
		}
		a, ok := openAnswerOf(rsp)
		if !ok || lied.Load() || first.CompareAndSwap(0, a.c.Handle) {
			return targettest.Pass
		}
		if a.give(first.Load()) {
			lied.Store(true)
		}
		return targettest.Pass
	}})
	_, v0, v1, ctx := r.openTwo(t)
	a, b := writeAcrossCut(t, ctx, v0, v1, &phase)
	if !lied.Load() {
		t.Fatal("the script never answered a re-open with the other volume's handle: the test tests nothing")
	}
	mustWrite(t, ctx, v1, b, 4096)
	readsOwn(t, ctx, v0, append(a, make([]byte, 4096)...), v1, append(b, b...))
}

// openTwo creates vol1 beside vol0 and opens both on a session whose
// LossTimeout is 20 s; ctx bounds the test's I/O.
func (r *hostileRig) openTwo(t *testing.T) (s *initiator.Session, v0, v1 *initiator.Volume, ctx context.Context) {
	t.Helper()
	if _, err := r.store.Create("vol1", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	s, v0 = r.dial(t, initiator.Config{LossTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	v1, err := s.Open(ctx, "vol1", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, v0, v1, ctx
}

// writeAcrossCut writes a block of 0xA0 at 0 of v0, sets phase to 1 (a
// script's cue to cut the connection), and writes a block of 0xB1 at 0
// of v1, across the cut; it returns the two blocks.
func writeAcrossCut(t *testing.T, ctx context.Context, v0, v1 *initiator.Volume, phase *atomic.Int32) (a, b []byte) {
	t.Helper()
	a, b = bytes.Repeat([]byte{0xA0}, 4096), bytes.Repeat([]byte{0xB1}, 4096)
	mustWrite(t, ctx, v0, a, 0)
	phase.Store(1)
	mustWrite(t, ctx, v1, b, 0)
	return a, b
}

// mustWrite writes p at off of v, and fails the test if it cannot.
func mustWrite(t *testing.T, ctx context.Context, v *initiator.Volume, p []byte, off int64) {
	t.Helper()
	if _, err := v.WriteAtContext(ctx, p, off); err != nil {
		t.Fatal(err)
	}
}

// openAnswer is a successful OPEN's answer on its way to the initiator,
// decoded from the response's IU, which give rewrites in place.
type openAnswer struct {
	iu []byte
	c  wire.ControlResponse
}

// openAnswerOf decodes rsp as a successful OPEN's answer (ok false for
// any other response).
func openAnswerOf(rsp *targettest.Response) (a openAnswer, ok bool) {
	a.iu = rsp.IU()
	if len(a.iu) == 0 || wire.Opcode(a.iu[0]) != wire.OpControlResp {
		return a, false
	}
	if wire.DecodeControl(a.iu, wire.OpControlResp, &a.c) != nil || a.c.Handle == 0 || a.c.Error != "" {
		return a, false
	}
	return a, true
}

// give makes the answer name handle h; false if the new encoding is not
// the IU's length, and the IU is left as it was.
func (a openAnswer) give(h uint32) bool {
	a.c.Handle = h
	b, err := wire.EncodeControl(nil, wire.OpControlResp, &a.c)
	if err != nil || len(b) != len(a.iu) {
		return false
	}
	copy(a.iu, b)
	return true
}

// readsOwn reads len(want) bytes at 0 of each volume and fails the test
// if one reads back anything but what was written to it.
func readsOwn(t *testing.T, ctx context.Context, v0 *initiator.Volume, want0 []byte, v1 *initiator.Volume, want1 []byte) {
	t.Helper()
	for _, c := range []struct {
		v    *initiator.Volume
		want []byte
	}{{v0, want0}, {v1, want1}} {
		got := make([]byte, len(c.want))
		if _, err := c.v.ReadAtContext(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, c.want); i >= 0 {
			t.Fatalf("%s reads back %#x at byte %d, want %#x: one volume's I/O went to the other", c.v.Name(), got[i], i, c.want[i])
		}
	}
}

// firstDiff is the first index where a and b differ, -1 if none.
func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// notReady rewrites the answer in place into NOT READY, becoming ready
// (the target still opening the volume), its error text padded to the
// IU's length; false if no padding fits.
func (a openAnswer) notReady() bool {
	for pad := range 200 {
		c := wire.ControlResponse{Tag: a.c.Tag, Credits: a.c.Credits, Sense: wire.SenseBecomingReady,
			Error: "still opening" + string(bytes.Repeat([]byte{'.'}, pad))}
		b, err := wire.EncodeControl(nil, wire.OpControlResp, &c)
		if err == nil && len(b) == len(a.iu) {
			copy(a.iu, b)
			return true
		}
	}
	return false
}

// TestHostileLateHandleReuse: the connection is lost with vol0 and vol1
// open; on the next one the target answers the first re-open NOT READY,
// so that both volumes come up late and are asked for once the
// connection is up (late_open.go), and then answers those two OPENs
// with one handle. The late re-opens go through the loop, and the
// second answer is refused as Open's would be: the connection ends,
// the next gives each volume its own handle, and each reads back only
// what was written to it.
func TestHostileLateHandleReuse(t *testing.T) {
	// 0: open; 1: cut at the next response; 2: NOT READY once; 3: lie once.
	var phase atomic.Int32
	var first atomic.Uint32
	r := newHostileRig(t, "strict", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		p := phase.Load()
		if p == 0 || rsp.Login {
			return targettest.Pass
		}
		if p == 1 {
			phase.Store(2)
			return targettest.Disconnect
		}
		a, ok := openAnswerOf(rsp)
		switch {
		case !ok:
		case p == 2:
			if !a.notReady() {
				t.Errorf("the answer could not be rewritten as NOT READY in place")
			}
			phase.Store(3)
		case p == 3 && !first.CompareAndSwap(0, a.c.Handle):
			if a.give(first.Load()) {
				phase.Store(4)
			}
		}
		return targettest.Pass
	}})
	s, v0, v1, ctx := r.openTwo(t)
	a, b := writeAcrossCut(t, ctx, v0, v1, &phase)
	mustWrite(t, ctx, v0, a, 4096)
	if phase.Load() != 4 {
		t.Fatalf("the script stopped at phase %d: no late re-open was answered with the other's handle, so the test tests nothing", phase.Load())
	}
	readsOwn(t, ctx, v0, append(a, a...), v1, append(b, make([]byte, 4096)...))
	if n := s.Stats().ConnectionsLost; n < 2 {
		t.Errorf("connections lost %d, want 2 or more (the cut, then the lie)", n)
	}
}
