package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestHostileBusy: a gosrp target answers commands BUSY, as a draining
// srpd does with what arrives while it stops (the command never ran).
// Over a real emu connection, on every profile and for both mechanisms:
//
//   - one command in three answered BUSY: every I/O completes without
//     error, every block reads back as written, no connection is lost,
//     and the stale-descriptor probe finds every completed key dead
//     (a BUSY answer invalidated the key its command was sent with; the
//     command asked again goes under a new one);
//   - every command answered BUSY: each I/O fails once its IOTimeout
//     has passed since it was first sent, with os.ErrDeadlineExceeded
//     and IOError.Busy, never earlier and never by looping on; and when
//     the target stops, the same connection serves the next I/O.
func TestHostileBusy(t *testing.T) {
	for _, mech := range mechanisms {
		for _, profile := range emu.Profiles() {
			t.Run("one-in-three/"+mech.String()+"/"+profile, func(t *testing.T) {
				var armed atomic.Bool
				var n, lies atomic.Int64
				r := newHostileRig(t, profile, targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
					if iu := rsp.IU(); armed.Load() && busyable(iu) && n.Add(1)%3 == 0 {
						lies.Add(1)
						makeBusy(iu)
					}
					return targettest.Pass
				}})
				s, v := r.dial(t, initiator.Config{Mechanism: mech, Credits: 4, LossTimeout: 20 * time.Second})
				const depth, size, rounds = 4, 16384, 24
				model := make([]byte, 32*size)
				done := make(chan *initiator.Request, depth)
				bufs := make([][]byte, depth)
				for k := range bufs {
					bufs[k] = make([]byte, size)
				}
				armed.Store(true)
				for round := range rounds {
					op := initiator.OpWrite
					if round%2 == 1 {
						op = initiator.OpRead
					}
					base := (round / 2 * depth) % 32
					for k, b := range bufs {
						for j := range b {
							b[j] = byte(round + k + j)
						}
						if op == initiator.OpRead {
							clear(b)
						}
						if err := v.Submit(&initiator.Request{Op: op, Buf: b, Offset: int64(base+k) * size, Done: done}); err != nil {
							t.Fatal(err)
						}
					}
					for range depth {
						req := <-done
						if req.Err != nil {
							t.Fatalf("round %d: %s at %d: %v", round, req.Op, req.Offset, req.Err)
						}
						if off := req.Offset; op == initiator.OpWrite {
							copy(model[off:], req.Buf)
						} else if !bytes.Equal(req.Buf, model[off:off+size]) {
							t.Fatalf("round %d: read at %d differs from what was written", round, off)
						}
					}
					probeStale(t, r, round)
				}
				armed.Store(false)
				st := s.Stats()
				t.Logf("%d answered BUSY; connections lost %d", lies.Load(), st.ConnectionsLost)
				if lies.Load() < rounds*depth/4 {
					t.Fatalf("only %d answers were made BUSY: the test proves little", lies.Load())
				}
				if st.ConnectionsLost != 0 {
					t.Fatalf("%d connections lost over BUSY answers", st.ConnectionsLost)
				}
			})
			t.Run("forever/"+mech.String()+"/"+profile, func(t *testing.T) {
				var armed atomic.Bool
				var lies atomic.Int64
				r := newHostileRig(t, profile, targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
					if iu := rsp.IU(); armed.Load() && busyable(iu) {
						lies.Add(1)
						makeBusy(iu)
					}
					return targettest.Pass
				}})
				const timeout = 500 * time.Millisecond
				s, v := r.dial(t, initiator.Config{Mechanism: mech, Credits: 4, IOTimeout: timeout, LossTimeout: 20 * time.Second})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				armed.Store(true)
				for _, op := range []initiator.Op{initiator.OpWrite, initiator.OpRead} {
					start := time.Now()
					buf := make([]byte, 8192)
					var err error
					if op == initiator.OpWrite {
						_, err = v.WriteAtContext(ctx, buf, 0)
					} else {
						_, err = v.ReadAtContext(ctx, buf, 0)
					}
					took := time.Since(start)
					var ioe *initiator.IOError
					if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ioe) || !ioe.Busy {
						t.Fatalf("%s against a target busy forever: %v; want a busy IOError with os.ErrDeadlineExceeded", op, err)
					}
					if took < timeout {
						t.Fatalf("%s failed after %s, before its I/O timeout %s", op, took, timeout)
					}
					t.Logf("%s: %v after %s", op, err, took.Round(time.Millisecond))
				}
				if lies.Load() < 4 {
					t.Fatalf("%d answers made BUSY: the commands were not asked again", lies.Load())
				}
				armed.Store(false)
				serves(ctx, t, v, "once the target is no longer busy")
				if st := s.Stats(); st.ConnectionsLost != 0 {
					t.Fatalf("%d connections lost over BUSY answers", st.ConnectionsLost)
				}
				if err := s.Check(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// busyable reports whether iu is a gosrp response to a command that
// completed GOOD (the answer a hostile target turns into BUSY).
func busyable(iu []byte) bool {
	var rsp wire.Response
	return rsp.Decode(iu) == nil && rsp.Status == wire.StatusGood
}

// makeBusy rewrites a gosrp response in place as BUSY.
func makeBusy(iu []byte) {
	var rsp wire.Response
	if rsp.Decode(iu) != nil {
		return
	}
	rsp.Status, rsp.Sense, rsp.Residual = wire.StatusBusy, 0, 0
	_, _ = rsp.Encode(iu)
}

// serves fails the test unless v takes a write and reads it back; when
// ("once ...") names the moment in the failure message.
func serves(ctx context.Context, t *testing.T, v *initiator.Volume, when string) {
	t.Helper()
	want := bytes.Repeat([]byte{0x3C}, 8192)
	if _, err := v.WriteAtContext(ctx, want, 4096); err != nil {
		t.Fatalf("a write %s: %v", when, err)
	}
	got := make([]byte, len(want))
	if _, err := v.ReadAtContext(ctx, got, 4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read %s: %v (equal %v)", when, err, bytes.Equal(got, want))
	}
}
