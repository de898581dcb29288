package transporttest

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Order/Randomized", testRandomized)
}

type rop struct {
	id       uint64
	kind     transport.Opcode
	n        int
	loc      int // offset in B's memory (source or READ sink)
	remote   int // offset in A's memory (WRITE target, READ source)
	imm      uint32
	signaled bool
	expect   []byte // READ: the bytes it must return
}

// A seeded random mix of SEND, SEND_WITH_IMM, RDMA_WRITE,
// RDMA_WRITE_WITH_IMM and RDMA_READ from B to A with random sizes, SGE
// splits, signaling and chain lengths. Every byte and every completion is
// checked against a model that follows RC ordering: one send queue executes
// in posting order, so a READ sees every earlier WRITE.
func testRandomized(t *testing.T, p transport.Provider) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	const (
		sendWR   = 64
		recvWR   = 64
		memSize  = 1 << 20
		maxOp    = 8192
		ops      = 400
		recvSize = maxOp
	)
	pr := connectPair(t, p, pairConfig{sendWR: sendWR, recvWR: recvWR})
	a, b := pr.a, pr.b
	maxSGE := min(4, max(b.attr.MaxSGE, 1))

	amem := newBuf(t, p, a.pd, memSize, accRW)
	bmem := newBuf(t, p, b.pd, memSize, transport.AccessLocalWrite)
	arecv := newBuf(t, p, a.pd, recvWR*recvSize, transport.AccessLocalWrite)
	fill(amem.a.Bytes(), uint32(seed))
	model := append([]byte(nil), amem.a.Bytes()...)

	// Receives: slot i of arecv, reposted after each completion.
	recvSeq := uint64(0) // ID of the next receive to post; slot = ID % recvWR
	for range recvWR {
		postRecv(t, a.qp, recvWR_(recvSeq, arecv))
		recvSeq++
	}
	nextRecv := uint64(0) // ID of the receive the next message consumes
	var recvExpect []rop  // messages that consume a receive, in order
	var pending []rop     // posted send WRs not yet known complete, in order
	bNext := 0            // bump allocator over B's memory

	checkRecv := func(wc transport.WC) {
		t.Helper()
		if len(recvExpect) == 0 {
			t.Fatalf("unexpected receive completion %s", wc.String())
		}
		o := recvExpect[0]
		recvExpect = recvExpect[1:]
		wantOp := transport.WCRecv
		if o.kind == transport.OpRDMAWriteWithImm {
			wantOp = transport.WCRecvRDMAWithImm
		}
		if !checkOK(t, wc, nextRecv, a.qp, wantOp) {
			t.Fatalf("receive for op %d (%v, %d bytes) failed", o.id, o.kind, o.n)
		}
		if wc.ByteLen != uint32(o.n) {
			t.Errorf("op %d (%v): byte_len %d, want %d", o.id, o.kind, wc.ByteLen, o.n)
		}
		hasImm := o.kind == transport.OpSendWithImm || o.kind == transport.OpRDMAWriteWithImm
		if hasImm != (wc.Flags&transport.WCWithImm != 0) || (hasImm && wc.Imm != o.imm) {
			t.Errorf("op %d (%v): flags %v imm %#x, want imm %v %#x", o.id, o.kind, wc.Flags, wc.Imm, hasImm, o.imm)
		}
		slot := int(nextRecv % recvWR)
		if o.kind == transport.OpSend || o.kind == transport.OpSendWithImm {
			checkBytes(t, fmt.Sprintf("op %d (%v of %d bytes) payload", o.id, o.kind, o.n), arecv.bytes(slot*recvSize, o.n), bmem.bytes(o.loc, o.n))
		}
		if t.Failed() {
			t.FailNow()
		}
		nextRecv++
		postRecv(t, a.qp, recvWR_(recvSeq, arecv))
		recvSeq++
	}
	pollRecvs := func(block bool) {
		t.Helper()
		var wcs [16]transport.WC
		n, err := a.rcq.Poll(wcs[:])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, wc := range wcs[:n] {
			checkRecv(wc)
		}
		if n > 0 || !block {
			return
		}
		for _, wc := range waitWC(t, a.rcq, 1, Timeout) {
			checkRecv(wc)
		}
	}
	// complete retires pending WRs up to and including the one wc names.
	complete := func(wc transport.WC) {
		t.Helper()
		for len(pending) > 0 {
			o := pending[0]
			if !o.signaled && o.id != wc.ID {
				pending = pending[1:] // completed silently before a later signaled WR
				if o.kind == transport.OpRDMARead {
					checkBytes(t, fmt.Sprintf("op %d (unsignaled READ of %d bytes at A+%d)", o.id, o.n, o.remote), bmem.bytes(o.loc, o.n), o.expect)
				}
				continue
			}
			if o.id != wc.ID {
				t.Fatalf("completion %s out of order: the next signaled WR is %d", wc.String(), o.id)
			}
			want := map[transport.Opcode]transport.WCOpcode{
				transport.OpSend: transport.WCSend, transport.OpSendWithImm: transport.WCSend,
				transport.OpRDMAWrite: transport.WCRDMAWrite, transport.OpRDMAWriteWithImm: transport.WCRDMAWrite,
				transport.OpRDMARead: transport.WCRDMARead,
			}[o.kind]
			if !checkOK(t, wc, o.id, b.qp, want) {
				t.Fatalf("op %d (%v, %d bytes) failed", o.id, o.kind, o.n)
			}
			if o.kind == transport.OpRDMARead {
				checkBytes(t, fmt.Sprintf("op %d (READ of %d bytes at A+%d)", o.id, o.n, o.remote), bmem.bytes(o.loc, o.n), o.expect)
			}
			pending = pending[1:]
			if t.Failed() {
				t.FailNow()
			}
			return
		}
		t.Fatalf("completion %s for no pending WR", wc.String())
	}
	waitSend := func() {
		t.Helper()
		for _, wc := range waitWC(t, b.scq, 1, Timeout) {
			complete(wc)
		}
		pollRecvs(false)
	}
	drain := func() {
		t.Helper()
		for len(pending) > 0 {
			waitSend()
		}
	}

	randSize := func() int {
		switch rng.IntN(4) {
		case 0:
			return 1 + rng.IntN(16)
		case 1:
			return 1 + rng.IntN(256)
		default:
			return 1 + rng.IntN(maxOp)
		}
	}
	kinds := []transport.Opcode{transport.OpSend, transport.OpSendWithImm, transport.OpRDMAWrite, transport.OpRDMAWriteWithImm, transport.OpRDMARead}
	counts := map[transport.Opcode]int{}
	var id uint64
	for id < ops {
		batch := 1 + rng.IntN(6)
		if len(pending)+batch > sendWR {
			waitSend()
			continue
		}
		var wrs []transport.SendWR
		for i := range batch {
			o := rop{id: id, kind: kinds[rng.IntN(len(kinds))], n: randSize(), imm: rng.Uint32()}
			o.signaled = i == batch-1 || rng.IntN(3) == 0
			consumesRecv := o.kind != transport.OpRDMAWrite && o.kind != transport.OpRDMARead
			if consumesRecv && uint64(len(recvExpect))+1 > recvSeq-nextRecv {
				break // no free receive: post what we have
			}
			if bNext+o.n > memSize {
				break
			}
			o.loc = bNext
			bNext += (o.n + 63) &^ 63
			o.remote = rng.IntN(memSize - o.n + 1)
			// Split the local side into 1..maxSGE SGEs.
			var sgl []transport.SGE
			pieces := 1 + rng.IntN(maxSGE)
			off, left := o.loc, o.n
			for j := range pieces {
				k := left
				if j < pieces-1 && left > 1 {
					k = 1 + rng.IntN(left-1)
				}
				if k == 0 {
					break
				}
				sgl = append(sgl, bmem.sge(off, k))
				off += k
				left -= k
			}
			wr := transport.SendWR{ID: o.id, Opcode: o.kind, SGL: sgl, Imm: o.imm}
			if o.signaled {
				wr.Flags = transport.FlagSignaled
			}
			switch o.kind {
			case transport.OpRDMARead:
				clear(bmem.bytes(o.loc, o.n))
				o.expect = append([]byte(nil), model[o.remote:o.remote+o.n]...)
				wr.RemoteAddr, wr.RKey = amem.addr(o.remote), amem.mr.RKey()
			case transport.OpRDMAWrite, transport.OpRDMAWriteWithImm:
				fill(bmem.bytes(o.loc, o.n), uint32(o.id)+uint32(seed))
				copy(model[o.remote:], bmem.bytes(o.loc, o.n))
				wr.RemoteAddr, wr.RKey = amem.addr(o.remote), amem.mr.RKey()
			default:
				fill(bmem.bytes(o.loc, o.n), uint32(o.id)+uint32(seed))
			}
			if consumesRecv {
				recvExpect = append(recvExpect, o)
			}
			counts[o.kind]++
			pending = append(pending, o)
			wrs = append(wrs, wr)
			id++
		}
		if len(wrs) == 0 {
			// Out of B memory or receives: let everything finish.
			drain()
			for len(recvExpect) > 0 {
				pollRecvs(true)
			}
			bNext = 0
			continue
		}
		if wrs[len(wrs)-1].Flags&transport.FlagSignaled == 0 {
			// The chain was cut short: its last WR must be signaled so that
			// the slots of the others are reclaimed.
			wrs[len(wrs)-1].Flags |= transport.FlagSignaled
			pending[len(pending)-1].signaled = true
		}
		postSend(t, b.qp, wrs...)
		pollRecvs(false)
	}
	drain()
	for len(recvExpect) > 0 {
		pollRecvs(true)
	}
	checkBytes(t, "A's memory after all WRITEs", amem.a.Bytes(), model)
	expectNoWC(t, b.scq, "after the last completion")
	expectNoWC(t, a.rcq, "after the last receive")
	t.Logf("%d ops: %v", ops, counts)
}

func recvWR_(id uint64, arecv buf) transport.RecvWR {
	const recvSize = 8192
	slot := int(id % 64)
	return recvWR(id, arecv.sge(slot*recvSize, recvSize))
}
