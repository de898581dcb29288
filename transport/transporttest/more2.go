package transporttest

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("MR/RecvSGEBadKey", testRecvSGEBadKey)
	register("Order/FenceAfterRead", testFenceAfterRead)
	register("Write/Large", testLarge)
	register("CQ/SharedQPNum", testSharedCQ)
	register("FastReg/MW/BindWithoutMWBindAccess", testMWBindWithoutAccess)
	register("FastReg/MW/BindOutsideMR", testMWBindOutsideMR)
	register("FastReg/MW/BindWriteNeedsLocalWrite", testMWBindNeedsLocalWrite)
}

// A receive whose SGE names a bad lkey fails when a SEND lands in it: a
// local protection error at the receiver (rxe reports its malformed-WQE
// status LOC_QP_OP_ERR, Quirks.LocalKeyErrStatus), the receiver QP goes to
// ERR and the sender does not see success.
func testRecvSGEBadKey(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	src := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	bad := rb.sge(0, 64)
	bad.LKey = bad.LKey.Bump()
	postRecv(t, pr.a.qp, recvWR(1, bad))
	pr.a.armSentinel(t, rb, 1024)
	wc := pr.b.do(t, sendWR(2, src.sge(0, 16)))
	if wc.Status == transport.StatusSuccess {
		t.Errorf("SEND into a receive with a bad lkey completed SUCCESS at the sender")
	}
	t.Logf("sender status %v", wc.Status)
	want := []transport.Status{transport.StatusLocProtErr, transport.StatusLocQPOpErr}
	if s := pr.a.attr.Quirks.LocalKeyErrStatus; s != transport.StatusSuccess {
		want = []transport.Status{s}
	}
	checkWC(t, waitWC(t, pr.a.rcq, 1, Timeout)[0], 1, pr.a.qp, want...)
	pr.a.expectErrState(t, "receiver after a bad receive SGE")
	for i, x := range rb.bytes(0, 64) {
		if x != 0 {
			t.Fatalf("byte %d of the refused receive buffer changed", i)
		}
	}
}

// FENCE on a SEND waits for earlier RDMA READs (IBA 10.8.3.3 as cited in
// frmr-semantics §3.1): a SEND gathering the READ's sink carries the data
// the READ fetched.
func testFenceAfterRead(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	remote := newBuf(t, p, b.pd, 4*transport.PageSize, accRW)
	sink := newBuf(t, p, a.pd, 4*transport.PageSize, transport.AccessLocalWrite)
	rb := newBuf(t, p, b.pd, 4*transport.PageSize, transport.AccessLocalWrite)
	const n = 3 * 4096
	for round := range 4 {
		fill(remote.bytes(0, n), uint32(90+round))
		clear(sink.bytes(0, n))
		postRecv(t, b.qp, recvWR(uint64(round), rb.sge(0, n)))
		postSend(t, a.qp,
			readWR(1, sink.sge(0, n), remote.addr(0), remote.mr.RKey()),
			transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagFence | transport.FlagSignaled, SGL: []transport.SGE{sink.sge(0, n)}},
		)
		checkOK(t, waitWC(t, a.scq, 1, Timeout)[0], 2, a.qp, transport.WCSend)
		wc := waitWC(t, b.rcq, 1, Timeout)[0]
		if checkOK(t, wc, uint64(round), b.qp, transport.WCRecv) {
			checkBytes(t, "fenced SEND of the READ sink", rb.bytes(0, n), remote.bytes(0, n))
		}
	}
}

// Large transfers (1 MiB, many MTUs) move every byte.
func testLarge(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	const n = 1 << 20
	if a.attr.MaxMRSize != 0 && a.attr.MaxMRSize < 2*n {
		t.Skipf("MaxMRSize %d", a.attr.MaxMRSize)
	}
	target := newBuf(t, p, a.pd, n, accRW)
	local := newBuf(t, p, b.pd, 2*n, transport.AccessLocalWrite)
	fill(local.bytes(0, n), 95)
	b.doOK(t, writeWR(1, local.sge(0, n), target.addr(0), target.mr.RKey()), transport.WCRDMAWrite)
	checkBytes(t, "1 MiB WRITE", target.bytes(0, n), local.bytes(0, n))
	fill(target.bytes(0, n), 96)
	b.doOK(t, readWR(2, local.sge(n, n), target.addr(0), target.mr.RKey()), transport.WCRDMARead)
	checkBytes(t, "1 MiB READ", local.bytes(n, n), target.bytes(0, n))
	rb := newBuf(t, p, a.pd, n, transport.AccessLocalWrite)
	postRecv(t, a.qp, recvWR(3, rb.sge(0, n)))
	b.doOK(t, sendWR(4, local.sge(0, n)), transport.WCSend)
	wc := waitWC(t, a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 3, a.qp, transport.WCRecv) && wc.ByteLen != n {
		t.Errorf("1 MiB SEND: byte_len %d", wc.ByteLen)
	}
	checkBytes(t, "1 MiB SEND", rb.bytes(0, n), local.bytes(0, n))
}

// Completions of several QPs on one CQ name their QP.
func testSharedCQ(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	cq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq.Close() })
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	var qps []transport.QP
	for range 3 {
		qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { qp.Close() })
		if err := qp.Modify(transport.QPErr); err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
	}
	for i, qp := range qps {
		postSend(t, qp, sendWR(uint64(10*i), b.sge(0, 8)))
		postRecv(t, qp, recvWR(uint64(10*i+1), b.sge(0, 8)))
	}
	wcs := waitWC(t, cq, 6, Timeout)
	for k, wc := range wcs {
		i, r := int(wc.ID/10), wc.ID%10
		if i >= len(qps) || r > 1 {
			t.Errorf("completion %d has unknown ID %#x", k, wc.ID)
			continue
		}
		checkWC(t, wc, wc.ID, qps[i], transport.StatusWRFlushErr)
	}
}

// BIND_MW rules (ibv_bind_mw(3); rxe rxe_check_bind_mw): the MR must allow
// MW_BIND; the window must lie inside the MR; a window granting
// REMOTE_WRITE needs an MR with LOCAL_WRITE. A failed bind completes with
// the local-op error (MW_BIND_ERR accepted) even unsignaled, and the QP goes
// to ERR.
func testMWBindRule(t *testing.T, p transport.Provider, mrAcc transport.Access, off, n int, winAcc transport.Access) {
	t.Helper()
	attr := deviceAttr(t, p)
	needCaps(t, attr, transport.CapMemWindow2)
	pr := connectPair(t, p, pairConfig{})
	a := pr.a
	arena := newArena(t, p, 4*transport.PageSize)
	mr := regMR(t, a.pd, arena, 0, 2*transport.PageSize, mrAcc)
	mw, err := a.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mw.Close() })
	postSend(t, a.qp,
		transport.SendWR{ID: 1, Opcode: transport.OpBindMW, Bind: transport.BindWR{MW: mw, Key: mw.Key().Bump(), MR: mr,
			Addr: mr.Addr() + uint64(off), Length: uint64(n), Access: winAcc}},
		localInvWR(2, mw.Key().Bump(), transport.FlagSignaled),
	)
	wcs := waitWC(t, a.scq, 2, Timeout)
	checkWC(t, wcs[0], 1, a.qp, attr.Quirks.LocalOpErrStatus, transport.StatusMWBindErr)
	checkWC(t, wcs[1], 2, a.qp, transport.StatusWRFlushErr)
}

func testMWBindWithoutAccess(t *testing.T, p transport.Provider) {
	testMWBindRule(t, p, transport.AccessLocalWrite|transport.AccessRemoteWrite, 0, 4096, transport.AccessRemoteWrite)
}

func testMWBindOutsideMR(t *testing.T, p transport.Provider) {
	testMWBindRule(t, p, transport.AccessLocalWrite|transport.AccessMWBind, 4096, 2*4096, transport.AccessRemoteRead)
}

func testMWBindNeedsLocalWrite(t *testing.T, p transport.Provider) {
	testMWBindRule(t, p, transport.AccessRemoteRead|transport.AccessMWBind, 0, 4096, transport.AccessRemoteWrite)
}
