package transporttest

import (
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// The fast-registration tests of stale keys: strays fired after a
// re-registration or before an invalidation, key wrap, and objects
// poisoned by a flush.

// Stray after re-registration
// (docs/registration.md#stray-after-re-registration): a stray RDMA op
// carrying the old rkey after invalidate and re-registration under a new key
// fails REM_ACCESS_ERR at its sender and changes no byte of the new
// registration (or the old one).
func testFRStrayAfterReregister(t *testing.T, p transport.Provider, m mechanism, read bool) {
	x := newFRFixture(t, p, m)
	k1 := x.f.key().Bump()
	old := x.reg(t, 1, k1, 0, 4096, frAcc)
	x.writeOK(t, 2, k1, old, 0, 128, 7)
	// Invalidate and re-register in one chain (LINV then REG on one SQ:
	// ordering makes this safe, docs/verbs.md#invalidate-then-register), over
	// different pages.
	k2 := k1.Bump()
	postSend(t, x.a.qp, localInvWR(3, k1, 0), x.f.regWR(t, 4, k2, 8192, 4096, frAcc, transport.FlagSignaled))
	checkOK(t, waitWC(t, x.a.scq, 1, Timeout)[0], 4, x.a.qp, m.wcOpcode())
	cur := x.f.addr(8192)
	x.writeOK(t, 5, k2, cur, 8192, 128, 8)
	if !read {
		x.writeFails(t, 6, k1, old, 64, "stray WRITE with the old rkey after re-registration (stray after re-registration)")
		return
	}
	x.readFails(t, 6, k1, old, 64, "stray READ with the old rkey")
}

// Stray after re-registration
// (docs/registration.md#stray-after-re-registration) through the provider's
// stray-op hook, when it has one: WRITE and READ with the old key at the old
// and the new address.
func testFRStrayInjected(t *testing.T, p transport.Provider, m mechanism) {
	inj := hook[StrayInjector](t, p, "InjectStray")
	x := newFRFixture(t, p, m)
	k1 := x.f.key().Bump()
	x.reg(t, 1, k1, 0, 4096, frAcc)
	k2 := k1.Bump()
	postSend(t, x.a.qp, localInvWR(3, k1, 0), x.f.regWR(t, 4, k2, 8192, 4096, frAcc, transport.FlagSignaled))
	checkOK(t, waitWC(t, x.a.scq, 1, Timeout)[0], 4, x.a.qp, m.wcOpcode())
	x.writeOK(t, 5, k2, x.f.addr(8192), 8192, 64, 8)
	before := append([]byte(nil), x.arena.Bytes()...)
	st, err := inj.InjectStray(x.b.qp, transport.OpRDMAWrite, k1, x.f.addr(8192), pattern(64, 9))
	if err != nil {
		t.Fatalf("InjectStray: %v", err)
	}
	if st != transport.StatusRemAccessErr {
		t.Errorf("stray WRITE with the old rkey at the new address: %v, want REM_ACCESS_ERR", st)
	}
	checkBytes(t, "A's memory after the stray WRITE", x.arena.Bytes(), before)
}

// Stray before invalidation (docs/registration.md#stray-before-invalidation):
// a stray WRITE with the old key that arrives before the LOCAL_INV executes
// is served (device state still VALID); once the LINV executed it fails. The
// LINV is held back by putting A's send queue in SQD.
func testFRStrayBeforeInvalidate(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	if err := x.a.qp.Modify(transport.QPSQD); err != nil {
		t.Skipf("cannot hold the send queue back: Modify(SQD): %v", err)
	}
	postSend(t, x.a.qp, localInvWR(2, k, transport.FlagSignaled))
	x.writeOK(t, 3, k, raddr, 0, 256, 10) // served: the LINV has not executed
	expectNoWC(t, x.a.scq, "LOCAL_INV posted in SQD")
	if err := x.a.qp.Modify(transport.QPRTS); err != nil {
		t.Fatalf("Modify(SQD -> RTS): %v", err)
	}
	checkOK(t, waitWC(t, x.a.scq, 1, Timeout)[0], 2, x.a.qp, transport.WCLocalInv)
	x.writeFails(t, 4, k, raddr, 64, "WRITE with the key after its LINV executed")
}

// Key wrap (docs/registration.md#key-wrap): 256+ registrations of one object:
// the key wraps with the index unchanged and every registration works. Each
// cycle chains LINV(old) and REG(new) on one post (the rw.c pattern, safe by
// SQ ordering).
func testFRKeyWrap(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	start := x.f.key()
	k := start
	const cycles = 260
	for i := range cycles {
		prev := k
		k = k.Bump()
		if k.Index() != start.Index() {
			t.Fatalf("cycle %d: key %v left index %#x", i, k, start.Index())
		}
		off := (i % 4) * 4096
		wr := x.f.regWR(t, uint64(2*i+1), k, off, 4096, frAcc, transport.FlagSignaled)
		if i == 0 {
			postSend(t, x.a.qp, wr)
		} else {
			postSend(t, x.a.qp, localInvWR(uint64(2*i), prev, 0), wr)
		}
		wc := waitWC(t, x.a.scq, 1, Timeout)[0]
		if !checkOK(t, wc, uint64(2*i+1), x.a.qp, m.wcOpcode()) {
			t.Fatalf("cycle %d (key %v) failed", i, k)
		}
		wc, data := x.bWrite(t, 1<<20+uint64(i), k, x.f.addr(off)+16, 32, uint32(i))
		if !checkOK(t, wc, 1<<20+uint64(i), x.b.qp, transport.WCRDMAWrite) {
			t.Fatalf("cycle %d: WRITE through key %v failed", i, k)
		}
		if !checkBytes(t, fmt.Sprintf("cycle %d (key %v, arena offset %d): WRITE", i, k, off), x.arena.Bytes()[off+16:off+48], data) {
			t.FailNow()
		}
		if i == 255 && k != start {
			t.Errorf("after 256 bumps the key is %v, want %v again", k, start)
		}
	}
	x.linv(t, 9999, k)
}

// Poisoned after a flush (docs/registration.md#poisoned-after-a-flush) (REG
// flavour): a REG that was flushed leaves the object poisoned under
// Quirks.PoisonOnFlush: REG on it fails MW_BIND_ERR on a new connection,
// while a fresh object works. Without the quirk the object is unchanged
// (still FREE) and registers normally.
func testFRPoisonAfterFlushedReg(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	if err := x.a.qp.Modify(transport.QPErr); err != nil {
		t.Fatal(err)
	}
	k := x.f.key().Bump()
	postSend(t, x.a.qp, x.f.regWR(t, 1, k, 0, 4096, frAcc, 0))
	checkWC(t, waitWC(t, x.a.scq, 1, Timeout)[0], 1, x.a.qp, transport.StatusWRFlushErr)
	x.poisonCheck(t, p, k)
}

// Poisoned after a flush (docs/registration.md#poisoned-after-a-flush) (LINV
// flavour, FRMR only: a type-2 window is tied to the QP that bound it, so it
// cannot be invalidated from a new connection anyway).
func testFRPoisonAfterFlushedLocalInv(t *testing.T, p transport.Provider, m mechanism) {
	if m.isMW() {
		t.Skip("a type-2 window is bound to its QP; invalidation from a new connection is not meaningful")
	}
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	if err := x.a.qp.Modify(transport.QPErr); err != nil {
		t.Fatal(err)
	}
	postSend(t, x.a.qp, localInvWR(2, k, 0))
	checkWC(t, waitWC(t, x.a.scq, 1, Timeout)[0], 2, x.a.qp, transport.StatusWRFlushErr)
	// On a new connection: the LINV of the device key fails MW_BIND_ERR if
	// poisoned, else it succeeds (the MR was still VALID under k).
	pr2 := connectPair(t, p, pairConfig{pdA: x.a.pd})
	fresh := newFastReg(t, m, x.a.attr, x.a.pd, x.arena)
	fk := fresh.key().Bump()
	pr2.a.doOK(t, fresh.regWR(t, 3, fk, 0, 4096, frAcc, 0), m.wcOpcode())
	wc := pr2.a.do(t, localInvWR(4, k, 0))
	if x.quirk.PoisonOnFlush {
		checkWC(t, wc, 4, pr2.a.qp, localFail(x.quirk, transport.StatusMWBindErr)...)
		return
	}
	checkOK(t, wc, 4, pr2.a.qp, transport.WCLocalInv)
}

func (x *frFixture) poisonCheck(t *testing.T, p transport.Provider, k transport.Key) {
	t.Helper()
	pr2 := connectPair(t, p, pairConfig{pdA: x.a.pd})
	local := newBuf(t, p, pr2.b.pd, transport.PageSize, transport.AccessLocalWrite)
	// A fresh object works.
	fresh := newFastReg(t, x.m, x.a.attr, x.a.pd, x.arena)
	fk := fresh.key().Bump()
	pr2.a.doOK(t, fresh.regWR(t, 10, fk, 0, 4096, frAcc, 0), x.m.wcOpcode())
	pr2.b.doOK(t, writeWR(11, local.sge(0, 64), fresh.addr(0), fk), transport.WCRDMAWrite)
	pr2.a.doOK(t, localInvWR(12, fk, 0), transport.WCLocalInv)
	// The object named by the flushed WR.
	wc := pr2.a.do(t, x.f.regWR(t, 13, k, 4096, 4096, frAcc, 0))
	if x.quirk.PoisonOnFlush {
		checkWC(t, wc, 13, pr2.a.qp, localFail(x.quirk, transport.StatusMWBindErr)...)
		return
	}
	if checkOK(t, wc, 13, pr2.a.qp, x.m.wcOpcode()) {
		pr2.b.doOK(t, writeWR(14, local.sge(0, 64), x.f.addr(4096), k), transport.WCRDMAWrite)
	}
}
