package transporttest

import (
	"context"
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Arena/Shared", testArenaShared)
	register("QP/SQDrainedEvent", testSQDrained)
	register("QP/PostArgs", testPostArgs)
	register("QP/PostAfterClose", testPostAfterClose)
	register("CQ/CloseWakesWait", testCQCloseWakesWait)
	register("Event/RemoteInvalidateErr", testRemoteInvalidateEvent)
	register("Send/InlineTooLong", testInlineTooLong)
	register("FastReg/MW/CrossQPInvalidate", testMWCrossQPInvalidate)
	register("FastReg/MW/BoundToQP", testMWBoundToQP)
}

func testArenaShared(t *testing.T, p transport.Provider) {
	a, err := transport.NewArena(transport.PageSize, transport.ArenaOptions{Shared: true, Name: "transporttest"})
	if err != nil {
		t.Skipf("shared arenas unavailable here: %v", err)
	}
	if a.FD() < 0 {
		t.Errorf("shared arena FD = %d", a.FD())
	}
	a.Bytes()[0] = 1
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if a.FD() != -1 {
		t.Errorf("FD after Close = %d, want -1", a.FD())
	}
}

// RTS -> SQD raises SQ_DRAINED once the WRs already in progress are done
// (event.go); WRs not yet started stay queued and run after SQD -> RTS. The
// completions before and after are one in-order sequence.
func testSQDrained(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	target := newBuf(t, p, b.pd, 8*512, accRW)
	src := newBuf(t, p, a.pd, 8*512, 0)
	fill(src.a.Bytes(), 81)
	postSend(t, a.qp, writes(6, src, target)...)
	if err := a.qp.Modify(transport.QPSQD); err != nil {
		t.Skipf("Modify(SQD): %v", err)
	}
	if _, ok := waitEvent(t, a.dev, Timeout, func(ev transport.AsyncEvent) bool {
		return ev.Type == transport.EventSQDrained && ev.QPNum == a.qp.Num()
	}); !ok {
		t.Fatalf("no SQ_DRAINED event for QP %d", a.qp.Num())
	}
	if st := a.qp.State(); st != transport.QPSQD {
		t.Errorf("QP in %v, want SQD", st)
	}
	var buf [8]transport.WC
	n, err := a.scq.Poll(buf[:])
	if err != nil {
		t.Fatal(err)
	}
	done := append([]transport.WC(nil), buf[:n]...)
	t.Logf("%d of 6 WRs had completed when the send queue drained", n)
	if err := a.qp.Modify(transport.QPRTS); err != nil {
		t.Fatalf("Modify(SQD -> RTS): %v", err)
	}
	done = append(done, waitWC(t, a.scq, 6-n, Timeout)...)
	for i, wc := range done {
		if checkOK(t, wc, uint64(i), a.qp, transport.WCRDMAWrite) {
			checkBytes(t, "WRITE data", target.bytes(i*512, 512), src.bytes(i*512, 512))
		}
	}
}

// Malformed posts fail at once with ErrInvalidArgument and n at the bad WR
// (ibv_post_send's bad_wr): too many SGEs, an unknown opcode.
func testPostArgs(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a := pr.a
	b := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	maxSGE := min(4, max(a.attr.MaxSGE, 1)) // what connectPair configured
	many := make([]transport.SGE, maxSGE+1)
	for i := range many {
		many[i] = b.sge(i*8, 8)
	}
	good := transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, SGL: []transport.SGE{b.sge(0, 8)}, RemoteAddr: b.addr(0), RKey: 0}
	cases := []struct {
		name string
		wr   transport.SendWR
	}{
		{"too many SGEs", transport.SendWR{ID: 2, Opcode: transport.OpSend, SGL: many}},
		{"unknown opcode", transport.SendWR{ID: 3, Opcode: transport.Opcode(200)}},
	}
	if err := a.qp.Modify(transport.QPSQD); err != nil {
		t.Skipf("Modify(SQD): %v (needed to keep the good WR from executing)", err)
	}
	for _, c := range cases {
		n, err := a.qp.PostSend([]transport.SendWR{good, c.wr})
		if n != 1 || !errors.Is(err, transport.ErrInvalidArgument) {
			t.Errorf("PostSend [good, %s]: n=%d err=%v, want 1 and ErrInvalidArgument", c.name, n, err)
		}
	}
	n, err := a.qp.PostRecv([]transport.RecvWR{recvWR(4, b.sge(0, 8)), recvWR(5, many...)})
	if n != 1 || !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("PostRecv [good, too many SGEs]: n=%d err=%v, want 1 and ErrInvalidArgument", n, err)
	}
}

func testPostAfterClose(t *testing.T, p transport.Provider) {
	_, pd, _, qp := unconnected(t, p, 4)
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	if err := qp.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n, err := qp.PostSend([]transport.SendWR{sendWR(1, b.sge(0, 8))}); n != 0 || !errors.Is(err, transport.ErrClosed) {
		t.Errorf("PostSend on a closed QP: n=%d err=%v, want 0 and ErrClosed", n, err)
	}
	if n, err := qp.PostRecv([]transport.RecvWR{recvWR(2, b.sge(0, 8))}); n != 0 || !errors.Is(err, transport.ErrClosed) {
		t.Errorf("PostRecv on a closed QP: n=%d err=%v, want 0 and ErrClosed", n, err)
	}
}

// Closing a CQ wakes a goroutine blocked in Wait (cq.go).
func testCQCloseWakesWait(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	cq, err := dev.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	if cq.Depth() < 8 {
		t.Errorf("CreateCQ(8).Depth() = %d", cq.Depth())
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		done <- cq.Wait(ctx)
	}()
	<-started
	if err := cq.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	err = <-done
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on a CQ closed under it returned %v, want an error before the deadline (ErrClosed)", err)
	}
	if _, err := cq.Poll(make([]transport.WC, 1)); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Poll of a closed CQ: %v, want ErrClosed", err)
	}
}

// A bad SEND_WITH_INV is an invalid request (Class J): the receiver gets
// QP_REQ_ERR (event.go, frmr-semantics §2.3, §4.4) and goes to ERR. Under
// Quirks.NoQPErrorEvents (rxe) it goes to ERR without the event.
func testRemoteInvalidateEvent(t *testing.T, p transport.Provider) {
	needCaps(t, deviceAttr(t, p), transport.CapSendWithInv)
	pr := connectPair(t, p, pairConfig{})
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, accRW)
	src := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 64)))
	pr.b.do(t, transport.SendWR{ID: 2, Opcode: transport.OpSendWithInv, InvalidateKey: rb.mr.RKey(), SGL: []transport.SGE{src.sge(0, 8)}})
	checkWC(t, waitWC(t, pr.a.rcq, 1, Timeout)[0], 1, pr.a.qp, transport.StatusRemInvReqErr)
	match := func(ev transport.AsyncEvent) bool {
		return ev.QPNum == pr.a.qp.Num() && ev.Type == transport.EventQPReqErr
	}
	if pr.a.attr.Quirks.NoQPErrorEvents {
		expectNoEvent(t, pr.a.dev, "QP_REQ_ERR for the receiver (Quirks.NoQPErrorEvents is set)", match)
	} else if _, ok := waitEvent(t, pr.a.dev, Timeout, match); !ok {
		t.Errorf("no QP_REQ_ERR event for the receiver QP %d", pr.a.qp.Num())
	}
	if st := pr.a.qp.State(); st != transport.QPErr {
		t.Errorf("receiver QP after REM_INV_REQ_ERR in %v, want ERR", st)
	}
}

// Inline data beyond the QP's MaxInline is refused at post time.
func testInlineTooLong(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	max := min(64, pr.b.attr.MaxInline)
	if max <= 0 {
		t.Skip("device has no inline data")
	}
	src := newArena(t, p, transport.PageSize)
	n, err := pr.b.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagInline | transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: src.Addr(), Length: uint32(max + 1)}}}})
	if n != 0 || err == nil {
		t.Errorf("inline SEND of %d bytes on a QP with MaxInline %d: n=%d err=%v, want 0 and an error", max+1, max, n, err)
	} else if !errors.Is(err, transport.ErrInvalidArgument) {
		t.Logf("note: refused with %v (not ErrInvalidArgument)", err)
	}
}

// A type-2 window bound on one QP cannot be invalidated by LOCAL_INV on
// another QP of the same PD (rdma-unit-test mw_test: cross-QP invalidate
// -> MW_BIND_ERR; frmr-semantics §1).
func testMWCrossQPInvalidate(t *testing.T, p transport.Provider) {
	x := newFRFixture(t, p, mechanisms[1])
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	pr2 := connectPair(t, p, pairConfig{pdA: x.a.pd})
	wc := pr2.a.do(t, localInvWR(2, k, 0))
	checkWC(t, wc, 2, pr2.a.qp, x.localErr()...)
	// Still bound on the first QP.
	x.writeOK(t, 3, k, x.f.addr(0), 0, 64, 80)
}

// A type-2 window is associated with the QP that bound it: remote access
// through another QP of the same PD fails (IBA type-2 windows; rxe
// rxe_lookup_mw checks mw->qp).
func testMWBoundToQP(t *testing.T, p transport.Provider) {
	x := newFRFixture(t, p, mechanisms[1])
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	pr2 := connectPair(t, p, pairConfig{pdA: x.a.pd})
	local := newBuf(t, p, pr2.b.pd, transport.PageSize, transport.AccessLocalWrite)
	before := append([]byte(nil), x.arena.Bytes()...)
	wc := pr2.b.do(t, writeWR(2, local.sge(0, 64), x.f.addr(0), k))
	checkWC(t, wc, 2, pr2.b.qp, transport.StatusRemAccessErr)
	checkBytes(t, "A's memory after a WRITE through another QP", x.arena.Bytes(), before)
}
