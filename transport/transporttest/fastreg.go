package transporttest

import (
	"slices"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// mechanism is a fast-registration mechanism: FRMRs registered with REG_MR
// (kernel verbs), or type-2 memory windows bound with BIND_MW over an MR
// registered with AccessMWBind (what user-space libibverbs offers). The same
// rules hold for both (docs/verbs.md).
type mechanism struct {
	name string
	cap  transport.Capability
}

var mechanisms = []mechanism{
	{"FRMR", transport.CapFastRegMR},
	{"MW", transport.CapMemWindow2},
}

func (m mechanism) isMW() bool { return m.cap == transport.CapMemWindow2 }

func (m mechanism) wcOpcode() transport.WCOpcode {
	if m.isMW() {
		return transport.WCBindMW
	}
	return transport.WCRegMR
}

// frmrIOVABase is where FRMR registrations are advertised: not the arena's
// virtual address, so that a provider translating through the wrong address
// fails.
const frmrIOVABase = 0x5a5a_0000_0000

// fastReg is one fast-registration object over an arena: an FRMR, or a
// type-2 window with the base MR it binds over.
type fastReg struct {
	m     mechanism
	arena *transport.Arena
	frmr  transport.FastRegMR
	mw    transport.MW
	base  transport.MR
}

func newFastReg(t *testing.T, m mechanism, attr transport.DeviceAttr, pd transport.PD, arena *transport.Arena) *fastReg {
	t.Helper()
	needCaps(t, attr, m.cap|transport.CapLocalInv)
	f := &fastReg{m: m, arena: arena}
	if m.isMW() {
		f.base = regMR(t, pd, arena, 0, arena.Len(), transport.AccessLocalWrite|transport.AccessMWBind)
		mw, err := pd.AllocMW()
		if err != nil {
			t.Fatalf("AllocMW: %v", err)
		}
		f.mw = mw
		t.Cleanup(func() { mw.Close() })
		return f
	}
	pages := arena.Len()/transport.PageSize + 1
	if attr.MaxFastRegPages > 0 && pages > attr.MaxFastRegPages {
		t.Skipf("test needs %d pages per fast registration, device allows %d", pages, attr.MaxFastRegPages)
	}
	mr, err := pd.AllocFastRegMR(pages)
	if err != nil {
		t.Fatalf("AllocFastRegMR(%d): %v", pages, err)
	}
	f.frmr = mr
	t.Cleanup(func() { mr.Close() })
	return f
}

// key is the key the object was allocated with.
func (f *fastReg) key() transport.Key {
	if f.mw != nil {
		return f.mw.Key()
	}
	return f.frmr.Key()
}

// addr is the remote address of arena offset off under a registration of
// this object.
func (f *fastReg) addr(off int) uint64 {
	if f.mw != nil {
		return f.base.Addr() + uint64(off)
	}
	return frmrIOVABase + uint64(off)
}

// stage prepares (for an FRMR: Map) a registration of [off, off+n) and
// returns the WR that registers it under key k.
func (f *fastReg) regWR(t *testing.T, id uint64, k transport.Key, off, n int, acc transport.Access, flags transport.SendFlags) transport.SendWR {
	t.Helper()
	if f.mw != nil {
		// A window grants remote access only (ibv_bind_mw(3) lists the
		// REMOTE_* flags); LOCAL_WRITE belongs to the MR under it.
		return transport.SendWR{ID: id, Opcode: transport.OpBindMW, Flags: flags, Bind: transport.BindWR{
			MW: f.mw, Key: k, MR: f.base, Addr: f.addr(off), Length: uint64(n), Access: acc &^ transport.AccessLocalWrite,
		}}
	}
	if err := f.frmr.Map(f.arena, off, n, f.addr(off)); err != nil {
		t.Fatalf("FastRegMR.Map(off %d, len %d, iova %#x): %v", off, n, f.addr(off), err)
	}
	return transport.SendWR{ID: id, Opcode: transport.OpRegMR, Flags: flags, Reg: transport.RegWR{MR: f.frmr, Key: k, Access: acc}}
}

func localInvWR(id uint64, k transport.Key, flags transport.SendFlags) transport.SendWR {
	return transport.SendWR{ID: id, Opcode: transport.OpLocalInv, Flags: flags, InvalidateKey: k}
}

// frFixture: a connected pair, a fast-registration object over 4 pages of
// A's memory (pre-filled with a pattern so that any change shows), B's
// local buffer, and an A buffer for receives.
type frFixture struct {
	pr    *pair
	a, b  *side
	m     mechanism
	f     *fastReg
	arena *transport.Arena
	local buf // B: source of WRITEs (offset 0) and sink of READs (offset 8192)
	rbuf  buf // A: receive buffers
	quirk transport.Quirks
}

const (
	frArenaLen = 4 * 4096
	frAcc      = transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
)

func newFRFixture(t *testing.T, p transport.Provider, m mechanism) *frFixture {
	t.Helper()
	needCaps(t, deviceAttr(t, p), m.cap|transport.CapLocalInv)
	pr := connectPair(t, p, pairConfig{})
	x := &frFixture{pr: pr, a: pr.a, b: pr.b, m: m, quirk: pr.a.attr.Quirks}
	x.arena = newArena(t, p, frArenaLen)
	fill(x.arena.Bytes(), 0xa)
	x.f = newFastReg(t, m, x.a.attr, x.a.pd, x.arena)
	x.local = newBuf(t, p, x.b.pd, 4*transport.PageSize, transport.AccessLocalWrite)
	x.rbuf = newBuf(t, p, x.a.pd, transport.PageSize, transport.AccessLocalWrite)
	return x
}

// localErr is the status a failed local memory operation must report:
// Quirks.LocalOpErrStatus. rxe reports MW_BIND_ERR for a failed BIND_MW even
// though its REG_MR/LOCAL_INV failures are LOC_QP_OP_ERR (rxe_do_local_ops),
// so MW_BIND_ERR is always accepted for windows. Where the device reports
// such failures as flushes (Quirks.LocalErrFlushed), WR_FLUSH_ERR.
func (x *frFixture) localErr() []transport.Status {
	s := []transport.Status{x.quirk.LocalOpErrStatus}
	if x.m.isMW() && !slices.Contains(s, transport.StatusMWBindErr) {
		s = append(s, transport.StatusMWBindErr)
	}
	return localFail(x.quirk, s...)
}

// reg registers [off, off+n) under k, signaled, and requires success.
func (x *frFixture) reg(t *testing.T, id uint64, k transport.Key, off, n int, acc transport.Access) uint64 {
	t.Helper()
	x.a.doOK(t, x.f.regWR(t, id, k, off, n, acc, 0), x.m.wcOpcode())
	return x.f.addr(off)
}

func (x *frFixture) linv(t *testing.T, id uint64, k transport.Key) {
	t.Helper()
	x.a.doOK(t, localInvWR(id, k, 0), transport.WCLocalInv)
}

// bWrite has B write n pattern bytes (seed) at (k, raddr); it returns the
// completion and the bytes written.
func (x *frFixture) bWrite(t *testing.T, id uint64, k transport.Key, raddr uint64, n int, seed uint32) (transport.WC, []byte) {
	t.Helper()
	fill(x.local.bytes(0, n), seed)
	return x.b.do(t, writeWR(id, x.local.sge(0, n), raddr, k)), x.local.bytes(0, n)
}

// bRead has B read n bytes at (k, raddr) into local[8192:].
func (x *frFixture) bRead(t *testing.T, id uint64, k transport.Key, raddr uint64, n int) (transport.WC, []byte) {
	t.Helper()
	clear(x.local.bytes(8192, n))
	return x.b.do(t, readWR(id, x.local.sge(8192, n), raddr, k)), x.local.bytes(8192, n)
}

// writeOK: B's write through (k, raddr) lands at arena offset off.
func (x *frFixture) writeOK(t *testing.T, id uint64, k transport.Key, raddr uint64, off, n int, seed uint32) {
	t.Helper()
	wc, data := x.bWrite(t, id, k, raddr, n, seed)
	if checkOK(t, wc, id, x.b.qp, transport.WCRDMAWrite) {
		checkBytes(t, "bytes written through the registration", x.arena.Bytes()[off:off+n], data)
	}
}

// writeFails: B's write through (k, raddr) fails REM_ACCESS_ERR, no byte of
// A's arena changes and A's QP goes to ERR (a sentinel receive is armed
// here).
func (x *frFixture) writeFails(t *testing.T, id uint64, k transport.Key, raddr uint64, n int, why string) {
	t.Helper()
	x.a.armSentinel(t, x.rbuf, 2048)
	before := append([]byte(nil), x.arena.Bytes()...)
	wc, _ := x.bWrite(t, id, k, raddr, n, 0xbad)
	if !checkWC(t, wc, id, x.b.qp, transport.StatusRemAccessErr) {
		t.Errorf("%s: the WRITE through %v at %#x was not refused", why, k, raddr)
	}
	checkBytes(t, why+": A's memory after the refused WRITE", x.arena.Bytes(), before)
	x.a.expectErrState(t, why+": responder")
}

// readFails checks that B's READ of n bytes through k at raddr is refused
// with REM_ACCESS_ERR, brings nothing into B's sink, and moves A's
// responder to ERR; why says which READ it is.
func (x *frFixture) readFails(t *testing.T, id uint64, k transport.Key, raddr uint64, n int, why string) {
	t.Helper()
	x.a.armSentinel(t, x.rbuf, 0)
	wc, got := x.bRead(t, id, k, raddr, n)
	if !checkWC(t, wc, id, x.b.qp, transport.StatusRemAccessErr) {
		t.Errorf("%s: the READ through %v at %#x was not refused", why, k, raddr)
	}
	checkBytes(t, why+": B's sink after the refused READ", got, make([]byte, n))
	x.a.expectErrState(t, why+": responder")
}

func init() {
	for _, m := range mechanisms {
		reg := func(name string, f func(*testing.T, transport.Provider, mechanism)) {
			register("FastReg/"+m.name+"/"+name, func(t *testing.T, p transport.Provider) { f(t, p, m) })
		}
		reg("RegisterWriteRead", testFRRegisterWriteRead)
		reg("ChainedAdvertise", testFRChainedAdvertise)
		reg("AllocKeyNotValid", testFRAllocKeyNotValid)
		reg("PreviousKeyFails", testFRPreviousKeyFails)
		reg("AccessWriteOnly", testFRAccessWriteOnly)
		reg("OutOfBounds", testFROutOfBounds)
		reg("RegOnValid", testFRRegOnValid)
		reg("RegWrongIndex", testFRRegWrongIndex)
		reg("RegOtherPD", testFRRegOtherPD)
		reg("LocalInv", testFRLocalInv)
		reg("LocalInvWrongKey", testFRLocalInvWrongKey)
		reg("LocalInvNeverRegistered", testFRLocalInvNeverRegistered)
		reg("LocalInvTwice", testFRLocalInvTwice)
		reg("StagedKeyInvisible", testFRStagedKeyInvisible)
		reg("StrayWriteAfterReregister", func(t *testing.T, p transport.Provider, m mechanism) { testFRStrayAfterReregister(t, p, m, false) })
		reg("StrayReadAfterReregister", func(t *testing.T, p transport.Provider, m mechanism) { testFRStrayAfterReregister(t, p, m, true) })
		reg("StrayInjectedAfterReregister", testFRStrayInjected)
		reg("StrayBeforeInvalidate", testFRStrayBeforeInvalidate)
		reg("KeyWrap", testFRKeyWrap)
		reg("PoisonAfterFlushedReg", testFRPoisonAfterFlushedReg)
		reg("PoisonAfterFlushedLocalInv", testFRPoisonAfterFlushedLocalInv)
		reg("SendWithInv", testFRSendWithInv)
		reg("SendWithInvWrongVariant", testFRSendWithInvWrongVariant)
		reg("SendWithInvAtErr", testFRSendWithInvAtErr)
		reg("FencedLocalInvAfterRead", testFRFencedLocalInvAfterRead)
		reg("DeregWhileValid", testFRDeregWhileValid)
	}
	register("FastReg/FRMR/MapArgs", testFRMRMapArgs)
	register("FastReg/MW/BaseMRBusy", testMWBaseMRBusy)
	register("FastReg/SendWithInvRegularMR", testSendWithInvRegularMR)
}
