package transporttest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("QP/StateMachine", testQPStateMachine)
	register("QP/NumbersUnique", testQPNumbers)
	register("QP/PostBeforeRTS", testPostBeforeRTS)
	register("QP/RecvInReset", testRecvInReset)
	register("QP/PostInErrFlushes", testPostInErr)
	register("QP/FlushOnErr", testFlushOnErr)
	register("QP/SQOverflow", testSQOverflow)
	register("QP/SQOverflowInSQD", testSQOverflowSQD)
	register("CQ/OverrunNatural", testCQOverrunNatural)
	register("Order/RecvBeforeSendCompletion", testRecvBeforeSendCompletion)
	register("QP/SQDrainedEvent", testSQDrained)
	register("QP/PostArgs", testPostArgs)
	register("QP/PostAfterClose", testPostAfterClose)
}

// unconnected creates a PD, a CQ and a QP in RESET on the default device.
func unconnected(t *testing.T, p transport.Provider, sendWR int) (transport.Device, transport.PD, transport.CQ, transport.QP) {
	t.Helper()
	dev := openDevice(t, p)
	pd := allocPD(t, dev)
	cq := createCQ(t, dev, 2*sendWR+8)
	qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: sendWR, MaxRecvWR: sendWR, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close() })
	return dev, pd, cq, qp
}

// QP state machine (docs/verbs.md#qp-states, qp.go): RESET→INIT by hand;
// INIT→RTR needs a connection; any→ERR; ERR→RESET; nothing else leaves ERR.
func testQPStateMachine(t *testing.T, p transport.Provider) {
	_, _, _, qp := unconnected(t, p, 8)
	if st := qp.State(); st != transport.QPReset {
		t.Fatalf("new QP in %v, want RESET", st)
	}
	mustModify := func(to transport.QPState) {
		t.Helper()
		if err := qp.Modify(to); err != nil {
			t.Fatalf("Modify(%v) from %v: %v", to, qp.State(), err)
		}
		if st := qp.State(); st != to {
			t.Fatalf("after Modify(%v) the QP is in %v", to, st)
		}
	}
	mustFail := func(to transport.QPState) {
		t.Helper()
		from := qp.State()
		if err := qp.Modify(to); !errors.Is(err, transport.ErrInvalidState) {
			t.Errorf("Modify(%v) from %v: %v, want ErrInvalidState", to, from, err)
		}
		if st := qp.State(); st != from {
			t.Errorf("failed Modify(%v) moved the QP from %v to %v", to, from, st)
		}
	}
	mustFail(transport.QPRTS)
	mustFail(transport.QPRTR)
	mustFail(transport.QPSQD)
	mustModify(transport.QPInit)
	mustFail(transport.QPRTR) // needs the peer's address: connection management only
	mustFail(transport.QPRTS)
	mustModify(transport.QPErr)
	mustFail(transport.QPInit)
	mustFail(transport.QPRTS)
	mustModify(transport.QPReset)
	mustModify(transport.QPErr) // RESET -> ERR
	mustModify(transport.QPReset)
	mustModify(transport.QPInit)
	mustModify(transport.QPReset) // INIT -> RESET
}

func testQPNumbers(t *testing.T, p transport.Provider) {
	seen := map[uint32]bool{}
	for range 8 {
		_, _, _, qp := unconnected(t, p, 4)
		if seen[qp.Num()] {
			t.Errorf("QP number %d handed out twice", qp.Num())
		}
		seen[qp.Num()] = true
	}
}

// Posts before RTS (docs/registration.md#posts-before-rts): a post to a QP in
// RESET or INIT fails at once with ErrInvalidState and n == 0 on a strict
// device; under Quirks.DropPostsBeforeRTS it is accepted and never completes
// (not even as a flush later).
func testPostBeforeRTS(t *testing.T, p transport.Provider) {
	dev, pd, cq, qp := unconnected(t, p, 8)
	q := dev.Attr().Quirks
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	try := func(id uint64) {
		t.Helper()
		state := qp.State()
		wrs := []transport.SendWR{
			{ID: id, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{b.sge(0, 8)}},
			{ID: id + 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{b.sge(0, 8)}},
		}
		n, err := qp.PostSend(wrs)
		if q.DropPostsBeforeRTS {
			if n != 2 || err != nil {
				t.Errorf("PostSend in %v on a drop-before-RTS device: n=%d err=%v, want 2, nil", state, n, err)
			}
			return
		}
		if n != 0 || !errors.Is(err, transport.ErrInvalidState) {
			t.Errorf("PostSend in %v: n=%d err=%v, want 0 and ErrInvalidState", state, n, err)
		}
	}
	try(1)
	if err := qp.Modify(transport.QPInit); err != nil {
		t.Fatal(err)
	}
	try(3)
	// Drain: in ERR a marker flushes; nothing posted before RTS may complete
	// ahead of it (or at all).
	if err := qp.Modify(transport.QPErr); err != nil {
		t.Fatal(err)
	}
	postSend(t, qp, transport.SendWR{ID: 100, Opcode: transport.OpSend, SGL: []transport.SGE{b.sge(0, 8)}})
	checkWC(t, waitWC(t, cq, 1, Timeout)[0], 100, qp, transport.StatusWRFlushErr)
	expectNoWC(t, cq, "after the drain marker")
}

// Receives cannot be posted in RESET (docs/verbs.md#qp-states).
func testRecvInReset(t *testing.T, p transport.Provider) {
	_, pd, cq, qp := unconnected(t, p, 8)
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	n, err := qp.PostRecv([]transport.RecvWR{recvWR(1, b.sge(0, 64))})
	if n != 0 || err == nil {
		t.Errorf("PostRecv in RESET: n=%d err=%v, want 0 and an error", n, err)
	} else if !errors.Is(err, transport.ErrInvalidState) {
		t.Logf("note: PostRecv in RESET failed with %v (not ErrInvalidState)", err)
	}
	if err := qp.Modify(transport.QPInit); err != nil {
		t.Fatal(err)
	}
	postRecv(t, qp, recvWR(2, b.sge(0, 64)))
	if err := qp.Modify(transport.QPErr); err != nil {
		t.Fatal(err)
	}
	checkWC(t, waitWC(t, cq, 1, Timeout)[0], 2, qp, transport.StatusWRFlushErr)
	expectNoWC(t, cq, "after flushing the receive posted in INIT")
}

// In ERR, posts on both queues are accepted and flush in order, signaled or
// not.
func testPostInErr(t *testing.T, p transport.Provider) {
	_, pd, cq, qp := unconnected(t, p, 8)
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	if err := qp.Modify(transport.QPErr); err != nil {
		t.Fatal(err)
	}
	postSend(t, qp,
		transport.SendWR{ID: 1, Opcode: transport.OpSend, SGL: []transport.SGE{b.sge(0, 8)}},
		transport.SendWR{ID: 2, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled, SGL: []transport.SGE{b.sge(0, 8)}, RemoteAddr: 0x1000, RKey: 0x1234},
		transport.SendWR{ID: 3, Opcode: transport.OpLocalInv, InvalidateKey: 0x4321},
	)
	wcs := waitWC(t, cq, 3, Timeout)
	for i, wc := range wcs {
		checkWC(t, wc, uint64(i+1), qp, transport.StatusWRFlushErr)
	}
	postRecv(t, qp, recvWR(10, b.sge(0, 64)), recvWR(11, b.sge(64, 64)))
	wcs = waitWC(t, cq, 2, Timeout)
	checkWC(t, wcs[0], 10, qp, transport.StatusWRFlushErr)
	checkWC(t, wcs[1], 11, qp, transport.StatusWRFlushErr)
	expectNoWC(t, cq, "after the flushes")
}

// QP error mid burst (docs/registration.md#qp-error-mid-burst): the QP goes
// to ERR (Modify) in the middle of a burst. Every outstanding WR yields
// exactly one completion, in posting order: the signaled ones that finished
// succeed, then everything from the first flushed WR on flushes (unsignaled
// ones included); receives flush too.
func testFlushOnErr(t *testing.T, p transport.Provider) {
	const n = 48
	pr := connectPair(t, p, pairConfig{sendWR: 64})
	a, b := pr.a, pr.b
	target := newBuf(t, p, b.pd, n*1024, accRW)
	src := newBuf(t, p, a.pd, n*1024, 0)
	rb := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, a.qp, recvWR(1000, rb.sge(0, 64)), recvWR(1001, rb.sge(64, 64)), recvWR(1002, rb.sge(128, 64)))
	fill(src.a.Bytes(), 20)
	signaled := func(i int) bool { return i%2 == 1 || i == n-1 }
	var wrs []transport.SendWR
	for i := range n {
		wr := writeWR(uint64(i), src.sge(i*1024, 1024), target.addr(i*1024), target.mr.RKey())
		if signaled(i) {
			wr.Flags = transport.FlagSignaled
		}
		wrs = append(wrs, wr)
	}
	for i := 0; i < n; i += 6 {
		postSend(t, a.qp, wrs[i:i+6]...)
		if i == 18 {
			if err := a.qp.Modify(transport.QPErr); err != nil {
				t.Fatalf("Modify(ERR): %v", err)
			}
		}
	}
	// How many completions: every signaled WR that succeeded, plus every
	// WR from the first flushed one on. Collect until the last WR's.
	var wcs []transport.WC
	for len(wcs) == 0 || wcs[len(wcs)-1].ID != n-1 {
		wcs = append(wcs, waitWC(t, a.scq, 1, Timeout)...)
		if len(wcs) > n {
			t.Fatalf("more than %d completions: %s", n, fmtWCs(wcs))
		}
	}
	expectNoWC(t, a.scq, "after the completion of the last WR")
	firstFlush := -1
	next := 0
	for _, wc := range wcs {
		id := int(wc.ID)
		if wc.QPNum != a.qp.Num() {
			t.Errorf("completion %s: QPNum %d, want %d", wc.String(), wc.QPNum, a.qp.Num())
		}
		if id < next {
			t.Fatalf("completion for WR %d out of order (after WR %d): %s", id, next-1, fmtWCs(wcs))
		}
		switch {
		case wc.Status == transport.StatusSuccess && firstFlush < 0:
			if !signaled(id) {
				t.Errorf("successful completion for unsignaled WR %d", id)
			}
			if id >= 24 {
				t.Errorf("WR %d, posted after Modify(ERR), succeeded", id)
			}
		case wc.Status == transport.StatusWRFlushErr:
			if firstFlush < 0 {
				firstFlush = id
			} else if id != next {
				t.Errorf("after the first flushed WR (%d) WR %d has no completion", firstFlush, next)
			}
		default:
			t.Errorf("completion %s: want SUCCESS before the flush point and WR_FLUSH_ERR after", wc.String())
		}
		next = id + 1
	}
	if firstFlush < 0 || firstFlush > 24 {
		t.Errorf("first flushed WR %d; WRs posted after Modify(ERR) (24..) must flush", firstFlush)
	}
	t.Logf("%d WRs, first flushed: %d", n, firstFlush)
	rwcs := waitWC(t, a.rcq, 3, Timeout)
	for i, wc := range rwcs {
		checkWC(t, wc, uint64(1000+i), a.qp, transport.StatusWRFlushErr)
	}
	// Data of the WRs that succeeded is in place.
	for _, wc := range wcs {
		if wc.Status == transport.StatusSuccess {
			i := int(wc.ID)
			checkBytes(t, "WRITE that completed before the flush", target.bytes(i*1024, 1024), src.bytes(i*1024, 1024))
		}
	}
}

// Send queue overflow (docs/registration.md#send-queue-overflow): posting
// more unsignaled WRs than the send queue holds fails with ErrQueueFull at
// the first WR that does not fit; n is the number of free slots. Unsignaled
// WRs keep their slots until a later signaled WR completes
// (docs/verbs.md#completions).
func testSQOverflow(t *testing.T, p transport.Provider) {
	const depth = 16
	pr := connectPair(t, p, pairConfig{sendWR: depth})
	a, b := pr.a, pr.b
	target := newBuf(t, p, b.pd, transport.PageSize, accRW)
	src := newBuf(t, p, a.pd, transport.PageSize, 0)
	wr := func(id uint64, flags transport.SendFlags) transport.SendWR {
		w := writeWR(id, src.sge(0, 8), target.addr(0), target.mr.RKey())
		w.Flags = flags
		return w
	}
	// A full cycle first: unsignaled WRs, then a signaled one frees them all.
	postSend(t, a.qp, wr(1, 0), wr(2, 0), wr(3, 0), wr(4, transport.FlagSignaled))
	checkOK(t, waitWC(t, a.scq, 1, Timeout)[0], 4, a.qp, transport.WCRDMAWrite)
	postSend(t, a.qp, wr(5, 0), wr(6, 0), wr(7, 0))
	var many []transport.SendWR
	for i := range 4 * depth {
		many = append(many, wr(uint64(100+i), 0))
	}
	n, err := a.qp.PostSend(many)
	if err == nil {
		t.Fatalf("posting %d unsignaled WRs on a %d-deep send queue holding 3 accepted all of them: the device frees slots of unsignaled WRs before a signaled completion (rdma-unit-test lists this as an rxe deviation)", len(many), depth)
	}
	if !errors.Is(err, transport.ErrQueueFull) {
		t.Errorf("overflow error %v, want ErrQueueFull", err)
	}
	if n < depth-3 || n >= len(many) {
		t.Errorf("accepted %d of %d, want the %d free slots", n, len(many), depth-3)
	} else if n != depth-3 {
		t.Logf("note: the send queue holds %d, more than the %d asked for", n+3, depth)
	}
	if n2, err := a.qp.PostSend([]transport.SendWR{wr(999, transport.FlagSignaled)}); n2 != 0 || !errors.Is(err, transport.ErrQueueFull) {
		t.Errorf("post to a full send queue: n=%d err=%v, want 0 and ErrQueueFull", n2, err)
	}
}

// The same overflow with the send queue in SQD, where nothing executes: n
// is exactly the free space whatever the device does with unsignaled WRs.
func testSQOverflowSQD(t *testing.T, p transport.Provider) {
	const depth = 16
	pr := connectPair(t, p, pairConfig{sendWR: depth})
	a, b := pr.a, pr.b
	target := newBuf(t, p, b.pd, transport.PageSize, accRW)
	src := newBuf(t, p, a.pd, transport.PageSize, 0)
	drainToSQD(t, a)
	var many []transport.SendWR
	for i := range 2 * depth {
		w := writeWR(uint64(i), src.sge(0, 8), target.addr(0), target.mr.RKey())
		w.Flags = transport.FlagSignaled
		many = append(many, w)
	}
	n, err := a.qp.PostSend(many)
	if !errors.Is(err, transport.ErrQueueFull) || n < depth || n >= len(many) {
		t.Fatalf("posting %d WRs on a %d-deep send queue in SQD: n=%d err=%v, want n=%d and ErrQueueFull", len(many), depth, n, err, depth)
	}
	if err := a.qp.Modify(transport.QPRTS); err != nil {
		t.Fatalf("Modify(RTS): %v", err)
	}
	wcs := waitWC(t, a.scq, n, Timeout)
	for i, wc := range wcs {
		checkOK(t, wc, uint64(i), a.qp, transport.WCRDMAWrite)
	}
	expectNoWC(t, a.scq, "WRs beyond the accepted ones")
}

// CQ overrun without injection: more completions than the CQ holds, none
// polled. Poll then returns ErrCQOverrun, a CQ_ERR event names the CQ and the
// QPs on it are in ERR (docs/verbs.md#device-differences,
// docs/registration.md#cq-overrun; cq.go).
func testCQOverrunNatural(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{sendWR: 64, cqDepth: 4})
	a, b := pr.a, pr.b
	depth := a.scq.Depth()
	if depth+2 > 64 {
		t.Skipf("CreateCQ(4) gave a CQ of depth %d", depth)
	}
	target := newBuf(t, p, b.pd, transport.PageSize, accRW)
	src := newBuf(t, p, a.pd, transport.PageSize, 0)
	var wrs []transport.SendWR
	for i := range depth + 2 {
		w := writeWR(uint64(i), src.sge(0, 8), target.addr(0), target.mr.RKey())
		w.Flags = transport.FlagSignaled
		wrs = append(wrs, w)
	}
	postSend(t, a.qp, wrs...)
	if _, ok := waitEvent(t, a.dev, Timeout, func(ev transport.AsyncEvent) bool {
		return ev.Type == transport.EventCQErr && ev.CQ == a.scq
	}); !ok {
		t.Errorf("no CQ_ERR event for a CQ of depth %d given %d completions", depth, depth+2)
	}
	buf := make([]transport.WC, depth+2)
	_, err := a.scq.Poll(buf)
	if !errors.Is(err, transport.ErrCQOverrun) {
		t.Errorf("Poll of an overrun CQ: %v, want ErrCQOverrun", err)
	}
	if st := a.qp.State(); st != transport.QPErr {
		t.Errorf("QP on an overrun CQ in %v, want ERR", st)
	}
}

// Receive before send completion
// (docs/registration.md#receive-before-send-completion) (receive completion
// before the SEND completion) is a consumer rule (the FRMR pool must wait for
// both); the contract has no hook that delays a send completion, so there is
// nothing provider-side to check.
func testRecvBeforeSendCompletion(t *testing.T, p transport.Provider) {
	t.Skip("receive before send completion is a consumer rule (frmr pool: retire only after both completions); no provider hook delays a send completion")
}

func init() {
	register("QP/SendQueueWrap", testSendQueueWrap)
	register("QP/RecvQueueWrap", testRecvQueueWrap)
}

// A send queue is reused many times over: 5 x MaxSendWR WRITEs, one at a
// time, each placed and byte-checked (every WR after the first MaxSendWR
// reuses a slot).
func testSendQueueWrap(t *testing.T, p transport.Provider) {
	const depth = 8
	pr := connectPair(t, p, pairConfig{sendWR: depth})
	target := newBuf(t, p, pr.a.pd, transport.PageSize, accRW)
	local := newBuf(t, p, pr.b.pd, transport.PageSize, transport.AccessLocalWrite)
	for i := range 5 * depth {
		off := (i % 4) * 64
		fill(local.bytes(0, 32), uint32(i))
		pr.b.doOK(t, writeWR(uint64(i), local.sge(0, 32), target.addr(off), target.mr.RKey()), transport.WCRDMAWrite)
		if !checkBytes(t, fmt.Sprintf("WRITE %d (send queue of %d)", i, depth), target.bytes(off, 32), local.bytes(0, 32)) {
			t.FailNow()
		}
	}
}

// The same for a receive queue: 5 x MaxRecvWR SENDs through receives
// reposted one by one.
func testRecvQueueWrap(t *testing.T, p transport.Provider) {
	const depth = 8
	pr := connectPair(t, p, pairConfig{recvWR: depth})
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	src := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	for i := range depth {
		postRecv(t, pr.a.qp, recvWR(uint64(i), rb.sge(i*64, 64)))
	}
	for i := range 5 * depth {
		fill(src.bytes(0, 48), uint32(i))
		pr.b.doOK(t, sendWR(uint64(1000+i), src.sge(0, 48)), transport.WCSend)
		wc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
		if !checkOK(t, wc, uint64(i), pr.a.qp, transport.WCRecv) ||
			!checkBytes(t, fmt.Sprintf("SEND %d (receive queue of %d)", i, depth), rb.bytes((i%depth)*64, 48), src.bytes(0, 48)) {
			t.FailNow()
		}
		postRecv(t, pr.a.qp, recvWR(uint64(i+depth), rb.sge((i%depth)*64, 64)))
	}
}

// drainToSQD moves a's QP to SQD (skipping the test on a device that
// cannot) and waits for its SQ_DRAINED event: SQD -> RTS is allowed only
// once the send queue has drained (IBTA's drained substate of SQD), and
// rxe on Linux 6.12 drains on a workqueue and refuses the Modify with
// EINVAL until then.
func drainToSQD(t *testing.T, a *side) {
	t.Helper()
	if err := a.qp.Modify(transport.QPSQD); err != nil {
		t.Skipf("Modify(SQD): %v", err)
	}
	if _, ok := waitEvent(t, a.dev, Timeout, func(ev transport.AsyncEvent) bool {
		return ev.Type == transport.EventSQDrained && ev.QPNum == a.qp.Num()
	}); !ok {
		t.Fatalf("no SQ_DRAINED event for QP %d", a.qp.Num())
	}
}

// RTS -> SQD raises SQ_DRAINED once the WRs already in progress are done
// (event.go); WRs not yet started stay queued and run after SQD -> RTS. The
// completions before and after are one in-order sequence.
func testSQDrained(t *testing.T, p transport.Provider) {
	pr, src, target := writeSlots(t, p, 8)
	a := pr.a
	fill(src.a.Bytes(), 81)
	postSend(t, a.qp, writes(6, src, target)...)
	drainToSQD(t, a)
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
