package emu

import (
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestRetryRepeatsLocalOps: under Quirks.RetryRepeatsLocalOps a retry
// (here after an RNR NAK) executes again a BIND_MW posted behind the SEND
// it retries, as rxe does. If the peer invalidated the window in between
// (SEND_WITH_INV), the window is valid again under the same key once the
// SEND completes, with nothing reported; if the window is still bound, the
// repeat fails and takes the QP with it. Without the quirk the BIND
// executes once: the invalidated key stays dead and the SEND completes.
func TestRetryRepeatsLocalOps(t *testing.T) {
	for _, tc := range []struct {
		name               string
		repeats, invalidBy bool
	}{
		{"revalidates", true, true},
		{"bound", true, false},
		{"strict", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One RNR wait is long enough for the steps below, so the
			// only retry is the one the test releases. The tcp wire
			// sends what a pass of the requester built when the pass
			// ends, so the BIND has executed when the NAK comes back.
			x := newPair(t, Config{Seed: 1, Wire: WireTCP, RNRTimeout: time.Second, RNRRetry: RNRRetryForever,
				Quirks: &transport.Quirks{RetryRepeatsLocalOps: tc.repeats}}, 4*transport.PageSize)
			mw, err := x.pda.AllocMW()
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Close()
			key := mw.Key().Bump()
			// The SEND finds no receive and is NAKed; the BIND behind it
			// executes meanwhile.
			if _, err := x.qa.PostSend([]transport.SendWR{
				{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{{Addr: x.aa.Addr(), Length: 8, LKey: x.mra.LKey()}}},
				{ID: 2, Opcode: transport.OpBindMW, Bind: transport.BindWR{MW: mw, Key: key, MR: x.mra, Addr: x.mra.Addr(), Length: uint64(transport.PageSize), Access: transport.AccessRemoteWrite}},
			}); err != nil {
				t.Fatal(err)
			}
			probe := func() bool {
				served, _, err := x.pa.Probe(x.qa, transport.OpRDMAWrite, key, x.mra.Addr(), []byte{1})
				if err != nil {
					t.Fatal(err)
				}
				return served
			}
			waitFor(t, "the BIND behind the NAKed SEND to execute", probe)
			waitFor(t, "the SEND to a QP without a receive to be NAKed", func() bool { return x.pa.Counters().Retries > 0 })
			if tc.invalidBy {
				if _, err := x.qa.PostRecv([]transport.RecvWR{{ID: 3, SGL: []transport.SGE{{Addr: x.aa.Addr() + uint64(transport.PageSize), Length: 64, LKey: x.mra.LKey()}}}}); err != nil {
					t.Fatal(err)
				}
				if _, err := x.qb.PostSend([]transport.SendWR{{ID: 4, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: key,
					SGL: []transport.SGE{{Addr: x.ab.Addr(), Length: 8, LKey: x.mrb.LKey()}}}}); err != nil {
					t.Fatal(err)
				}
				if wc := x.wait(t, x.cqb); wc.ID != 4 || wc.Status != transport.StatusSuccess {
					t.Fatalf("SEND_WITH_INV: %+v", wc)
				}
				if wc := x.wait(t, x.cqa); wc.ID != 3 || wc.Status != transport.StatusSuccess || wc.Flags&transport.WCWithInv == 0 {
					t.Fatalf("its receive: %+v", wc)
				}
				if probe() {
					t.Fatalf("key %s served after the peer invalidated it", key)
				}
			}
			// Now the SEND lands on its retry.
			if _, err := x.qb.PostRecv([]transport.RecvWR{{ID: 5, SGL: []transport.SGE{{Addr: x.ab.Addr() + uint64(transport.PageSize), Length: 64, LKey: x.mrb.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqa); wc.ID != 1 || wc.Status != transport.StatusSuccess {
				t.Fatalf("SEND: %+v", wc)
			}
			repeated := x.pa.Counters().RepeatedLocalOps
			// The BIND executed behind the SEND that was still waiting
			// for its ACK: the hazard, counted whether or not a retry
			// comes, and whatever the profile.
			if n := x.pa.Counters().ExposedLocalOps; n != 1 {
				t.Fatalf("%d exposed local operations, want 1 (the BIND behind the SEND)", n)
			}
			switch {
			case tc.repeats && tc.invalidBy:
				if !probe() || repeated != 1 {
					t.Fatalf("the retry repeated %d local operations and the invalidated key is served %v: want the BIND repeated and the key valid again, as on rxe", repeated, probe())
				}
			case tc.repeats:
				if wc := x.wait(t, x.cqa); wc.ID != 2 || wc.Status == transport.StatusSuccess {
					t.Fatalf("the BIND repeated over a bound window: %+v, want it failed", wc)
				}
				if st := x.qa.State(); st != transport.QPErr {
					t.Fatalf("QP %s after a failed repeat, want ERR", st)
				}
			default:
				if probe() || repeated != 0 {
					t.Fatalf("strict device: %d local operations repeated, invalidated key served %v", repeated, probe())
				}
			}
		})
	}
}

// TestRetryRepeatsInvalidate: under Quirks.RetryRepeatsLocalOps an
// unfenced LOCAL_INV of a window, executed behind a SEND that is then
// retried, executes again on the FREE window: what oopses rxe, counted in
// Counters.KernelOopses, and the QP fails. Fenced, the LOCAL_INV waits
// for the SEND, executes once, and the retry has nothing to repeat.
func TestRetryRepeatsInvalidate(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		name := "unfenced"
		if fenced {
			name = "fenced"
		}
		t.Run(name, func(t *testing.T) {
			x := newPair(t, Config{Seed: 1, Wire: WireTCP, RNRTimeout: time.Second, RNRRetry: RNRRetryForever,
				Quirks: &transport.Quirks{RetryRepeatsLocalOps: true}}, 4*transport.PageSize)
			mw, err := x.pda.AllocMW()
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Close()
			key := mw.Key().Bump()
			if _, err := x.qa.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled,
				Bind: transport.BindWR{MW: mw, Key: key, MR: x.mra, Addr: x.mra.Addr(), Length: uint64(transport.PageSize), Access: transport.AccessRemoteWrite}}}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqa); wc.ID != 1 || wc.Status != transport.StatusSuccess {
				t.Fatalf("bind: %+v", wc)
			}
			inv := transport.SendWR{ID: 3, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key}
			if fenced {
				inv.Flags |= transport.FlagFence
			}
			if _, err := x.qa.PostSend([]transport.SendWR{
				{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{{Addr: x.aa.Addr(), Length: 8, LKey: x.mra.LKey()}}},
				inv,
			}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the SEND to a QP without a receive to be NAKed", func() bool { return x.pa.Counters().Retries > 0 })
			served, _, err := x.pa.Probe(x.qa, transport.OpRDMAWrite, key, x.mra.Addr(), []byte{1})
			if err != nil {
				t.Fatal(err)
			}
			if served == !fenced {
				t.Fatalf("fenced %v: the window is served %v while the SEND before the LOCAL_INV waits", fenced, served)
			}
			if _, err := x.qb.PostRecv([]transport.RecvWR{{ID: 4, SGL: []transport.SGE{{Addr: x.ab.Addr(), Length: 64, LKey: x.mrb.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqa); wc.ID != 2 || wc.Status != transport.StatusSuccess {
				t.Fatalf("SEND: %+v", wc)
			}
			wc := x.wait(t, x.cqa)
			c := x.pa.Counters()
			if fenced {
				if wc.ID != 3 || wc.Status != transport.StatusSuccess || c.RepeatedLocalOps != 0 || c.KernelOopses != 0 {
					t.Fatalf("fenced LOCAL_INV: %+v; %d repeated, %d oopses", wc, c.RepeatedLocalOps, c.KernelOopses)
				}
				return
			}
			if wc.ID != 3 || wc.Status == transport.StatusSuccess || c.RepeatedLocalOps != 1 || c.KernelOopses != 1 {
				t.Fatalf("unfenced LOCAL_INV repeated on a FREE window: %+v; %d repeated, %d oopses; want it failed, 1 and 1", wc, c.RepeatedLocalOps, c.KernelOopses)
			}
		})
	}
}

// waitFor polls cond until it holds, failing the test after 5 s: what
// the NIC does on its own goroutines (a NAK, a WR behind it) has no
// event a test could wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
	}
}
