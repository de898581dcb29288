package transporttest

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// The fast-registration tests of the objects themselves: deregistering
// while valid, map arguments, and a window's base MR.

// Deregistering a VALID object (Close) ends its registration: a later WRITE
// with its key fails (docs/verbs.md#object-states: dereg works from any state).
func testFRDeregWhileValid(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	var err error
	if x.f.mw != nil {
		err = x.f.mw.Close()
	} else {
		err = x.f.frmr.Close()
	}
	if err != nil {
		t.Fatalf("Close of a VALID %s: %v", m.name, err)
	}
	x.writeFails(t, 2, k, raddr, 64, "WRITE through the key of a deregistered object")
}

// Map argument checks (ib_map_mr_sg): page-list limit, iova alignment.
func testFRMRMapArgs(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	attr := dev.Attr()
	needCaps(t, attr, transport.CapFastRegMR)
	pd := allocPD(t, dev)
	mr, err := pd.AllocFastRegMR(2)
	if err != nil {
		t.Fatalf("AllocFastRegMR(2): %v", err)
	}
	t.Cleanup(func() { mr.Close() })
	if mr.MaxPages() < 2 {
		t.Errorf("MaxPages %d, asked for 2", mr.MaxPages())
	}
	a := newArena(t, p, (mr.MaxPages()+2)*transport.PageSize)
	ps := transport.PageSize
	if err := mr.Map(a, 100, ps, frmrIOVABase+100); err != nil {
		t.Errorf("Map of 2 pages at an offset: %v", err)
	}
	if err := mr.Map(a, 0, (mr.MaxPages()+1)*ps, frmrIOVABase); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("Map of MaxPages+1 pages: %v, want ErrInvalidArgument", err)
	}
	if err := mr.Map(a, 100, 100, frmrIOVABase+101); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("Map with iova%%PageSize != off%%PageSize: %v, want ErrInvalidArgument", err)
	}
	if err := mr.Map(a, a.Len()-10, 20, frmrIOVABase+uint64(a.Len()-10)); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("Map past the arena: %v, want ErrInvalidArgument", err)
	}
}

// An MR with a window bound over it cannot be deregistered (ErrBusy);
// once the window is invalidated it can (mr.go; rxe refuses dereg while
// windows are bound).
func testMWBaseMRBusy(t *testing.T, p transport.Provider) {
	x := newFRFixture(t, p, mechanisms[1])
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	if err := x.f.base.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Errorf("Close of an MR with a bound window: %v, want ErrBusy", err)
	}
	x.linv(t, 2, k)
	if err := x.f.base.Close(); err != nil {
		t.Errorf("Close of the MR after its window was invalidated: %v", err)
	}
}
