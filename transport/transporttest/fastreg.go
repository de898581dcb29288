package transporttest

import (
	"errors"
	"fmt"
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
// so MW_BIND_ERR is always accepted for windows.
func (x *frFixture) localErr() []transport.Status {
	s := []transport.Status{x.quirk.LocalOpErrStatus}
	if x.m.isMW() && !slices.Contains(s, transport.StatusMWBindErr) {
		s = append(s, transport.StatusMWBindErr)
	}
	return s
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
		reg("FencedLocalInvAfterRead", testFRFencedLocalInvAfterRead)
		reg("DeregWhileValid", testFRDeregWhileValid)
	}
	register("FastReg/FRMR/MapArgs", testFRMRMapArgs)
	register("FastReg/MW/BaseMRBusy", testMWBaseMRBusy)
	register("FastReg/SendWithInvRegularMR", testSendWithInvRegularMR)
}

// REG_MR / BIND_MW under a bumped key, then remote WRITE and READ through
// (rkey, iova) work and move the right bytes (docs/verbs.md#keys).
func testFRRegisterWriteRead(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 4096+100, 8000, frAcc)
	x.writeOK(t, 2, k, raddr+10, 4096+110, 5000, 1)
	wc, got := x.bRead(t, 3, k, raddr, 8000)
	if checkOK(t, wc, 3, x.b.qp, transport.WCRDMARead) {
		checkBytes(t, "READ through the registration", got, x.arena.Bytes()[4096+100:4096+8100])
	}
}

// The REG chained unsignaled in front of the SEND that advertises the key is
// in force before the peer can learn the key (docs/verbs.md#advertising-a-key).
func testFRChainedAdvertise(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key()
	msg := newBuf(t, p, x.a.pd, transport.PageSize, 0)
	rb := newBuf(t, p, x.b.pd, transport.PageSize, transport.AccessLocalWrite)
	for round := range 8 {
		k = k.Bump()
		off := (round % 3) * 4096
		raddr := x.f.addr(off)
		putDesc(msg.bytes(0, 16), raddr, k)
		postRecv(t, x.b.qp, recvWR(uint64(round), rb.sge(0, 64)))
		postSend(t, x.a.qp,
			x.f.regWR(t, 10, k, off, 4096, frAcc, 0),
			transport.SendWR{ID: 11, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{msg.sge(0, 16)}},
		)
		checkOK(t, waitWC(t, x.b.rcq, 1, Timeout)[0], uint64(round), x.b.qp, transport.WCRecv)
		// Use the key at once, before A has even seen its completion.
		gotAddr, gotKey := getDesc(rb.bytes(0, 16))
		x.writeOK(t, 20, gotKey, gotAddr, off, 4096, uint32(round))
		checkOK(t, waitWC(t, x.a.scq, 1, Timeout)[0], 11, x.a.qp, transport.WCSend)
		x.linv(t, 12, k)
	}
}

func putDesc(b []byte, addr uint64, k transport.Key) {
	for i := range 8 {
		b[i] = byte(addr >> (8 * i))
	}
	for i := range 4 {
		b[8+i] = byte(uint32(k) >> (8 * i))
	}
}

func getDesc(b []byte) (uint64, transport.Key) {
	var addr uint64
	var k uint32
	for i := range 8 {
		addr |= uint64(b[i]) << (8 * i)
	}
	for i := range 4 {
		k |= uint32(b[8+i]) << (8 * i)
	}
	return addr, transport.Key(k)
}

// A freshly allocated object is FREE: its allocation key reaches nothing.
func testFRAllocKeyNotValid(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	x.writeFails(t, 1, x.f.key(), x.f.addr(0), 64, "WRITE through the key of a never-registered object")
}

// After REG under the bumped key, the previous key fails.
func testFRPreviousKeyFails(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	x.writeFails(t, 2, x.f.key(), raddr, 64, "WRITE through the allocation key after REG under its successor")
}

// Least privilege (docs/verbs.md#access-flags,
// docs/registration.md#least-privilege): a READ of a registration granting
// only REMOTE_WRITE fails REM_ACCESS_ERR.
func testFRAccessWriteOnly(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, transport.AccessLocalWrite|transport.AccessRemoteWrite)
	x.writeOK(t, 2, k, raddr, 0, 100, 3)
	x.a.armSentinel(t, x.rbuf, 0)
	wc, got := x.bRead(t, 3, k, raddr, 100)
	checkWC(t, wc, 3, x.b.qp, transport.StatusRemAccessErr)
	checkBytes(t, "READ sink after the refused READ", got, make([]byte, 100))
	x.a.expectErrState(t, "responder after a READ of a write-only registration")
}

// An access running past the registered length fails and changes nothing,
// not even the bytes inside the registration.
func testFROutOfBounds(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	if m.isMW() && x.quirk.WindowBoundsUnchecked {
		// Device bug (rxe): only the bounds of the MR under the window
		// are checked, so the WRITE lands in the MR beyond the window.
		// Consumers must not rely on window bounds on such a device;
		// the MR's bounds still hold.
		x.writeOK(t, 2, k, raddr+4090, 4090, 16, 0x0b)
		t.Logf("Quirks.WindowBoundsUnchecked: a WRITE across the end of the window landed in the MR under it")
		x.writeFails(t, 3, k, x.f.addr(frArenaLen-4), 16, "WRITE across the end of the MR under the window")
		return
	}
	x.writeFails(t, 2, k, raddr+4090, 16, "WRITE across the end of the registration")
}

// Failed registration (docs/registration.md#failed-registration): REG on a
// VALID object fails with the local-op error even though it is unsignaled,
// and the SEND chained behind it flushes, so the peer never receives it
// (docs/verbs.md#object-states, docs/verbs.md#completions,
// docs/verbs.md#advertising-a-key).
func testFRRegOnValid(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k1 := x.f.key().Bump()
	x.reg(t, 1, k1, 0, 4096, frAcc)
	rb := newBuf(t, p, x.b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, x.b.qp, recvWR(77, rb.sge(0, 64)))
	msg := newBuf(t, p, x.a.pd, transport.PageSize, 0)
	postSend(t, x.a.qp,
		x.f.regWR(t, 2, k1.Bump(), 4096, 4096, frAcc, 0), // unsignaled
		transport.SendWR{ID: 3, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{msg.sge(0, 16)}},
	)
	wcs := waitWC(t, x.a.scq, 2, Timeout)
	checkWC(t, wcs[0], 2, x.a.qp, x.localErr()...)
	checkWC(t, wcs[1], 3, x.a.qp, transport.StatusWRFlushErr)
	if st := x.a.qp.State(); st != transport.QPErr {
		t.Errorf("QP after a failed %v is %v, want ERR", m.name, st)
	}
	x.b.expectNoRecv(t, 77, "the SEND chained behind the failed registration")
}

// expectNoRecv moves s to ERR and checks that the receive id flushes rather
// than having received anything (the peer QP is already in ERR, so nothing
// can still arrive).
func (s *side) expectNoRecv(t *testing.T, id uint64, what string) {
	t.Helper()
	if err := s.qp.Modify(transport.QPErr); err != nil {
		t.Fatalf("Modify(ERR): %v", err)
	}
	wc := waitWC(t, s.rcq, 1, Timeout)[0]
	if wc.Status == transport.StatusSuccess {
		t.Errorf("%s reached the peer: %s", what, wc.String())
		return
	}
	checkWC(t, wc, id, s.qp, transport.StatusWRFlushErr)
}

// REG under a key whose index is not the object's fails
// (docs/verbs.md#who-checks-what "REG_MR key").
func testFRRegWrongIndex(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key()
	bad := transport.MakeKey(k.Index()^0x800000, k.Variant()+1)
	postSend(t, x.a.qp, x.f.regWR(t, 1, bad, 0, 4096, frAcc, 0), localInvWR(2, bad, transport.FlagSignaled))
	wcs := waitWC(t, x.a.scq, 2, Timeout)
	checkWC(t, wcs[0], 1, x.a.qp, x.localErr()...)
	checkWC(t, wcs[1], 2, x.a.qp, transport.StatusWRFlushErr)
}

// REG of an object of another PD than the QP's fails
// (docs/verbs.md#who-checks-what; C10-72 for windows).
func testFRRegOtherPD(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	pd2, err := x.a.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd2.Close() })
	f2 := newFastReg(t, m, x.a.attr, pd2, x.arena)
	wr := f2.regWR(t, 1, f2.key().Bump(), 0, 4096, frAcc, 0)
	postSend(t, x.a.qp, wr, localInvWR(2, f2.key().Bump(), transport.FlagSignaled))
	wcs := waitWC(t, x.a.scq, 2, Timeout)
	checkWC(t, wcs[0], 1, x.a.qp, x.localErr()...)
	checkWC(t, wcs[1], 2, x.a.qp, transport.StatusWRFlushErr)
}

// LOCAL_INV with the device key makes the object FREE: later remote access
// with that key fails.
func testFRLocalInv(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	x.writeOK(t, 2, k, raddr, 0, 256, 4)
	x.linv(t, 3, k)
	x.writeFails(t, 4, k, raddr, 64, "WRITE through an invalidated key")
}

// Wrong-key invalidation (docs/registration.md#wrong-key-invalidation):
// LOCAL_INV naming the wrong 8-bit key fails with the local-op error (strict,
// rxe) unless the device matches on the index only (siw, assumed mlx4), where
// it invalidates (docs/verbs.md#who-checks-what,
// docs/verbs.md#device-differences).
func testFRLocalInvWrongKey(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	// The wrong-key LINV is unsignaled: an error must complete anyway. The
	// signaled LINV of the right key behind it shows where things stand.
	postSend(t, x.a.qp, localInvWR(2, k.Bump(), 0), localInvWR(3, k, transport.FlagSignaled))
	wc := waitWC(t, x.a.scq, 1, Timeout)[0]
	if !x.quirk.InvalidateIndexOnly {
		checkWC(t, wc, 2, x.a.qp, x.localErr()...)
		checkWC(t, waitWC(t, x.a.scq, 1, Timeout)[0], 3, x.a.qp, transport.StatusWRFlushErr)
		if st := x.a.qp.State(); st != transport.QPErr {
			t.Errorf("QP after LOCAL_INV with the wrong key is %v, want ERR", st)
		}
		return
	}
	// Index-only devices: the wrong-variant LINV succeeded silently and
	// invalidated, so the second LINV met a FREE object.
	t.Logf("device matches LOCAL_INV on the index only: the wrong-variant LOCAL_INV invalidates")
	if !x.quirk.InvalidateFreeOK {
		checkWC(t, wc, 3, x.a.qp, x.localErr()...)
		return
	}
	checkOK(t, wc, 3, x.a.qp, transport.WCLocalInv)
	x.writeFails(t, 4, k, raddr, 64, "WRITE after an index-only LOCAL_INV")
}

// LOCAL_INV of an object that was never registered (FREE) fails unless
// Quirks.InvalidateFreeOK (docs/verbs.md#object-states,
// docs/verbs.md#device-differences).
func testFRLocalInvNeverRegistered(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	x.expectLocalInvOnFree(t, 1, x.f.key())
}

// LOCAL_INV of an object already invalidated: same rule.
func testFRLocalInvTwice(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k := x.f.key().Bump()
	x.reg(t, 1, k, 0, 4096, frAcc)
	x.linv(t, 2, k)
	x.expectLocalInvOnFree(t, 3, k)
	if x.quirk.InvalidateFreeOK {
		// Still FREE: registration under the next key works.
		k = k.Bump()
		raddr := x.reg(t, 4, k, 0, 4096, frAcc)
		x.writeOK(t, 5, k, raddr, 0, 64, 5)
	}
}

func (x *frFixture) expectLocalInvOnFree(t *testing.T, id uint64, k transport.Key) {
	t.Helper()
	wc := x.a.do(t, localInvWR(id, k, 0))
	if x.quirk.InvalidateFreeOK {
		checkOK(t, wc, id, x.a.qp, transport.WCLocalInv)
		return
	}
	checkWC(t, wc, id, x.a.qp, x.localErr()...)
	if st := x.a.qp.State(); st != transport.QPErr {
		t.Errorf("QP after a failed LOCAL_INV is %v, want ERR", st)
	}
}

// Staged vs device key (docs/verbs.md#keys,
// docs/verbs.md#invalidate-then-register): a Map and a key bump that are not
// followed by an executed REG change nothing the peer can reach: the old key
// still works on the old pages, the new key fails.
func testFRStagedKeyInvisible(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	k1 := x.f.key().Bump()
	raddr := x.reg(t, 1, k1, 0, 4096, frAcc)
	k2 := k1.Bump()
	if x.f.frmr != nil {
		// Stage a different page list at a different iova; never post it.
		if err := x.f.frmr.Map(x.arena, 8192, 4096, frmrIOVABase+8192); err != nil {
			t.Fatalf("Map: %v", err)
		}
	}
	x.writeOK(t, 2, k1, raddr, 0, 512, 6)
	x.writeFails(t, 3, k2, raddr, 64, "WRITE through a staged key no REG has put in force")
}

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
	x.a.armSentinel(t, x.rbuf, 0)
	wc, got := x.bRead(t, 6, k1, old, 64)
	checkWC(t, wc, 6, x.b.qp, transport.StatusRemAccessErr)
	checkBytes(t, "sink of the stray READ", got, make([]byte, 64))
	x.a.expectErrState(t, "responder of a stray READ with the old rkey")
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
		checkWC(t, wc, 4, pr2.a.qp, transport.StatusMWBindErr)
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
		checkWC(t, wc, 13, pr2.a.qp, transport.StatusMWBindErr)
		return
	}
	if checkOK(t, wc, 13, pr2.a.qp, x.m.wcOpcode()) {
		pr2.b.doOK(t, writeWR(14, local.sge(0, 64), x.f.addr(4096), k), transport.WCRDMAWrite)
	}
}

// SEND_WITH_INV with the right key: the receiver's completion says
// WCWithInv and names the key, and the registration is gone
// (docs/verbs.md#object-states, docs/verbs.md#remote-invalidation).
func testFRSendWithInv(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	needCaps(t, x.a.attr, transport.CapSendWithInv)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	x.writeOK(t, 2, k, raddr, 0, 100, 11)
	postRecv(t, x.a.qp, recvWR(3, x.rbuf.sge(0, 256)))
	fill(x.local.bytes(0, 20), 12)
	x.b.doOK(t, transport.SendWR{ID: 4, Opcode: transport.OpSendWithInv, InvalidateKey: k, SGL: []transport.SGE{x.local.sge(0, 20)}}, transport.WCSend)
	wc := waitWC(t, x.a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 3, x.a.qp, transport.WCRecv) {
		if wc.Flags&transport.WCWithInv == 0 {
			t.Errorf("receive of SEND_WITH_INV without WCWithInv: %s", wc.String())
		}
		if wc.InvalidatedKey != k {
			t.Errorf("InvalidatedKey %v, want %v", wc.InvalidatedKey, k)
		}
		if wc.ByteLen != 20 {
			t.Errorf("byte_len %d, want 20", wc.ByteLen)
		}
		checkBytes(t, "SEND_WITH_INV payload", x.rbuf.bytes(0, 20), x.local.bytes(0, 20))
	}
	x.writeFails(t, 5, k, raddr, 64, "WRITE through a remotely invalidated key")
}

// Bogus remote invalidation (docs/registration.md#bogus-remote-invalidation):
// SEND_WITH_INV naming the wrong 8-bit key: the receive fails REM_INV_REQ_ERR
// and the receiver's QP goes to ERR (strict, rxe), unless the device matches
// on the index only, where it invalidates.
func testFRSendWithInvWrongVariant(t *testing.T, p transport.Provider, m mechanism) {
	x := newFRFixture(t, p, m)
	needCaps(t, x.a.attr, transport.CapSendWithInv)
	k := x.f.key().Bump()
	raddr := x.reg(t, 1, k, 0, 4096, frAcc)
	postRecv(t, x.a.qp, recvWR(3, x.rbuf.sge(0, 256)))
	swc := x.b.do(t, transport.SendWR{ID: 4, Opcode: transport.OpSendWithInv, InvalidateKey: k.Bump(), SGL: []transport.SGE{x.local.sge(0, 8)}})
	t.Logf("sender's completion: %s", swc.String())
	wc := waitWC(t, x.a.rcq, 1, Timeout)[0]
	if x.quirk.InvalidateIndexOnly {
		if checkOK(t, wc, 3, x.a.qp, transport.WCRecv) {
			if wc.Flags&transport.WCWithInv == 0 || wc.InvalidatedKey.Index() != k.Index() {
				t.Errorf("index-only device: %s, want WCWithInv naming index %#x", wc.String(), k.Index())
			}
		}
		if swc.Status == transport.StatusSuccess {
			x.writeFails(t, 5, k, raddr, 64, "WRITE after an index-only remote invalidation")
		}
		return
	}
	checkWC(t, wc, 3, x.a.qp, transport.StatusRemInvReqErr)
	if st := x.a.qp.State(); st != transport.QPErr {
		t.Errorf("receiver of a bad SEND_WITH_INV in %v, want ERR", st)
	}
}

// Bogus remote invalidation (docs/registration.md#bogus-remote-invalidation)
// with a key no fast registration owns (a regular MR's): always
// REM_INV_REQ_ERR at the receiver, whose QP goes to ERR.
func testSendWithInvRegularMR(t *testing.T, p transport.Provider) {
	needCaps(t, deviceAttr(t, p), transport.CapSendWithInv)
	pr := connectPair(t, p, pairConfig{})
	mr := newBuf(t, p, pr.a.pd, transport.PageSize, accRW)
	src := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	postRecv(t, pr.a.qp, recvWR(1, mr.sge(0, 256)))
	pr.a.armSentinel(t, mr, 1024)
	swc := pr.b.do(t, transport.SendWR{ID: 2, Opcode: transport.OpSendWithInv, InvalidateKey: mr.mr.RKey(), SGL: []transport.SGE{src.sge(0, 8)}})
	t.Logf("sender's completion: %s", swc.String())
	checkWC(t, waitWC(t, pr.a.rcq, 1, Timeout)[0], 1, pr.a.qp, transport.StatusRemInvReqErr)
	pr.a.expectErrState(t, "receiver of SEND_WITH_INV naming a regular MR")
	// The regular MR is untouched: a new connection can still write it.
	pr2 := connectPair(t, p, pairConfig{pdA: pr.a.pd})
	src2 := newBuf(t, p, pr2.b.pd, transport.PageSize, 0)
	pr2.b.doOK(t, writeWR(3, src2.sge(0, 8), mr.addr(0), mr.mr.RKey()), transport.WCRDMAWrite)
}

// Read then invalidate (docs/registration.md#read-then-invalidate): an RDMA
// READ into a fast-registered MR followed by a LOCAL_INV of it with FENCE
// (the local-invalidate fence) completes both: the LINV waits for the READ's
// data (docs/verbs.md#send-queue-ordering-and-fences). FRMR only: a window
// cannot be a local sink.
func testFRFencedLocalInvAfterRead(t *testing.T, p transport.Provider, m mechanism) {
	if m.isMW() {
		t.Skip("a memory window is not addressable by local SGEs")
	}
	x := newFRFixture(t, p, m)
	src := newBuf(t, p, x.b.pd, frArenaLen, transport.AccessRemoteRead)
	fill(src.a.Bytes(), 13)
	for round := range 4 {
		k := x.f.key()
		for range round + 1 {
			k = k.Bump()
		}
		x.reg(t, uint64(10*round), k, 0, frArenaLen, frAcc)
		postSend(t, x.a.qp,
			transport.SendWR{ID: uint64(10*round + 1), Opcode: transport.OpRDMARead,
				SGL: []transport.SGE{{Addr: x.f.addr(0), Length: frArenaLen, LKey: k}}, RemoteAddr: src.addr(0), RKey: src.mr.RKey()},
			localInvWR(uint64(10*round+2), k, transport.FlagFence|transport.FlagSignaled),
		)
		wcs := waitWC(t, x.a.scq, 1, Timeout)
		checkOK(t, wcs[0], uint64(10*round+2), x.a.qp, transport.WCLocalInv)
		checkBytes(t, "READ data placed through the FRMR's lkey", x.arena.Bytes(), src.a.Bytes())
		fill(src.a.Bytes(), uint32(14+round))
	}
}

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
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
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
