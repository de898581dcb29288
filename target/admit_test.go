package target

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// rawConnect sends, from a socket bound to local, the connect request a
// gosrp initiator sends over emu's tcp wire (a 36-byte frame header of
// kind CM_REQ and a hello) and never logs in: the cheap request that
// costs a target a connection's resources. It reports whether the
// target accepted (CM_REP) or rejected (CM_REJ) it; the socket stays
// open until the test ends.
func rawConnect(t *testing.T, local, addr string) bool {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := nc.Write(e2etest.ConnectRequest()); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [36]byte
	if _, err := io.ReadFull(nc, h[:]); err != nil {
		t.Fatalf("no answer to a connect request: %v", err)
	}
	switch h[3] {
	case 0x41:
		return true
	case 0x42:
		return false
	}
	t.Fatalf("answer of kind %#x", h[3])
	return false
}

// TestPreLoginCaps: connection requests that never log in are capped per
// source and in all, each one beyond a cap is rejected at once unless it
// can take the slot of a silent one (chooseVictim), and an honest client
// from elsewhere still logs in while they hold their slots.
func TestPreLoginCaps(t *testing.T) {
	const perSource, total, flood = 4, 6, 10
	r := newRig(t, env{emu.WireTCP, "strict"}, Config{MaxPendingPerSource: perSource, MaxPendingLogins: total, LoginTimeout: time.Minute})
	// Only the per-source rule may evict here: on a loaded machine the
	// first source's connections can be silent for evictAge before the
	// second source's arrive, and the age rule would take more slots.
	r.tgt.mu.Lock()
	r.tgt.evictAge = int64(time.Hour)
	r.tgt.mu.Unlock()
	accepted := 0
	for range flood {
		if rawConnect(t, "127.0.0.2", r.addr) {
			accepted++
		}
	}
	if accepted != perSource {
		t.Errorf("%d of %d requests from one source accepted, want %d", accepted, flood, perSource)
	}
	c := r.dial(t) // from 127.0.0.1
	c.login("honest")
	accepted = 0
	for range flood {
		if rawConnect(t, "127.0.0.3", r.addr) {
			accepted++
		}
	}
	// One slot went to the honest client until it logged in, and was
	// given back then. The second source fills the total cap, and takes
	// one more slot from the first, which then holds two more than it
	// (4 against 2); at 3 against 3 it is refused.
	if want := total - perSource + 1; accepted != want {
		t.Errorf("%d of %d requests from a second source accepted, want %d (the total cap, and one eviction)", accepted, flood, want)
	}
	if st := r.tgt.Stats(); st.Rejected != 2*flood-total-1 || st.Evicted != 1 {
		t.Errorf("Rejected = %d, Evicted = %d, want %d and 1", st.Rejected, st.Evicted, 2*flood-total-1)
	}
	c.control(wire.ControlRequest{Op: wire.ControlList})
}

// TestConnectionCaps: logged-in connections count against the caps on
// all connections, per source and in all, so a peer allowed to log in
// cannot open connections until the target runs out of memory; a request
// beyond a cap is rejected at once, no connection in is evicted for it,
// and a slot given back by a connection that ended is taken again.
func TestConnectionCaps(t *testing.T) {
	const perSource, total = 3, 5
	r := newRig(t, env{emu.WireTCP, "strict"}, Config{MaxConnectionsPerSource: perSource, MaxConnections: total,
		MaxPendingLogins: -1, MaxPendingPerSource: -1, LoginTimeout: time.Minute})
	var in []*client
	for i := range perSource {
		c := r.dial(t) // from 127.0.0.1
		c.login(fmt.Sprintf("host-%d", i))
		in = append(in, c)
	}
	// Refused with a reason the initiator can print: a gosrp connect
	// reject for a hello, an SRP_LOGIN_REJ for an SRP login.
	_, err := r.dialHello(t, wire.Hello{Version: wire.Version}.Encode())
	var rej *transport.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("connection %d from one source: %v, want a reject", perSource+1, err)
	}
	if cr, err := wire.DecodeConnReject(rej.PrivateData); err != nil || cr.Reason != wire.RejectInsufficientResources {
		t.Errorf("the reject carries %x: %+v, %v; want insufficient resources", rej.PrivateData, cr, err)
	}
	if got := r.srpReject(t, srpLoginReq(1)); got.Reason != srp.RejectInsufficientResources {
		t.Errorf("SRP login beyond the cap rejected for %v, want insufficient resources", got.Reason)
	}
	accepted := 0
	for range 4 {
		if rawConnect(t, "127.0.0.2", r.addr) {
			accepted++
		}
	}
	if accepted != total-perSource {
		t.Errorf("%d of 4 requests from a second source accepted, want %d (the total cap)", accepted, total-perSource)
	}
	if st := r.tgt.Stats(); st.Rejected != 2+4-(total-perSource) || st.Evicted != 0 {
		t.Errorf("Rejected = %d, Evicted = %d, want %d and 0", st.Rejected, st.Evicted, 2+4-(total-perSource))
	}
	// Every logged-in connection still works.
	for _, c := range in {
		c.control(wire.ControlRequest{Op: wire.ControlList})
	}
	// One ends; once the target has let it go, its slot is free again.
	in[0].close()
	waitFor(t, "the target to let the closed connection go", func() bool { return r.tgt.Stats().Connections < total })
	if !rawConnect(t, "127.0.0.3", r.addr) {
		t.Error("a request after a connection ended was refused")
	}
}

// TestChooseVictim is the eviction policy: a newcomer takes the slot of
// the oldest connection of a source holding at least two more slots than
// its own, else of the oldest connection silent for minAge, else none.
func TestChooseVictim(t *testing.T) {
	p := func(src string, since int64) pendingInfo { return pendingInfo{src: src, since: since} }
	for _, tc := range []struct {
		name    string
		pending []pendingInfo
		src     string
		now     int64
		want    int
	}{
		{"the heavy source pays", []pendingInfo{p("a", 0), p("b", 1), p("b", 2), p("b", 3)}, "c", 5, 1},
		{"one more is no reason", []pendingInfo{p("a", 0), p("b", 1), p("b", 2)}, "a", 5, -1},
		{"old and silent goes", []pendingInfo{p("a", 0), p("b", 1), p("c", 2)}, "d", 100, 0},
		{"young ones stay", []pendingInfo{p("a", 50), p("b", 60), p("c", 70)}, "d", 100, -1},
		{"already evicted is skipped", []pendingInfo{{src: "a", since: 0, evicted: true}, p("b", 1), p("c", 2)}, "d", 100, 1},
		{"the heavy source may be the newcomer's", []pendingInfo{p("a", 0), p("a", 1), p("a", 2)}, "a", 5, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			count := map[string]int{}
			for _, q := range tc.pending {
				if !q.evicted {
					count[q.src]++
				}
			}
			if got := chooseVictim(tc.pending, count, tc.src, tc.now, 90); got != tc.want {
				t.Errorf("victim %d, want %d", got, tc.want)
			}
		})
	}
}
