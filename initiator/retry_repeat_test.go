package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRetryLeavesNoKey: on a device whose retries execute again the
// local operations queued behind the request retried (the emulator's rxe
// profile: transport.Quirks.RetryRepeatsLocalOps, as rxe's req_retry
// does), the target's NIC withholds the ACKs of the commands of the I/Os
// in flight while the target serves them, so the initiator's requester
// times out and retries. Without the registration fence
// (frmr.Config.FenceRegistrations) the registration of every I/O but the
// first executed again over its VALID key: it failed, and the connection
// with it, in every round (24 of 24 before the fence); had the target
// invalidated the key remotely, the repeat would have made it valid again
// after its I/O returned. With the fence every registration executes
// behind a fenced LOCAL_INV, with nothing before it a retry rewinds to:
// no local operation runs twice, no connection is lost, no key is valid
// once the I/Os have returned (every fast-registration MR and window with
// remote access is FREE with the session idle), the data reads back, and
// nothing a repeat could do oopses rxe (emu's Counters.KernelOopses). In
// both protocols, with MRs and with windows (the only registration the
// ibverbs provider has on rxe), two to four I/Os at a time.
func TestRetryLeavesNoKey(t *testing.T) {
	for _, proto := range protocols {
		for _, mech := range mechanisms {
			t.Run("protocol="+proto.name+"/"+mech.String(), func(t *testing.T) { testRetryLeavesNoKey(t, proto.cfg, proto.tcfg, proto.vol, mech) })
		}
	}
}

func testRetryLeavesNoKey(t *testing.T, cfg initiator.Config, tcfg target.Config, vol string, mech frmr.Mechanism) {
	seed := testSeed(t)
	r := newRig(t, emu.Config{Profile: "rxe", Wire: emu.WireTCP, Seed: seed, RetryTimeout: 50 * time.Millisecond}, 8<<20, tcfg)
	cfg.Mechanism = mech
	cfg.Credits, cfg.IOTimeout, cfg.ConnectTimeout, cfg.LossTimeout = 8, 5*time.Second, 2*time.Second, 30*time.Second
	cfg.ImmediateData = -1 // every write registers
	s := r.dial(t, cfg)
	retryRounds(t, r.tp, r.ip, openNamed(t, context.Background(), s, vol), 24, nil)
	c := r.ip.Counters()
	t.Logf("initiator NIC: %d retries, %d local operations repeated; connections lost %d", c.Retries, c.RepeatedLocalOps, s.Stats().ConnectionsLost)
	if c.Retries == 0 {
		t.Fatal("no retry: the test tested nothing")
	}
	if c.ExposedLocalOps != 0 {
		t.Fatalf("%d local operations executed behind a request waiting for its ACK", c.ExposedLocalOps)
	}
	if c.RepeatedLocalOps != 0 {
		t.Fatalf("retries executed %d local operations again: a registration ran behind a request not yet acknowledged", c.RepeatedLocalOps)
	}
	if c.KernelOopses != 0 {
		t.Fatalf("%d repeated operations would have oopsed rxe", c.KernelOopses)
	}
	// Every registration executed behind a fenced LOCAL_INV
	// (frmr.Config.FenceRegistrations): a repeat of one would have
	// failed over its VALID key, and the connection with it.
	if lost := s.Stats().ConnectionsLost; lost != 0 {
		t.Fatalf("%d connections lost to retries", lost)
	}
}

// TestRetryLeavesNoKeyHostile is TestRetryLeavesNoKey against a target
// that, once in each round, invalidates the key of an I/O it answers
// although the initiator asked it not to. Accepted, the invalidation would
// be undone by the retry's repeated registration; the initiator ends the
// connection instead (the key's state is unknown, and the pool replaces
// it), and every I/O completes on the next one.
func TestRetryLeavesNoKeyHostile(t *testing.T) {
	for _, mech := range mechanisms {
		t.Run(mech.String(), func(t *testing.T) {
			var invalidated atomic.Int64
			var armed atomic.Bool
			r := newHostileRig(t, "rxe", targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
				if ds := rsp.Descriptors; !rsp.Login && rsp.Key == 0 && rsp.Fresh && armed.CompareAndSwap(true, false) {
					rsp.WR.Opcode, rsp.WR.InvalidateKey = transport.OpSendWithInv, ds[len(ds)-1].RKey
					invalidated.Add(1)
				}
				return targettest.Pass
			}})
			s, v := r.dial(t, initiator.Config{Mechanism: mech, Credits: 8, ImmediateData: -1, LossTimeout: 30 * time.Second})
			retryRounds(t, r.tp, r.ip, v, 6, func() { armed.Store(true) })
			c := r.ip.Counters()
			t.Logf("target invalidated %d keys unasked; initiator NIC: %d retries, %d local operations repeated; connections lost %d",
				invalidated.Load(), c.Retries, c.RepeatedLocalOps, s.Stats().ConnectionsLost)
			if invalidated.Load() == 0 || s.Stats().ConnectionsLost == 0 {
				t.Fatal("the target never invalidated a key unasked, or the initiator took it: the test tested nothing")
			}
		})
	}
}

// retryRounds runs rounds of two to four reads and writes of 16 KiB at
// once on v, each with the target NIC (tp) withholding the ACKs of that
// many requests, and checks after each round that the data reads back and
// that the initiator's NIC (ip) holds no valid key. before, if not nil,
// runs at the start of each round.
func retryRounds(t *testing.T, tp, ip *emu.Provider, v *initiator.Volume, rounds int, before func()) {
	t.Helper()
	const size = 16384
	model := make([]byte, 64*size)
	done := make(chan *initiator.Request, 4)
	for round := range rounds {
		depth := 2 + round%3
		if before != nil {
			before()
		}
		for _, q := range tp.QPs() {
			if err := tp.InjectWithholdAcks(q, depth); err != nil {
				t.Fatal(err)
			}
		}
		reqs := make([]*initiator.Request, depth)
		for i := range reqs {
			off := int64((round*4+i)%64) * size
			req := &initiator.Request{Op: initiator.OpRead, Buf: make([]byte, size), Offset: off, Done: done}
			if (round+i)%2 == 0 {
				req.Op = initiator.OpWrite
				for j := range req.Buf {
					req.Buf[j] = byte(round*7 + i + j)
				}
			}
			reqs[i] = req
			if err := v.Submit(req); err != nil {
				t.Fatal(err)
			}
		}
		for range depth {
			req := <-done
			if req.Err != nil {
				t.Fatalf("round %d: %v at %d: %v", round, req.Op, req.Offset, req.Err)
			}
		}
		for _, req := range reqs {
			if req.Op == initiator.OpWrite {
				copy(model[req.Offset:], req.Buf)
			} else if !bytes.Equal(req.Buf, model[req.Offset:req.Offset+size]) {
				t.Fatalf("round %d: read at %d differs from what was written", round, req.Offset)
			}
		}
		if valid := validKeys(ip); len(valid) > 0 {
			t.Fatalf("round %d: every I/O has returned, yet the initiator's device holds %v valid", round, valid)
		}
	}
}

// validKeys lists the fast-registration MRs and windows of p's device that
// are VALID with some remote access, with their keys. The registration
// fence's barrier (frmr.Config.FenceRegistrations) is VALID with none: its
// key grants nothing.
func validKeys(p *emu.Provider) []string {
	var out []string
	for _, kind := range []string{"frmr", "mw"} {
		for _, idx := range p.MemObjects(kind) {
			const remote = transport.AccessRemoteRead | transport.AccessRemoteWrite | transport.AccessRemoteAtomic
			if info, ok := p.MRInfo(idx); ok && info.State == "VALID" && info.Access&remote != 0 {
				out = append(out, fmt.Sprintf("%s %s", kind, info.Key))
			}
		}
	}
	return out
}
