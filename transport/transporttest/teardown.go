package transporttest

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("FastReg/MW/DestroyQPWithBoundWindow", testDestroyQPWithBoundWindow)
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
