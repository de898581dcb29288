package transporttest

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// Invalidation rules: what LOCAL_INV and a received SEND_WITH_INV may
// name, and what a failed one does to the QPs and their events.
func init() {
	register("Event/RemoteInvalidateErr", testRemoteInvalidateEvent)
	register("MR/LocalInvRegularMR", testLocalInvRegularMR)
	for _, m := range mechanisms {
		register("FastReg/"+m.name+"/SendWithInvOtherPD", func(t *testing.T, p transport.Provider) { testFRSendWithInvOtherPD(t, p, m) })
		register("FastReg/"+m.name+"/SendWithInvFree", func(t *testing.T, p transport.Provider) { testFRSendWithInvFree(t, p, m) })
		register("FastReg/"+m.name+"/LocalInvOtherPD", func(t *testing.T, p transport.Provider) { testFRLocalInvOtherPD(t, p, m) })
	}
}

// A bad SEND_WITH_INV is an invalid request (Class J): the receiver gets
// QP_REQ_ERR (event.go, docs/verbs.md#who-checks-what,
// docs/verbs.md#async-events) and goes to ERR. Under Quirks.NoQPErrorEvents
// (rxe) it goes to ERR without the event.
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

// Only fast-registration MRs and windows can be invalidated: LOCAL_INV of a
// regular MR's key fails (docs/verbs.md#object-states: rxe refuses non-FRMR
// types).
func testLocalInvRegularMR(t *testing.T, p transport.Provider) {
	attr := deviceAttr(t, p)
	needCaps(t, attr, transport.CapLocalInv)
	pr := connectPair(t, p, pairConfig{})
	mr := newBuf(t, p, pr.a.pd, transport.PageSize, accRW)
	wc := pr.a.do(t, localInvWR(1, mr.mr.RKey(), 0))
	checkWC(t, wc, 1, pr.a.qp, localFail(attr.Quirks, attr.Quirks.LocalOpErrStatus)...)
	// The MR is untouched: a new connection still writes it.
	pr2 := connectPair(t, p, pairConfig{pdA: pr.a.pd})
	src := newBuf(t, p, pr2.b.pd, transport.PageSize, 0)
	pr2.b.doOK(t, writeWR(2, src.sge(0, 8), mr.addr(0), mr.mr.RKey()), transport.WCRDMAWrite)
}

// SEND_WITH_INV naming an object of another PD than the receiving QP's fails
// REM_INV_REQ_ERR at the receiver (docs/verbs.md#object-states,
// docs/verbs.md#who-checks-what), whatever the quirks.
func testFRSendWithInvOtherPD(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	needCaps(t, x.a.attr, transport.CapSendWithInv)
	pd2, err := x.a.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd2.Close() })
	other := newFastReg(t, m, x.a.attr, pd2, x.arena)
	postRecv(t, x.a.qp, recvWR(1, x.rbuf.sge(0, 256)))
	swc := x.b.do(t, transport.SendWR{ID: 2, Opcode: transport.OpSendWithInv, InvalidateKey: other.key(), SGL: []transport.SGE{x.local.sge(0, 8)}})
	t.Logf("sender's completion: %s", swc.String())
	checkWC(t, waitWC(t, x.a.rcq, 1, Timeout)[0], 1, x.a.qp, transport.StatusRemInvReqErr)
	if st := x.a.qp.State(); st != transport.QPErr {
		t.Errorf("receiver in %v, want ERR", st)
	}
}

// SEND_WITH_INV naming a FREE object of the right PD: succeeds (reported
// with WCWithInv) under Quirks.InvalidateFreeOK, else REM_INV_REQ_ERR.
func testFRSendWithInvFree(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	needCaps(t, x.a.attr, transport.CapSendWithInv)
	postRecv(t, x.a.qp, recvWR(1, x.rbuf.sge(0, 256)))
	x.b.do(t, transport.SendWR{ID: 2, Opcode: transport.OpSendWithInv, InvalidateKey: x.f.key(), SGL: []transport.SGE{x.local.sge(0, 8)}})
	wc := waitWC(t, x.a.rcq, 1, Timeout)[0]
	if !x.quirk.InvalidateFreeOK {
		checkWC(t, wc, 1, x.a.qp, transport.StatusRemInvReqErr)
		return
	}
	if checkOK(t, wc, 1, x.a.qp, transport.WCRecv) && (wc.Flags&transport.WCWithInv == 0 || wc.InvalidatedKey != x.f.key()) {
		t.Errorf("%s: want WCWithInv naming %v", wc.String(), x.f.key())
	}
}

// LOCAL_INV of an object of another PD than the QP's fails
// (docs/verbs.md#object-states: only objects of the QP's PD).
func testFRLocalInvOtherPD(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	pd2, err := x.a.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd2.Close() })
	// Register it VALID on a connection of its own PD first.
	other := newFastReg(t, m, x.a.attr, pd2, x.arena)
	pr2 := connectPair(t, p, pairConfig{pdA: pd2})
	k := other.key().Bump()
	pr2.a.doOK(t, other.regWR(t, 1, k, 0, 4096, frAcc, 0), m.wcOpcode())
	wc := x.a.do(t, localInvWR(2, k, 0))
	checkWC(t, wc, 2, x.a.qp, x.localErr()...)
	// Still valid for its own connection's peer.
	local := newBuf(t, p, pr2.b.pd, transport.PageSize, transport.AccessLocalWrite)
	pr2.b.doOK(t, writeWR(3, local.sge(0, 64), other.addr(0), k), transport.WCRDMAWrite)
}
