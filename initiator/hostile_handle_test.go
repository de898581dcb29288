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
		iu := rsp.IU()
		if len(iu) == 0 || wire.Opcode(iu[0]) != wire.OpControlResp {
			return targettest.Pass
		}
		var c wire.ControlResponse
		if wire.DecodeControl(iu, wire.OpControlResp, &c) != nil || c.Handle == 0 || c.Error != "" {
			return targettest.Pass
		}
		if vol0Handle.CompareAndSwap(0, c.Handle) || c.Handle == vol0Handle.Load() || lied.Load() {
			return targettest.Pass
		}
		// The first OPEN after vol0's: answer it with vol0's handle.
		c.Handle = vol0Handle.Load()
		b, err := wire.EncodeControl(nil, wire.OpControlResp, &c)
		if err != nil || len(b) != len(iu) {
			t.Errorf("the rewritten answer is %d bytes, the IU %d (%v)", len(b), len(iu), err)
			return targettest.Pass
		}
		copy(iu, b)
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
	got := make([]byte, 4096)
	for _, c := range []struct {
		v    *initiator.Volume
		want []byte
	}{{v0, a}, {v1, b}} {
		if _, err := c.v.ReadAtContext(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("%s reads back %#x, want %#x: one volume's I/O went to the other", c.v.Name(), got[0], c.want[0])
		}
	}
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
		iu := rsp.IU()
		if len(iu) == 0 || wire.Opcode(iu[0]) != wire.OpControlResp || lied.Load() {
			return targettest.Pass
		}
		var c wire.ControlResponse
		if wire.DecodeControl(iu, wire.OpControlResp, &c) != nil || c.Handle == 0 || c.Error != "" {
			return targettest.Pass
		}
		if first.CompareAndSwap(0, c.Handle) {
			return targettest.Pass
		}
		c.Handle = first.Load()
		if b, err := wire.EncodeControl(nil, wire.OpControlResp, &c); err == nil && len(b) == len(iu) {
			copy(iu, b)
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
	got := make([]byte, 8192)
	for _, c := range []struct {
		v    *initiator.Volume
		want []byte
	}{{v0, append(a, make([]byte, 4096)...)}, {v1, append(b, b...)}} {
		if _, err := c.v.ReadAtContext(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("%s reads back %#x…%#x, want %#x…%#x: one volume's I/O went to the other", c.v.Name(), got[0], got[4096], c.want[0], c.want[4096])
		}
	}
}
