package emu

import (
	"bytes"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestCumulativeACK runs a deep chain of SENDs, WRITEs and READs over the
// wires whose responders coalesce ACKs, some WRs unsignaled, with a retry
// timeout far beyond the test's wait: every WR must complete from the
// coalesced ACKs alone, in order, with nothing sent twice.
func TestCumulativeACK(t *testing.T) {
	for _, wire := range []string{WireTCP, WireShm} {
		t.Run(wire, func(t *testing.T) { testCumulativeACK(t, wire) })
	}
}

func testCumulativeACK(t *testing.T, wire string) {
	const n, bs = 120, 512
	x := newPair(t, Config{Wire: wire, RetryTimeout: time.Minute}, 2*n*bs)
	for i := range n * bs {
		x.aa.Bytes()[i] = byte(i*7 + 1)
		x.ab.Bytes()[n*bs+i] = byte(i*13 + 2)
	}
	var recvs []transport.RecvWR
	var wrs []transport.SendWR
	signaled := 0
	for i := range n {
		src := transport.SGE{Addr: x.mra.Addr() + uint64(i*bs), Length: bs, LKey: x.mra.LKey()}
		wr := transport.SendWR{ID: uint64(i), SGL: []transport.SGE{src}}
		switch i % 3 {
		case 0:
			wr.Opcode = transport.OpSend
			recvs = append(recvs, transport.RecvWR{ID: uint64(i), SGL: []transport.SGE{{Addr: x.mrb.Addr() + uint64(i*bs), Length: bs, LKey: x.mrb.LKey()}}})
		case 1:
			wr.Opcode, wr.RemoteAddr, wr.RKey = transport.OpRDMAWrite, x.mrb.Addr()+uint64(i*bs), x.mrb.RKey()
		case 2:
			// READ the peer's second half into this block.
			wr.SGL[0].Addr = x.mra.Addr() + uint64(n*bs+i*bs)
			wr.Opcode, wr.RemoteAddr, wr.RKey = transport.OpRDMARead, x.mrb.Addr()+uint64(n*bs+i*bs), x.mrb.RKey()
		}
		if i%4 != 1 || i == n-1 {
			wr.Flags = transport.FlagSignaled
			signaled++
		}
		wrs = append(wrs, wr)
	}
	if _, err := x.qb.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	if _, err := x.qa.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	last := -1
	for range signaled {
		wc := x.wait(t, x.cqa)
		if wc.Status != transport.StatusSuccess || int(wc.ID) <= last {
			t.Fatalf("completion %s after WR %d", wc.String(), last)
		}
		last = int(wc.ID)
	}
	if last != n-1 {
		t.Fatalf("last completion for WR %d, want %d", last, n-1)
	}
	for i := range n {
		a, b := x.aa.Bytes()[i*bs:(i+1)*bs], x.ab.Bytes()[i*bs:(i+1)*bs]
		if i%3 == 2 {
			a, b = x.aa.Bytes()[n*bs+i*bs:][:bs], x.ab.Bytes()[n*bs+i*bs:][:bs]
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("WR %d (%s): data differs", i, wrs[i].Opcode)
		}
	}
	if d := x.pa.Counters().Duplicates; d != 0 {
		t.Fatalf("%d requests were sent again", d)
	}
}
