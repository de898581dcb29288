package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
)

// TestHostileReopenNotReady: once the connection is lost, the target
// takes every re-login but answers the re-OPEN of vol0 NOT READY and
// then cuts the connection, on every new connection alike. A write
// issued as the trouble starts must fail with ErrNotReady at the
// volume's loss deadline, LossTimeout (3 s) from the first loss, and
// not hang: that deadline is the volume's and survives connections
// (late_open.go, lateVols.due); were it the connection's, each new one
// would grant a fresh LossTimeout and such a target would hold the
// write for as long as it kept this up. TestReopenLateLostAgain covers
// the same code with a flapping link; here the target itself does it,
// each time after answering. Past the deadline the volume's next write
// fails at once, sooner than a fresh LossTimeout would let it, and so
// do those submitted as the connection is cut and torn down and while
// it is down (the target then refuses every login): none may wait for
// a connection that the volume's deadline has already given up on
// (channel.stopLate, channel.downDue; the one write before them happens
// to find the connection up on emu). Once
// the target behaves, the same Volume is served again (the late
// volume's re-open succeeds) and reads back, byte for byte, what was
// written before the trouble; the session then closes cleanly.
func TestHostileReopenNotReady(t *testing.T) {
	reopenNotReady(t, func(t *testing.T, script targettest.Script, cfg initiator.Config) (*initiator.Session, *initiator.Volume) {
		return newHostileRig(t, "strict", script).dial(t, cfg)
	})
}

// notReadyRig starts a target with an 8 MiB vol0 of 4 KiB blocks behind
// the hostile kit's script and dials it with cfg, vol0 open.
type notReadyRig func(t *testing.T, script targettest.Script, cfg initiator.Config) (*initiator.Session, *initiator.Volume)

// reopenNotReady is TestHostileReopenNotReady against the target that rig
// makes: emu's hostile rig here, the device in TestRXEEndToEnd.
func reopenNotReady(t *testing.T, rig notReadyRig) {
	const loss, slack, maxCuts = 3 * time.Second, 5 * time.Second, 20
	var trouble, refuse atomic.Bool
	var notReady, cuts, refused atomic.Int32
	var mu sync.Mutex
	var answered transport.QP // the target QP whose re-OPEN was answered NOT READY
	script := targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		if rsp.Login && refuse.Load() {
			refused.Add(1)
			return targettest.Disconnect
		}
		if !trouble.Load() || rsp.Login {
			return targettest.Pass
		}
		mu.Lock()
		defer mu.Unlock()
		// The first OPEN answered on a connection is rewritten NOT READY;
		// whatever comes after it on that connection (the late volume's
		// next OPEN), and before it (the I/O that meets the trouble),
		// ends the connection instead.
		if a, ok := openAnswerOf(rsp); ok && rsp.QP != answered {
			if !a.notReady() {
				t.Errorf("the OPEN's answer could not be rewritten as NOT READY in place")
				return targettest.Pass
			}
			answered = rsp.QP
			notReady.Add(1)
			return targettest.Pass
		}
		cuts.Add(1)
		return targettest.Disconnect
	}}
	s, v := rig(t, script, initiator.Config{LossTimeout: loss, IOTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := bytes.Repeat([]byte{0xC3, 0x5A}, 4096) // two blocks at 0
	mustWrite(t, ctx, v, before, 0)

	trouble.Store(true)
	start := time.Now()
	err := write(v, 8192, loss+slack)
	elapsed := time.Since(start)
	t.Logf("write: %v after %v; %d re-OPENs answered NOT READY, %d cuts, %d reconnects",
		err, elapsed.Round(time.Millisecond), notReady.Load(), cuts.Load(), s.Stats().Reconnects)
	if !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("write across a target that answers every re-OPEN NOT READY and cuts: %v after %v, want ErrNotReady within LossTimeout %v + %v",
			err, elapsed.Round(time.Millisecond), loss, slack)
	}
	if elapsed >= loss+slack {
		t.Fatalf("ErrNotReady came %v after the first loss, past LossTimeout %v + %v: the deadline was renewed", elapsed, loss, slack)
	}
	if n := notReady.Load(); n < 2 || elapsed < loss/2 {
		t.Fatalf("the write failed after %v and %d NOT READY answers, want at least %v and 2: the volume was not waited for across connections",
			elapsed, n, loss/2)
	}
	// Each connection ended before any I/O completed on it, so each
	// reconnect waited longer than the last (channel.churn): about eight
	// in 3 s, where an immediate reconnect made hundreds.
	if n := cuts.Load(); n > maxCuts {
		t.Errorf("%d connections cut in %v: the initiator reconnected without backing off (want at most %d)", n, elapsed.Round(time.Millisecond), maxCuts)
	}
	if err := write(v, 8192, loss/2); !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("the next write, past the volume's deadline: %v, want ErrNotReady at once (within %v)", err, loss/2)
	}
	// Writes keep coming while the last connection is cut and torn
	// down: those queued as it goes must fail at once too, not wait in
	// the queue for the next connection (stopLate). A login refused
	// means the connection before it was torn down and none is up: the
	// last write meets the channel down, between tries.
	stop := make(chan struct{})
	bad := make(chan error, 1)
	var hammer sync.WaitGroup
	for range 2 {
		hammer.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := write(v, 8192, loss/2); !errors.Is(err, initiator.ErrNotReady) {
					select {
					case bad <- err:
					default:
					}
					return
				}
			}
		})
	}
	refuse.Store(true)
	waitUntil(t, "a login refused", func() bool { return refused.Load() > 0 })
	close(stop)
	hammer.Wait()
	select {
	case err := <-bad:
		t.Fatalf("a write past the volume's deadline as the connection went down: %v, want ErrNotReady at once (within %v)", err, loss/2)
	default:
	}
	if err := write(v, 8192, loss/2); !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("a write past the volume's deadline with the connection down: %v, want ErrNotReady at once (within %v), not a wait for the next connection",
			err, loss/2)
	}

	refuse.Store(false)
	trouble.Store(false)
	got := make([]byte, len(before))
	waitUntil(t, "vol0 served again once the target behaves", func() bool {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		_, err := v.ReadAtContext(rctx, got, 0)
		return err == nil
	})
	if i := firstDiff(got, before); i >= 0 {
		t.Fatalf("vol0 reads back %#x at byte %d, want %#x written before the trouble", got[i], i, before[i])
	}
	mustWrite(t, ctx, v, before[:4096], 8192)
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the trouble: %v", err)
	}
}
