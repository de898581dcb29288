package target

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/wire"
)

// spareCount is how many buffer sets the target keeps now.
func (r *rig) spareCount() int {
	r.tgt.spares.mu.Lock()
	defer r.tgt.spares.mu.Unlock()
	return len(r.tgt.spares.sets)
}

// connBufsOf returns the buffer sets of the target's connections.
func (r *rig) connBufsOf() []*connBufs {
	r.tgt.mu.Lock()
	defer r.tgt.mu.Unlock()
	var bs []*connBufs
	for _, c := range r.tgt.conns {
		bs = append(bs, c.bufs)
	}
	return bs
}

// rwRound writes a pattern through c and reads it back through c.
func rwRound(t *testing.T, c *client, seed byte) {
	t.Helper()
	c.login("ini")
	h := c.open("vol0", false)
	want := pattern(64<<10, seed)
	copy(c.data(0, len(want)), want)
	rsp, _ := c.do(c.io(wire.OpWrite, h, 0, 0, len(want), 2))
	expectGood(t, rsp)
	clear(c.data(128<<10, len(want)))
	rsp, _ = c.do(c.io(wire.OpRead, h, 0, 128<<10, len(want), 3))
	expectGood(t, rsp)
	if !bytes.Equal(c.data(128<<10, len(want)), want) {
		t.Fatal("READ after WRITE returned other bytes")
	}
}

// TestSpareBuffers: a released connection leaves its PD and registered
// buffers for the next accept, which then registers nothing and serves
// I/O through them; the target keeps at most SpareBuffers sets (none
// by default) and none once shut down.
func TestSpareBuffers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spares int
		kept   int // of three connections closed
	}{
		{"four", 4, 3},
		{"two", 2, 2},
		{"default", 0, 0},
		{"negative", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, env{wire: "loop"}, Config{SpareBuffers: tc.spares})
			var cs []*client
			for i := range 3 {
				c := r.dial(t)
				rwRound(t, c, byte(i+1))
				cs = append(cs, c)
			}
			first := r.connBufsOf()
			for _, c := range cs {
				c.close()
			}
			waitFor(t, "the connections' teardown", func() bool { return len(r.connBufsOf()) == 0 })
			if n := r.spareCount(); n != tc.kept {
				t.Fatalf("%d spare sets after 3 connections ended, want %d", n, tc.kept)
			}

			c := r.dial(t)
			rwRound(t, c, 9)
			now := r.connBufsOf()
			if len(now) != 1 {
				t.Fatalf("%d connections, want 1", len(now))
			}
			reused := false
			for _, b := range first {
				reused = reused || b == now[0]
			}
			if reused != (tc.kept > 0) {
				t.Fatalf("the new connection reused a released set: %v, want %v", reused, tc.kept > 0)
			}
			if n := r.spareCount(); n != max(tc.kept-1, 0) {
				t.Fatalf("%d spare sets with one connection up, want %d", n, max(tc.kept-1, 0))
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.tgt.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if n := r.spareCount(); n != 0 {
				t.Fatalf("%d spare sets after Shutdown, want 0", n)
			}
			if r.tgt.spares.put(now[0]) != now[0] {
				t.Fatal("a set was kept after Shutdown")
			}
		})
	}
}

// TestSpareBuffersRefusedLogin: an SRP login refused before the accept
// leaves its set too, so that a peer whose logins are refused costs one
// registration, not one per attempt; and a full set of spares makes
// room for the newest, so that connections of another size (an SRP
// channel's after gosrp ones) are not shut out by older sets.
func TestSpareBuffersRefusedLogin(t *testing.T) {
	r := newRig(t, env{wire: "loop"}, Config{SpareBuffers: 1, SRPCredits: 4})
	req := srpLoginReq(3)
	req.MaxITIULen = 0 // refused: IUs of 0 bytes
	r.srpReject(t, req)
	waitFor(t, "the refused login's set kept", func() bool { return r.spareCount() == 1 })
	kept := r.tgt.spares.sets[0]
	r.srpReject(t, req)
	waitFor(t, "the next refused login's teardown", func() bool { return len(r.connBufsOf()) == 0 && r.spareCount() == 1 })
	if r.tgt.spares.sets[0] != kept {
		t.Fatal("the second refused login registered a set of its own")
	}

	// A gosrp connection's set (8 credits) does not fit an SRP
	// channel's (4): it is made anew, and kept in place of the older.
	c := r.dial(t)
	rwRound(t, c, 1)
	c.close()
	waitFor(t, "the gosrp connection's set kept", func() bool {
		r.tgt.spares.mu.Lock()
		defer r.tgt.spares.mu.Unlock()
		return len(r.tgt.spares.sets) == 1 && r.tgt.spares.sets[0] != kept
	})
}
