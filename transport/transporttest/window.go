package transporttest

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// Rules of type-2 memory windows: what a bind needs, which QP a window
// belongs to, and what it holds.
func init() {
	register("FastReg/MW/CrossQPInvalidate", testMWCrossQPInvalidate)
	register("FastReg/MW/SendWithInvValidOtherQP", func(t *testing.T, p transport.Provider) { testMWSendWithInvElsewhere(t, p, true) })
	register("FastReg/MW/SendWithInvValidOtherPD", func(t *testing.T, p transport.Provider) { testMWSendWithInvElsewhere(t, p, false) })
	register("FastReg/MW/BoundToQP", testMWBoundToQP)
	register("FastReg/MW/BindWithoutMWBindAccess", testMWBindWithoutAccess)
	register("FastReg/MW/BindOutsideMR", testMWBindOutsideMR)
	register("FastReg/MW/BindWriteNeedsLocalWrite", testMWBindNeedsLocalWrite)
	register("FastReg/MW/DestroyQPWithBoundWindow", testDestroyQPWithBoundWindow)
	register("FastReg/MW/IndexReuse", testMWIndexReuse)
	register("FastReg/MW/RebindInOnePost", testMWRebindInOnePost)
}

// testMWRebindInOnePost: one post binds a window, invalidates it and binds
// it again under the next key, three times over, with no access, as the
// initiator's registration fence does with its barrier for every I/O of
// a batch (frmr.Config.FenceRegistrations). Every WR succeeds and the
// window ends VALID under the last key. On the ibverbs provider over rxe
// the first bind once failed MW_BIND_ERR: libibverbs reads a window's
// current key from its ibv_mw when the chain is posted, so every bind of
// one window in one ibv_post_send carried the key the last one set.
func testMWRebindInOnePost(t *testing.T, p transport.Provider) {
	attr := deviceAttr(t, p)
	needCaps(t, attr, transport.CapMemWindow2)
	pr := connectPair(t, p, pairConfig{})
	a := pr.a
	arena := newArena(t, p, transport.PageSize)
	mr := regMR(t, a.pd, arena, 0, transport.PageSize, transport.AccessLocalWrite|transport.AccessMWBind)
	mw, err := a.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mw.Close() })
	bind := func(id uint64, k transport.Key) transport.SendWR {
		return transport.SendWR{ID: id, Opcode: transport.OpBindMW, Bind: transport.BindWR{
			MW: mw, Key: k, MR: mr, Addr: mr.Addr(), Length: uint64(transport.PageSize)}}
	}
	k := mw.Key().Bump()
	chain := []transport.SendWR{bind(1, k)}
	for i := range 3 {
		next := k.Bump()
		chain = append(chain, localInvWR(uint64(2+2*i), k, transport.FlagFence), bind(uint64(3+2*i), next))
		k = next
	}
	chain[len(chain)-1].Flags |= transport.FlagSignaled
	postSend(t, a.qp, chain...)
	last := chain[len(chain)-1].ID
	checkWC(t, waitWC(t, a.scq, 1, Timeout)[0], last, a.qp, transport.StatusSuccess)
	// Still usable: it invalidates under the last key.
	postSend(t, a.qp, localInvWR(100, k, transport.FlagSignaled))
	checkWC(t, waitWC(t, a.scq, 1, Timeout)[0], 100, a.qp, transport.StatusSuccess)
}

// A type-2 window bound on one QP cannot be invalidated by LOCAL_INV on
// another QP of the same PD (rdma-unit-test mw_test: cross-QP invalidate
// -> MW_BIND_ERR; docs/verbs.md#completion-statuses).
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

// testMWSendWithInvElsewhere: a SEND_WITH_INV arrives on a QP other than
// the one a VALID type-2 window was bound through, of the same PD
// (samePD) or of another. A type-2B window is associated with the QP
// that bound it, as remote access through it is (testMWBoundToQP): the
// strict reading fails the receive REM_INV_REQ_ERR and leaves the window
// valid for its own QP's peer. Under Quirks.RemoteInvalidateAnyQP the
// invalidation succeeds wherever it arrives and the window is FREE:
// rxe_invalidate_mw finds the window by its key in the device's pool and
// checks neither QP nor PD, so a peer of any connection of the host can
// end another's registration, and reach a FREE window's key too (the
// kernel oops of transport/ibverbs' TestOops).
func testMWSendWithInvElsewhere(t *testing.T, p transport.Provider, samePD bool) {
	x := newFRFixture(t, p, mechanisms[1])
	needCaps(t, x.a.attr, transport.CapSendWithInv)
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	var cfg pairConfig
	if samePD {
		cfg.pdA = x.a.pd
	}
	pr2 := connectPair(t, p, cfg)
	rbuf := newBuf(t, p, pr2.a.pd, transport.PageSize, transport.AccessLocalWrite)
	src := newBuf(t, p, pr2.b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr2.a.qp, recvWR(2, rbuf.sge(0, 256)))
	swc := pr2.b.do(t, transport.SendWR{ID: 3, Opcode: transport.OpSendWithInv, InvalidateKey: k, SGL: []transport.SGE{src.sge(0, 8)}})
	wc := waitWC(t, pr2.a.rcq, 1, Timeout)[0]
	t.Logf("sender's completion: %s; receiver's: %s", swc.String(), wc.String())
	if !x.quirk.RemoteInvalidateAnyQP {
		checkWC(t, wc, 2, pr2.a.qp, transport.StatusRemInvReqErr)
		x.writeOK(t, 4, k, x.f.addr(0), 0, 64, 80) // still bound
		return
	}
	if checkOK(t, wc, 2, pr2.a.qp, transport.WCRecv) && (wc.Flags&transport.WCWithInv == 0 || wc.InvalidatedKey != k) {
		t.Errorf("%s: want WCWithInv naming %v", wc.String(), k)
	}
	x.writeFails(t, 4, k, x.f.addr(0), 64, "a window another connection's peer invalidated")
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
	checkWC(t, wcs[0], 1, a.qp, localFail(attr.Quirks, attr.Quirks.LocalOpErrStatus, transport.StatusMWBindErr)...)
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

// testDestroyQPWithBoundWindow: a type-2 window bound through a QP holds
// it on rxe (rxe_do_bind_mw takes a reference on the QP; rxe_destroy_qp
// waited ~50 s for it in the test VM and warned in __rxe_cleanup). Unless
// the device has DestroyQPInvalidatesWindows, Close refuses with ErrBusy
// and leaves the QP working; once the window is invalidated, Close
// succeeds. With the quirk, Close succeeds at once and takes the window
// with it: a new bind of the window on another QP works.
func testDestroyQPWithBoundWindow(t *testing.T, p transport.Provider) {
	attr := deviceAttr(t, p)
	needCaps(t, attr, transport.CapMemWindow2)
	pr := connectPair(t, p, pairConfig{})
	a := pr.a
	arena := newArena(t, p, 2*transport.PageSize)
	mr := regMR(t, a.pd, arena, 0, 2*transport.PageSize, transport.AccessLocalWrite|transport.AccessMWBind)
	mw, err := a.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mw.Close() })
	key := mw.Key().Bump()
	postSend(t, a.qp, transport.SendWR{ID: 1, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled, Bind: transport.BindWR{
		MW: mw, Key: key, MR: mr, Addr: mr.Addr(), Length: uint64(transport.PageSize), Access: transport.AccessRemoteRead}})
	checkWC(t, waitWC(t, a.scq, 1, Timeout)[0], 1, a.qp, transport.StatusSuccess)

	err = a.qp.Close()
	if attr.Quirks.DestroyQPInvalidatesWindows {
		if err != nil {
			t.Fatalf("Close of a QP with a bound window: %v, want nil (DestroyQPInvalidatesWindows)", err)
		}
		return
	}
	if !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("Close of a QP with a window bound through it: %v, want ErrBusy", err)
	}
	// Refused means untouched: the QP still works, and its invalidation
	// of the window releases it.
	postSend(t, a.qp, localInvWR(2, key, transport.FlagSignaled))
	checkWC(t, waitWC(t, a.scq, 1, Timeout)[0], 2, a.qp, transport.StatusSuccess)
	if err := a.qp.Close(); err != nil {
		t.Fatalf("Close after the window was invalidated: %v", err)
	}
}

// testMWIndexReuse: which index a window allocated after a deallocation
// gets. With Quirks.CyclicIndices (rxe: rxe_pool.c allocates with
// xa_alloc_cyclic) a freed index does not come back while fresh ones
// remain: 64 windows allocated and freed one after the other have 64
// different indices. Without the quirk nothing is promised, and the test
// only reports what the device did (the strict profile hands back the
// index freed last, the reuse frmr's windows must survive).
func testMWIndexReuse(t *testing.T, p transport.Provider) {
	attr := deviceAttr(t, p)
	needCaps(t, attr, transport.CapMemWindow2)
	pd, err := openDevice(t, p).AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	seen := map[uint32]int{}
	const n = 64
	for i := 0; i < n; i++ {
		mw, err := pd.AllocMW()
		if err != nil {
			t.Fatalf("AllocMW %d: %v", i, err)
		}
		idx := mw.Key().Index()
		if j, ok := seen[idx]; ok && attr.Quirks.CyclicIndices {
			t.Fatalf("window %d got index %#x, freed by window %d, while fresh indices remain (CyclicIndices)", i, idx, j)
		}
		seen[idx] = i
		if err := mw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d windows allocated and freed in turn got %d distinct indices (CyclicIndices %v)", n, len(seen), attr.Quirks.CyclicIndices)
}
