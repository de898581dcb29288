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
	if _, err := r.store.Create("vol1", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	s, v0 := r.dial(t, initiator.Config{LossTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v1, err := s.Open(ctx, "vol1", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := bytes.Repeat([]byte{0xA0}, 4096), bytes.Repeat([]byte{0xB1}, 4096)
	if _, err := v0.WriteAtContext(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	phase.Store(1)
	if _, err := v1.WriteAtContext(ctx, b, 0); err != nil {
		t.Fatal(err)
	}
	if !lied.Load() {
		t.Fatal("the script never answered a re-open with the other volume's handle: the test tests nothing")
	}
	if _, err := v1.WriteAtContext(ctx, b, 4096); err != nil {
		t.Fatal(err)
	}
	readsOwn(t, ctx, v0, append(a, make([]byte, 4096)...), v1, append(b, b...))
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
