package initiator_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target/targettest"
)

// TestKeepaliveTraffic: with KeepaliveTimeout 200 ms, a session whose
// writes complete sends nothing but them (the target posts exactly one
// response per write: no ping), an idle one is pinged (more responses
// than requests), and a target that then answers nothing, logins
// included, is left within about the timeout: the next write fails
// with ErrConnectionLost after LossTimeout counted from the target's
// last answer, not after IOTimeout (30 s) or ConnectTimeout (10 s).
func TestKeepaliveTraffic(t *testing.T) {
	var responses atomic.Int64
	var frozen atomic.Bool
	r := newHostileRig(t, "", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		if frozen.Load() {
			return targettest.Drop
		}
		if !rsp.Login {
			responses.Add(1)
		}
		return targettest.Pass
	}})
	const ka = 200 * time.Millisecond
	s, v := r.dial(t, initiator.Config{KeepaliveTimeout: ka, LossTimeout: 300 * time.Millisecond})
	buf := make([]byte, 4096)

	before, writes := responses.Load(), int64(0)
	for start := time.Now(); time.Since(start) < 4*ka; writes++ {
		if _, err := v.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := responses.Load() - before; got != writes {
		t.Errorf("%d writes drew %d responses: the keepalive pinged a session whose I/O completes", writes, got)
	}

	before = responses.Load()
	time.Sleep(5 * ka) // pings every 100-200 ms (a ping at 100 ms of silence, on 100 ms ticks)
	if got := responses.Load() - before; got < 2 {
		t.Errorf("an idle session drew %d responses in %v: want its pings answered", got, 5*ka)
	}

	frozen.Store(true)
	defer frozen.Store(false)
	start := time.Now()
	_, err := v.WriteAt(buf, 0)
	took := time.Since(start)
	if !errors.Is(err, initiator.ErrConnectionLost) {
		t.Fatalf("write to a silent target: %v, want ErrConnectionLost", err)
	}
	t.Logf("write to a silent target failed after %v: %v", took, err)
	if took > 2*time.Second {
		t.Errorf("the write failed after %v; the keepalive (%v) should end it within a second", took, ka)
	}
	if st := s.Stats(); st.ConnectionsLost == 0 {
		t.Error("no connection counted lost")
	}
}

// TestKeepaliveIdleTargetFreezes: a session that does no I/O at all when
// its target stops answering (a SIGSTOPped srpd: connections up, nothing
// answered) still finds it dead. An idle channel takes no regular tick
// (tickTimer), so only the keepalive's own due times can send the ping
// and then end the connection: within about KeepaliveTimeout and a half
// (200 ms here), not never.
func TestKeepaliveIdleTargetFreezes(t *testing.T) {
	var frozen atomic.Bool
	r := newHostileRig(t, "", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		if frozen.Load() {
			return targettest.Drop
		}
		return targettest.Pass
	}})
	const ka = 200 * time.Millisecond
	s, v := r.dial(t, initiator.Config{KeepaliveTimeout: ka, LossTimeout: 10 * time.Second})
	if _, err := v.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	frozen.Store(true)
	defer frozen.Store(false)
	start := time.Now()
	for s.Stats().ConnectionsLost == 0 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("an idle session whose target stopped answering was not found dead in %v (KeepaliveTimeout %v)", time.Since(start), ka)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("found dead %v after the target froze", time.Since(start).Round(time.Millisecond))
}
