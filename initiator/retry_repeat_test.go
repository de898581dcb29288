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
// registrations queued behind the request retried (the emulator's rxe
// profile: transport.Quirks.RetryRepeatsLocalOps, as rxe's req_retry
// does), the target's NIC withholds the ACKs of the commands of the I/Os
// in flight while the target serves them. The initiator's requester times
// out and retries, and the registration of every I/O but the first
// executes again after the target has answered it. No key may be valid
// once the I/Os have returned: with the session idle, every
// fast-registration MR and window of the initiator's device is FREE, and
// the data reads back. A target that invalidated the key remotely would
// have it registered again by the retry, valid over memory the caller has
// back (the initiator once asked for that on rxe); the initiator on such a
// device invalidates its keys itself, with a LOCAL_INV the retry repeats
// after the registration, or, fenced, never rewinds over. Nothing a
// repeat does may be what oopses rxe (emu's Counters.KernelOopses). In
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
	if c.RepeatedLocalOps == 0 {
		t.Fatal("no retry repeated a registration: the test tested nothing")
	}
	if c.KernelOopses != 0 {
		t.Fatalf("%d repeated operations would have oopsed rxe", c.KernelOopses)
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
// are VALID, with their keys.
func validKeys(p *emu.Provider) []string {
	var out []string
	for _, kind := range []string{"frmr", "mw"} {
		for _, idx := range p.MemObjects(kind) {
			if info, ok := p.MRInfo(idx); ok && info.State == "VALID" {
				out = append(out, fmt.Sprintf("%s %s", kind, info.Key))
			}
		}
	}
	return out
}
