package emu

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// pair is a connected QP pair on one or two NICs, with one arena and MR per
// side, used by this package's own tests and benchmarks.
type pair struct {
	pa, pb   *Provider
	cqa, cqb transport.CQ
	qa, qb   transport.QP
	ca, cb   transport.Conn
	aa, ab   *transport.Arena
	mra, mrb transport.MR
	pda, pdb transport.PD
	wcs      []transport.WC
}

func newPair(tb testing.TB, cfg Config, size int) *pair {
	tb.Helper()
	pa, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	pb := pa
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := &pair{pa: pa, pb: pb, wcs: make([]transport.WC, 64)}
	var arenas []*transport.Arena
	tb.Cleanup(func() {
		// The NIC may address the arenas until it is closed.
		pa.Close()
		for _, a := range arenas {
			a.Close()
		}
	})
	mk := func(p *Provider) (transport.PD, transport.CQ, transport.QP, *transport.Arena, transport.MR) {
		d, _ := p.OpenDevice("")
		pd, err := d.AllocPD()
		if err != nil {
			tb.Fatal(err)
		}
		cq, err := d.CreateCQ(4096)
		if err != nil {
			tb.Fatal(err)
		}
		q, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInline: 64})
		if err != nil {
			tb.Fatal(err)
		}
		a, err := transport.NewArena(size, transport.ArenaOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		arenas = append(arenas, a)
		m, err := pd.RegMR(a, 0, a.Len(), transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead|transport.AccessMWBind)
		if err != nil {
			tb.Fatal(err)
		}
		return pd, cq, q, a, m
	}
	x.pda, x.cqa, x.qa, x.aa, x.mra = mk(pa)
	x.pdb, x.cqb, x.qb, x.ab, x.mrb = mk(pb)
	l, err := pb.Listen(ctx, "")
	if err != nil {
		tb.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		x.cb, err = r.Accept(ctx, x.qb, []byte("rep"))
		errc <- err
	}()
	ep, err := pa.Resolve(ctx, l.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	x.ca, err = ep.Connect(ctx, x.qa, []byte("req"))
	if err != nil {
		tb.Fatal(err)
	}
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
	return x
}

func (x *pair) wait(tb testing.TB, c transport.CQ) transport.WC {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		n, err := c.Poll(x.wcs[:1])
		if err != nil {
			tb.Fatal(err)
		}
		if n == 1 {
			return x.wcs[0]
		}
		if err := c.Wait(ctx); err != nil {
			tb.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func TestSmoke(t *testing.T) {
	for _, wire := range Wires() {
		t.Run(wire, func(t *testing.T) {
			x := newPair(t, Config{Wire: wire}, 1<<20)
			copy(x.aa.Bytes(), "hello, target")
			// SEND/RECV
			if _, err := x.qb.PostRecv([]transport.RecvWR{{ID: 7, SGL: []transport.SGE{{Addr: x.mrb.Addr(), Length: 4096, LKey: x.mrb.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := x.qa.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: x.mra.Addr(), Length: 13, LKey: x.mra.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			wa, wb := x.wait(t, x.cqa), x.wait(t, x.cqb)
			if wa.ID == 7 {
				wa, wb = wb, wa
			}
			if wa.Status != 0 || wb.Status != 0 || wb.ByteLen != 13 || !bytes.Equal(x.ab.Bytes()[:13], []byte("hello, target")) {
				t.Fatalf("send %v recv %v", &wa, &wb)
			}
			// RDMA WRITE then READ back
			copy(x.aa.Bytes()[8192:], bytes.Repeat([]byte{0xab}, 4096))
			x.qa.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: x.mra.Addr() + 8192, Length: 4096, LKey: x.mra.LKey()}}, RemoteAddr: x.mrb.Addr() + 4096, RKey: x.mrb.RKey()}})
			if wc := x.wait(t, x.cqa); wc.Status != 0 || !bytes.Equal(x.ab.Bytes()[4096:8192], x.aa.Bytes()[8192:12288]) {
				t.Fatalf("write %v", &wc)
			}
			x.qa.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: x.mra.Addr() + 65536, Length: 4096, LKey: x.mra.LKey()}}, RemoteAddr: x.mrb.Addr() + 4096, RKey: x.mrb.RKey()}})
			if wc := x.wait(t, x.cqa); wc.Status != 0 || !bytes.Equal(x.aa.Bytes()[65536:65536+4096], x.ab.Bytes()[4096:8192]) {
				t.Fatalf("read %v", &wc)
			}
			// FRMR: register B's memory, A writes through it, B invalidates, A's write fails.
			f, err := x.pdb.AllocFastRegMR(4)
			if err != nil {
				t.Fatal(err)
			}
			key := f.Key().Bump()
			if err := f.Map(x.ab, 100, 5000, 0x7000_0000_0000_0064); err != nil {
				t.Fatal(err)
			}
			x.qb.PostSend([]transport.SendWR{{ID: 4, Opcode: transport.OpRegMR, Flags: transport.FlagSignaled,
				Reg: transport.RegWR{MR: f, Key: key, Access: transport.AccessLocalWrite | transport.AccessRemoteWrite}}})
			if wc := x.wait(t, x.cqb); wc.Status != 0 {
				t.Fatalf("reg %v", &wc)
			}
			x.qa.PostSend([]transport.SendWR{{ID: 5, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: x.mra.Addr(), Length: 16, LKey: x.mra.LKey()}}, RemoteAddr: 0x7000_0000_0000_0064, RKey: key}})
			if wc := x.wait(t, x.cqa); wc.Status != 0 || !bytes.Equal(x.ab.Bytes()[100:116], x.aa.Bytes()[:16]) {
				t.Fatalf("write via frmr %v", &wc)
			}
			x.qb.PostSend([]transport.SendWR{{ID: 6, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key}})
			if wc := x.wait(t, x.cqb); wc.Status != 0 {
				t.Fatalf("linv %v", &wc)
			}
			before := append([]byte(nil), x.ab.Bytes()[100:116]...)
			copy(x.aa.Bytes(), "XXXXXXXXXXXXXXXX")
			x.qa.PostSend([]transport.SendWR{{ID: 8, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: x.mra.Addr(), Length: 16, LKey: x.mra.LKey()}}, RemoteAddr: 0x7000_0000_0000_0064, RKey: key}})
			if wc := x.wait(t, x.cqa); wc.Status != transport.StatusRemAccessErr || !bytes.Equal(before, x.ab.Bytes()[100:116]) {
				t.Fatalf("stale write %v", &wc)
			}
			if x.qa.State() != transport.QPErr {
				t.Fatalf("requester state %s", x.qa.State())
			}
		})
	}
}
