package frmr

import (
	"context"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// cycle runs register → (remote or local) invalidate on the loop wire
// with preallocated work requests.
type cycle struct {
	r      *rig
	chain  []transport.SendWR
	one    []transport.SendWR
	tresp  []transport.SendWR
	recv   []transport.RecvWR
	trecv  []transport.RecvWR
	wcs    []transport.WC
	isge   []transport.SGE
	tsge   []transport.SGE
	remote bool
	reqID  uint64
	// live, if set, sees each registration while the peer holds it: the
	// target has the command, the response is not sent yet.
	live func(Reg)
}

func newCycle(tb testing.TB, remote bool) *cycle {
	return newCycleOn(newRig(tb, "strict", FRMR, 77, true), remote)
}

func newCycleOn(r *rig, remote bool) *cycle {
	c := &cycle{r: r, remote: remote, chain: make([]transport.SendWR, 2), one: make([]transport.SendWR, 1),
		tresp: make([]transport.SendWR, 1), wcs: make([]transport.WC, 16)}
	c.isge = []transport.SGE{{Addr: r.iuAddr(&r.ini, rqDepth), Length: 32, LKey: r.ini.mr.LKey()}}
	c.tsge = []transport.SGE{{Addr: r.iuAddr(&r.tgt, rqDepth), Length: 32, LKey: r.tgt.mr.LKey()}}
	c.recv = []transport.RecvWR{{ID: recvBit, SGL: []transport.SGE{{Addr: r.iuAddr(&r.ini, 0), Length: iuSize, LKey: r.ini.mr.LKey()}}}}
	c.trecv = []transport.RecvWR{{ID: recvBit, SGL: []transport.SGE{{Addr: r.iuAddr(&r.tgt, 0), Length: iuSize, LKey: r.tgt.mr.LKey()}}}}
	return c
}

func (c *cycle) pollUntil(cq transport.CQ, f func(wc *transport.WC) bool) {
	ctx := context.Background()
	for {
		n, _ := cq.Poll(c.wcs)
		for i := 0; i < n; i++ {
			if f(&c.wcs[i]) {
				return
			}
		}
		if n == 0 {
			cq.Wait(ctx)
		}
	}
}

func (c *cycle) run(tb testing.TB) Reg {
	r := c.r
	p := r.pool
	c.reqID++
	reg, err := p.Get(Segment{Arena: r.ini.arena, Off: 100, Len: 8192}, PeerWrites)
	if err != nil {
		tb.Fatal(err)
	}
	c.chain[0] = reg.WR()
	c.chain[1] = transport.SendWR{ID: sendBit, Opcode: transport.OpSend,
		SGL: c.isge}
	if err := p.Admit(c.chain); err != nil {
		tb.Fatal(err)
	}
	n, err := r.ini.qp.PostSend(c.chain)
	p.Posted(c.chain, n)
	if err != nil {
		tb.Fatal(err)
	}
	// Target: receive the command, answer.
	c.pollUntil(r.tgt.cq, func(wc *transport.WC) bool { return wc.ID>>56 == 1 })
	if c.live != nil {
		c.live(reg)
	}
	r.tgt.qp.PostRecv(c.trecv)
	// Signaled: the target's send queue is sqDepth deep too, and an
	// unsignaled WR holds its slot until a later signaled one completes
	// (docs/verbs.md#completions); pollUntil consumes the completions.
	c.tresp[0] = transport.SendWR{ID: sendBit, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: c.tsge}
	if c.remote {
		c.tresp[0].Opcode = transport.OpSendWithInv
		c.tresp[0].InvalidateKey = reg.RKey()
	}
	if _, err := r.tgt.qp.PostSend(c.tresp); err != nil {
		tb.Fatal(err)
	}
	// Initiator: send completion and response.
	gotResp := false
	c.pollUntil(r.ini.cq, func(wc *transport.WC) bool {
		if wc.ID>>56 == 1 {
			if wc.Status != transport.StatusSuccess {
				tb.Fatalf("recv %v", wc)
			}
			gotResp = true
			if wc.Flags&transport.WCWithInv != 0 {
				if err := p.OnRemoteInvalidate(reg, wc.InvalidatedKey); err != nil {
					tb.Fatal(err)
				}
			} else {
				c.one[0], _ = p.Invalidate(reg)
				p.Admit(c.one)
				n, err := r.ini.qp.PostSend(c.one)
				p.Posted(c.one, n)
				if err != nil {
					tb.Fatal(err)
				}
			}
		} else if !p.OnSendCompletion(wc) || wc.Status != transport.StatusSuccess {
			tb.Fatalf("send %v", wc)
		}
		return gotResp && p.Done(reg)
	})
	r.ini.qp.PostRecv(c.recv)
	return reg
}

func benchCycle(b *testing.B, remote bool) {
	c := newCycle(b, remote)
	c.run(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.run(b)
	}
}

// BenchmarkRemoteInvalidateCycle: Get → REG+SEND → target SEND_WITH_INV →
// FREE, on the loop wire.
func BenchmarkRemoteInvalidateCycle(b *testing.B) { benchCycle(b, true) }

// BenchmarkLocalInvalidateCycle: Get → REG+SEND → target SEND → signaled
// LOCAL_INV → FREE, on the loop wire.
func BenchmarkLocalInvalidateCycle(b *testing.B) { benchCycle(b, false) }

// TestZeroAllocs asserts the steady-state cycle allocates nothing: the
// pool alone (Get/Admit/Posted/OnSendCompletion/OnRemoteInvalidate/
// Invalidate/Done), and the whole cycle over the loop wire.
func TestZeroAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instruments allocations")
	}
	for _, remote := range []bool{true, false} {
		c := newCycle(t, remote)
		c.run(t)
		if a := testing.AllocsPerRun(200, func() { c.run(t) }); a != 0 {
			t.Errorf("remote=%v: %.1f allocs per cycle over the loop wire", remote, a)
		}
	}
}
