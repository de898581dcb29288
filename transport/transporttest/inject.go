package transporttest

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Inject/QPErrorMidBurst", testInjectQPError)
	register("Inject/PostFailure", testInjectPostFailure)
	register("Inject/DropCQE", testInjectDropCQE)
	register("Inject/CQEStatus", testInjectCQEStatus)
	register("Inject/DuplicateSend", testInjectDuplicateSend)
	register("Inject/DuplicateWrite", testInjectDuplicateWrite)
	register("Inject/CutLink", testInjectCutLink)
	register("Inject/CQOverrun", testInjectCQOverrun)
	for _, m := range mechanisms {
		register("FastReg/"+m.name+"/PostFailureMidChain", func(t *testing.T, p transport.Provider) { testFRPostFailureMidChain(t, p, m) })
	}
}

// writes builds n signaled 512-byte WRITEs from src slot i to target slot i.
func writes(n int, src, target buf) []transport.SendWR {
	wrs := make([]transport.SendWR, n)
	for i := range wrs {
		wrs[i] = writeWR(uint64(i), src.sge(i*512, 512), target.addr(i*512), target.mr.RKey())
		wrs[i].Flags = transport.FlagSignaled
	}
	return wrs
}

// writeSlots connects a pair with n 512-byte slots for writes: src on A
// (local only) and target on B (remote read and write).
func writeSlots(t *testing.T, p transport.Provider, n int) (pr *pair, src, target buf) {
	pr = connectPair(t, p, pairConfig{})
	return pr, newBuf(t, p, pr.a.pd, n*512, 0), newBuf(t, p, pr.b.pd, n*512, accRW)
}

// QP error mid burst (docs/registration.md#qp-error-mid-burst) with a
// deterministic error point: the QP goes to ERR just before WR k executes.
// Every WR yields exactly one completion, in posting order. WR k and every
// later WR flush (unsignaled ones included) and place no data. WRs before k
// succeed, except that on a pipelined wire some may still be in flight when
// the QP fails: the first of those gets an error status of the provider's
// choosing, the rest flush (docs/registration.md#qp-error-mid-burst).
// Receives flush too.
func testInjectQPError(t *testing.T, p transport.Provider) {
	inj := hook[QPErrorInjector](t, p, "InjectQPError")
	pr, src, target := writeSlots(t, p, 8)
	a := pr.a
	rb := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	fill(src.a.Bytes(), 50)
	postRecv(t, a.qp, recvWR(100, rb.sge(0, 64)))
	const k = 3
	if err := inj.InjectQPError(a.qp, k); err != nil {
		t.Fatal(err)
	}
	wrs := writes(8, src, target)
	wrs[5].Flags = 0 // an unsignaled WR after the error point flushes too
	postSend(t, a.qp, wrs...)
	wcs := waitWC(t, a.scq, 8, Timeout)
	failed := -1
	for i, wc := range wcs {
		switch {
		case i >= k:
			checkWC(t, wc, uint64(i), a.qp, transport.StatusWRFlushErr)
			checkBytes(t, "target of a WR at or after the error point", target.bytes(i*512, 512), make([]byte, 512))
		case failed < 0 && wc.Status == transport.StatusSuccess:
			checkOK(t, wc, uint64(i), a.qp, transport.WCRDMAWrite)
			checkBytes(t, "WRITE completed before the error point", target.bytes(i*512, 512), src.bytes(i*512, 512))
		case failed < 0:
			failed = i
			if wc.Status == transport.StatusWRFlushErr {
				checkWC(t, wc, uint64(i), a.qp, transport.StatusWRFlushErr)
			} else {
				checkWC(t, wc, uint64(i), a.qp, wc.Status) // ID and QPNum
			}
			t.Logf("WR %d was in flight when the QP failed: %s", i, wc.String())
		default:
			checkWC(t, wc, uint64(i), a.qp, transport.StatusWRFlushErr)
		}
	}
	checkWC(t, waitWC(t, a.rcq, 1, Timeout)[0], 100, a.qp, transport.StatusWRFlushErr)
	if st := a.qp.State(); st != transport.QPErr {
		t.Errorf("QP in %v, want ERR", st)
	}
}

// Partial post (docs/registration.md#partial-post): PostSend failing at WR k
// returns n == k and an error wrapping ErrQueueFull; WRs before k complete,
// none from k on ever does.
func testInjectPostFailure(t *testing.T, p transport.Provider) {
	inj := hook[PostFailureInjector](t, p, "InjectPostFailure")
	pr, src, target := writeSlots(t, p, 8)
	a := pr.a
	fill(src.a.Bytes(), 51)
	if err := inj.InjectPostFailure(a.qp, 2); err != nil {
		t.Fatal(err)
	}
	wrs := writes(5, src, target)
	n, err := a.qp.PostSend(wrs)
	if n != 2 || !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("PostSend with a failure injected at WR 2: n=%d err=%v, want 2 and ErrQueueFull", n, err)
	}
	wcs := waitWC(t, a.scq, 2, Timeout)
	checkOK(t, wcs[0], 0, a.qp, transport.WCRDMAWrite)
	checkOK(t, wcs[1], 1, a.qp, transport.WCRDMAWrite)
	// A signaled marker: once it completes, nothing posted before it is
	// still to come.
	marker := writeWR(99, src.sge(0, 8), target.addr(7*512), target.mr.RKey())
	a.doOK(t, marker, transport.WCRDMAWrite)
	expectNoWC(t, a.scq, "WRs that were never posted")
	for i := 2; i < 5; i++ {
		checkBytes(t, "target of a WR that was never posted", target.bytes(i*512, 512), make([]byte, 512))
	}
	// The QP is still usable: a post failure is not a QP error.
	if st := a.qp.State(); st != transport.QPRTS {
		t.Errorf("QP after a failed post in %v, want RTS", st)
	}
}

// Partial post (docs/registration.md#partial-post) on a REG→SEND chain: the
// REG is posted, the SEND advertising its key is not. The registration is in
// force, the peer never hears of it.
func testFRPostFailureMidChain(t *testing.T, p transport.Provider, m mechanism) {
	inj := hook[PostFailureInjector](t, p, "InjectPostFailure")
	x := newFRFixture(t, p, m)
	rb := newBuf(t, p, x.b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, x.b.qp, recvWR(1, rb.sge(0, 64)))
	msg := newBuf(t, p, x.a.pd, transport.PageSize, 0)
	k1 := x.f.key().Bump()
	// Failure at WR 0: nothing is posted, the device key is unchanged.
	if err := inj.InjectPostFailure(x.a.qp, 0); err != nil {
		t.Fatal(err)
	}
	n, err := x.a.qp.PostSend([]transport.SendWR{
		x.f.regWR(t, 2, k1, 0, 4096, frAcc, 0),
		{ID: 3, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{msg.sge(0, 16)}},
	})
	if n != 0 || !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("n=%d err=%v, want 0 and ErrQueueFull", n, err)
	}
	// Failure at WR 1: the REG is posted (unsignaled), the SEND is not.
	if err := inj.InjectPostFailure(x.a.qp, 1); err != nil {
		t.Fatal(err)
	}
	n, err = x.a.qp.PostSend([]transport.SendWR{
		x.f.regWR(t, 4, k1, 0, 4096, frAcc, 0),
		{ID: 5, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{msg.sge(0, 16)}},
	})
	if n != 1 || !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("n=%d err=%v, want 1 and ErrQueueFull", n, err)
	}
	// A signaled marker on A's send queue: after it, the REG has executed
	// and nothing else is to complete.
	bmr := newBuf(t, p, x.b.pd, transport.PageSize, accRW)
	x.a.doOK(t, readWR(6, x.rbuf.sge(512, 8), bmr.addr(0), bmr.mr.RKey()), transport.WCRDMARead)
	expectNoWC(t, x.a.scq, "WRs that were never posted")
	// The posted REG is in force under k1.
	x.writeOK(t, 7, k1, x.f.addr(0), 0, 64, 52)
	x.b.expectNoRecv(t, 1, "the SEND that was never posted")
}

// A dropped completion is lost; the others arrive in order.
func testInjectDropCQE(t *testing.T, p transport.Provider) {
	inj := hook[CQEDropInjector](t, p, "InjectDropCQE")
	pr, src, target := writeSlots(t, p, 4)
	if err := inj.InjectDropCQE(pr.a.qp, 1); err != nil {
		t.Fatal(err)
	}
	postSend(t, pr.a.qp, writes(3, src, target)...)
	wcs := waitWC(t, pr.a.scq, 2, Timeout)
	checkOK(t, wcs[0], 0, pr.a.qp, transport.WCRDMAWrite)
	checkOK(t, wcs[1], 2, pr.a.qp, transport.WCRDMAWrite)
	pr.a.doOK(t, writeWR(9, src.sge(0, 8), target.addr(0), target.mr.RKey()), transport.WCRDMAWrite)
	expectNoWC(t, pr.a.scq, "after the marker")
}

// An injected error status behaves like a real error: the QP goes to ERR and
// later WRs flush.
func testInjectCQEStatus(t *testing.T, p transport.Provider) {
	inj := hook[CQEStatusInjector](t, p, "InjectCQEStatus")
	pr, src, target := writeSlots(t, p, 4)
	if err := inj.InjectCQEStatus(pr.a.qp, 1, transport.StatusGeneralErr); err != nil {
		t.Fatal(err)
	}
	postSend(t, pr.a.qp, writes(4, src, target)...)
	wcs := waitWC(t, pr.a.scq, 4, Timeout)
	checkOK(t, wcs[0], 0, pr.a.qp, transport.WCRDMAWrite)
	checkWC(t, wcs[1], 1, pr.a.qp, transport.StatusGeneralErr)
	checkWC(t, wcs[2], 2, pr.a.qp, transport.StatusWRFlushErr)
	checkWC(t, wcs[3], 3, pr.a.qp, transport.StatusWRFlushErr)
	if st := pr.a.qp.State(); st != transport.QPErr {
		t.Errorf("QP after an error completion in %v, want ERR", st)
	}
}

// Duplicate packets (docs/registration.md#duplicate-packets): a duplicated
// SEND is acknowledged but not delivered again: it does not consume a second
// receive.
func testInjectDuplicateSend(t *testing.T, p transport.Provider) {
	inj := hook[DuplicateInjector](t, p, "InjectDuplicate")
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	rb := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	sb := newBuf(t, p, b.pd, transport.PageSize, 0)
	for i := range 3 {
		fill(sb.bytes(i*64, 64), uint32(60+i))
	}
	postRecv(t, a.qp, recvWR(1, rb.sge(0, 64)), recvWR(2, rb.sge(64, 64)), recvWR(3, rb.sge(128, 64)))
	if err := inj.InjectDuplicate(b.qp, 0); err != nil {
		t.Fatal(err)
	}
	b.doOK(t, sendWR(10, sb.sge(0, 64)), transport.WCSend)
	b.doOK(t, sendWR(11, sb.sge(64, 64)), transport.WCSend)
	b.doOK(t, sendWR(12, sb.sge(128, 64)), transport.WCSend)
	wcs := waitWC(t, a.rcq, 3, Timeout)
	for i, wc := range wcs {
		if checkOK(t, wc, uint64(i+1), a.qp, transport.WCRecv) {
			checkBytes(t, "SEND payload (a duplicate must not be delivered)", rb.bytes(i*64, 64), sb.bytes(i*64, 64))
		}
	}
}

// Duplicate packets (docs/registration.md#duplicate-packets): a duplicated
// WRITE is acknowledged and does not re-place data over a later WRITE to the
// same bytes.
func testInjectDuplicateWrite(t *testing.T, p transport.Provider) {
	inj := hook[DuplicateInjector](t, p, "InjectDuplicate")
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	target := newBuf(t, p, a.pd, transport.PageSize, accRW)
	src := newBuf(t, p, b.pd, transport.PageSize, transport.AccessLocalWrite)
	fill(src.bytes(0, 256), 70)
	fill(src.bytes(256, 256), 71)
	if err := inj.InjectDuplicate(b.qp, 0); err != nil {
		t.Fatal(err)
	}
	postSend(t, b.qp,
		writeWR(1, src.sge(0, 256), target.addr(0), target.mr.RKey()),
		writeWR(2, src.sge(256, 256), target.addr(0), target.mr.RKey()),
	)
	b.doOK(t, readWR(3, src.sge(1024, 256), target.addr(0), target.mr.RKey()), transport.WCRDMARead)
	checkBytes(t, "bytes after WRITE 1 (duplicated) then WRITE 2", target.bytes(0, 256), src.bytes(256, 256))
	checkBytes(t, "READ after both WRITEs", src.bytes(1024, 256), src.bytes(256, 256))
}

// A cut link: both QPs to ERR, both Conn.Done close with ErrDisconnected,
// posted receives flush on both sides.
func testInjectCutLink(t *testing.T, p transport.Provider) {
	inj := hook[LinkCutter](t, p, "CutLink")
	pr := connectPair(t, p, pairConfig{})
	ab := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	bb := newBuf(t, p, pr.b.pd, transport.PageSize, transport.AccessLocalWrite)
	pr.a.armSentinel(t, ab, 0)
	pr.b.armSentinel(t, bb, 0)
	if err := inj.CutLink(pr.a.qp); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*side{pr.a, pr.b} {
		if !waitClosed(s.conn.Done(), Timeout) {
			t.Errorf("%s: Conn.Done not closed after the link cut", s.name)
			continue
		}
		if err := s.conn.Err(); !errors.Is(err, transport.ErrDisconnected) {
			t.Errorf("%s: Conn.Err() = %v, want ErrDisconnected", s.name, err)
		}
		s.expectErrState(t, "after the link cut")
	}
}

// CQ overrun (docs/registration.md#cq-overrun): an injected CQ overrun: Poll
// returns ErrCQOverrun, a CQ_ERR event names the CQ, the QPs on it go to ERR.
func testInjectCQOverrun(t *testing.T, p transport.Provider) {
	inj := hook[CQOverrunInjector](t, p, "InjectCQOverrun")
	pr := connectPair(t, p, pairConfig{})
	if err := inj.InjectCQOverrun(pr.a.scq); err != nil {
		t.Fatal(err)
	}
	var wcs [4]transport.WC
	if _, err := pr.a.scq.Poll(wcs[:]); !errors.Is(err, transport.ErrCQOverrun) {
		t.Errorf("Poll after overrun: %v, want ErrCQOverrun", err)
	}
	if _, ok := waitEvent(t, pr.a.dev, Timeout, func(ev transport.AsyncEvent) bool {
		return ev.Type == transport.EventCQErr && ev.CQ == pr.a.scq
	}); !ok {
		t.Error("no CQ_ERR event naming the overrun CQ")
	}
	if st := pr.a.qp.State(); st != transport.QPErr {
		t.Errorf("QP on the overrun CQ in %v, want ERR", st)
	}
	// The receive CQ is a different CQ and still works.
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 64)))
	checkWC(t, waitWC(t, pr.a.rcq, 1, Timeout)[0], 1, pr.a.qp, transport.StatusWRFlushErr)
}
