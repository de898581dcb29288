package transporttest

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

const (
	accRW  = transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
	accRWr = transport.AccessLocalWrite | transport.AccessRemoteWrite // remote write only
)

func init() {
	for _, c := range localSGECases {
		register("MR/LocalSGE/"+c.name, func(t *testing.T, p transport.Provider) { testLocalSGE(t, p, c) })
	}
	register("MR/LocalSGE/ReadSinkWithoutLocalWrite", testReadSinkWithoutLocalWrite)
	for _, c := range remoteCases {
		register("MR/Remote/"+c.name, func(t *testing.T, p transport.Provider) { testRemote(t, p, c) })
	}
	register("Event/RemoteAccessErr", testRemoteAccessEvent)
	register("MR/RecvSGEBadKey", testRecvSGEBadKey)
	register("Arena/Shared", testArenaShared)
}

// localSGECase is a SEND whose first SGE is bad in one way. Strict requester
// checks (docs/verbs.md#who-checks-what): index exists, full key equal,
// PD(MR) = PD(QP), bounds; failure is LOC_PROT_ERR and the QP goes to ERR.
// badKey marks the cases whose lkey does not resolve to a usable MR, which
// complete with Quirks.LocalKeyErrStatus where it is set (rxe:
// LOC_QP_OP_ERR); bounds errors are LOC_PROT_ERR everywhere.
type localSGECase struct {
	name   string
	badKey bool
	sge    func(t *testing.T, pr *pair, good buf) transport.SGE
}

var localSGECases = []localSGECase{
	{"WrongKeyVariant", true, func(t *testing.T, pr *pair, good buf) transport.SGE {
		s := good.sge(0, 64)
		s.LKey = s.LKey.Bump()
		return s
	}},
	{"OtherPD", true, func(t *testing.T, pr *pair, good buf) transport.SGE {
		// An MR of the peer's PD (same device on a loopback provider).
		other := newBuf(t, pr.p, pr.b.pd, transport.PageSize, transport.AccessLocalWrite)
		return other.sge(0, 64)
	}},
	{"OutOfBounds", false, func(t *testing.T, pr *pair, good buf) transport.SGE {
		mr := regMR(t, pr.a.pd, good.a, 0, 100, transport.AccessLocalWrite)
		return transport.SGE{Addr: mr.Addr() + 90, Length: 20, LKey: mr.LKey()}
	}},
	{"BeforeStart", false, func(t *testing.T, pr *pair, good buf) transport.SGE {
		mr := regMR(t, pr.a.pd, good.a, 128, 100, transport.AccessLocalWrite)
		return transport.SGE{Addr: mr.Addr() - 1, Length: 8, LKey: mr.LKey()}
	}},
	{"Deregistered", true, func(t *testing.T, pr *pair, good buf) transport.SGE {
		mr, err := pr.a.pd.RegMR(good.a, 0, 256, transport.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		s := transport.SGE{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}
		if err := mr.Close(); err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// A bad local SGE completes LOC_PROT_ERR (or Quirks.LocalKeyErrStatus for an
// lkey that does not resolve), the QP goes to ERR, and every later WR on both
// queues flushes with WR_FLUSH_ERR, one completion each, in posting order,
// signaled or not (docs/verbs.md#who-checks-what, docs/verbs.md#completions,
// docs/verbs.md#errors-and-flushes).
func testLocalSGE(t *testing.T, p transport.Provider, c localSGECase) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	want := transport.StatusLocProtErr
	if s := a.attr.Quirks.LocalKeyErrStatus; c.badKey && s != transport.StatusSuccess {
		want = s
	}
	good := newBuf(t, p, a.pd, 2*transport.PageSize, transport.AccessLocalWrite)
	bb := newBuf(t, p, b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, b.qp, recvWR(1, bb.sge(0, 1024)))
	postRecv(t, a.qp, recvWR(100, good.sge(2048, 256)), recvWR(101, good.sge(3072, 256)))
	bad := c.sge(t, pr, good)
	postSend(t, a.qp,
		transport.SendWR{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{bad}},
		transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{good.sge(0, 16)}},
		transport.SendWR{ID: 3, Opcode: transport.OpSend, SGL: []transport.SGE{good.sge(0, 16)}}, // unsignaled: flushes still complete
	)
	wcs := waitWC(t, a.scq, 3, Timeout)
	checkWC(t, wcs[0], 1, a.qp, localFail(a.attr.Quirks, want)...)
	checkWC(t, wcs[1], 2, a.qp, transport.StatusWRFlushErr)
	checkWC(t, wcs[2], 3, a.qp, transport.StatusWRFlushErr)
	rwcs := waitWC(t, a.rcq, 2, Timeout)
	checkWC(t, rwcs[0], 100, a.qp, transport.StatusWRFlushErr)
	checkWC(t, rwcs[1], 101, a.qp, transport.StatusWRFlushErr)
	if st := a.qp.State(); st != transport.QPErr {
		t.Errorf("QP after a local protection error is %v, want ERR", st)
	}
	// Posts in ERR are accepted and flush (docs/verbs.md#qp-states).
	postSend(t, a.qp, transport.SendWR{ID: 4, Opcode: transport.OpSend, SGL: []transport.SGE{good.sge(0, 16)}})
	postRecv(t, a.qp, recvWR(102, good.sge(2048, 16)))
	checkWC(t, waitWC(t, a.scq, 1, Timeout)[0], 4, a.qp, transport.StatusWRFlushErr)
	checkWC(t, waitWC(t, a.rcq, 1, Timeout)[0], 102, a.qp, transport.StatusWRFlushErr)
	// None of A's SENDs reached B: flush B's receive to prove it.
	if err := b.qp.Modify(transport.QPErr); err != nil {
		t.Fatalf("Modify(ERR): %v", err)
	}
	checkWC(t, waitWC(t, b.rcq, 1, Timeout)[0], 1, b.qp, transport.StatusWRFlushErr)
}

// The sink of an RDMA READ needs LOCAL_WRITE (ibv_reg_mr(3)).
func testReadSinkWithoutLocalWrite(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	src := newBuf(t, p, b.pd, transport.PageSize, accRW)
	sink := newBuf(t, p, a.pd, transport.PageSize, 0) // local read only
	wc := a.do(t, readWR(7, sink.sge(0, 64), src.addr(0), src.mr.RKey()))
	checkWC(t, wc, 7, a.qp, transport.StatusLocProtErr, transport.StatusLocAccessErr)
	for i, x := range sink.bytes(0, 64) {
		if x != 0 {
			t.Fatalf("READ into a read-only MR changed byte %d", i)
		}
	}
}

// remoteCase is one RDMA READ or WRITE by B into an MR of A.
type remoteCase struct {
	name   string
	read   bool
	acc    transport.Access
	off, n int // offset in the MR and length of the access
	// key and addr derive the (rkey, va) B uses; nil means the MR's.
	key    func(t *testing.T, pr *pair, mr transport.MR) transport.Key
	wantOK bool
	// otherPD registers A's MR in a second PD of A's device.
	otherPD bool
}

var (
	bumpKey = func(t *testing.T, pr *pair, mr transport.MR) transport.Key { return mr.RKey().Bump() }
	deadKey = func(t *testing.T, pr *pair, mr transport.MR) transport.Key {
		// The key of an MR deregistered before the access.
		dead, err := pr.a.pd.RegMR(mr.Arena(), 0, 64, accRW)
		if err != nil {
			t.Fatal(err)
		}
		k := dead.RKey()
		if err := dead.Close(); err != nil {
			t.Fatal(err)
		}
		return k
	}
)

const mrOff = 256 // A's MR starts this far into its arena

var remoteCases = []remoteCase{
	{name: "WriteGood", acc: accRW, off: 100, n: 3000, wantOK: true},
	{name: "ReadGood", read: true, acc: accRW, off: 200, n: 3000, wantOK: true},
	{name: "WriteWholeMR", acc: accRWr, off: 0, n: 2 * 4096, wantOK: true},
	{name: "ReadOnlyRemoteRead", read: true, acc: transport.AccessRemoteRead, off: 0, n: 512, wantOK: true},
	{name: "WriteWrongKey", acc: accRW, off: 0, n: 64, key: bumpKey},
	{name: "ReadWrongKey", read: true, acc: accRW, off: 0, n: 64, key: bumpKey},
	{name: "WriteDeregisteredKey", acc: accRW, off: 0, n: 64, key: deadKey},
	{name: "ReadOfWriteOnly", read: true, acc: accRWr, off: 0, n: 64},
	{name: "WriteOfReadOnly", acc: transport.AccessRemoteRead, off: 0, n: 64},
	{name: "WriteLocalOnly", acc: transport.AccessLocalWrite, off: 0, n: 64},
	{name: "ReadLocalOnly", read: true, acc: transport.AccessLocalWrite, off: 0, n: 64},
	{name: "WriteOutOfBounds", acc: accRW, off: 2*4096 - 4, n: 8},
	{name: "ReadOutOfBounds", read: true, acc: accRW, off: 2*4096 - 4, n: 8},
	{name: "WriteBeforeStart", acc: accRW, off: -1, n: 8},
	{name: "WriteOtherPD", acc: accRW, off: 0, n: 64, otherPD: true},
}

// Remote access checks at the responder (docs/verbs.md#who-checks-what,
// docs/verbs.md#access-flags,
// docs/registration.md#least-privilege): a bad key, missing permission or
// bound fails REM_ACCESS_ERR at the requester, moves the responder QP to ERR,
// and changes no byte.
func testRemote(t *testing.T, p transport.Provider, c remoteCase) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	const mrLen = 2 * 4096
	arena := newArena(t, p, mrOff+mrLen+transport.PageSize)
	fill(arena.Bytes(), 1)
	pd := a.pd
	if c.otherPD {
		var err error
		if pd, err = a.dev.AllocPD(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pd.Close() })
	}
	mr := regMR(t, pd, arena, mrOff, mrLen, c.acc)
	rkey := mr.RKey()
	if c.key != nil {
		rkey = c.key(t, pr, mr)
	}
	raddr := uint64(int64(mr.Addr()) + int64(c.off))
	local := newBuf(t, p, b.pd, 4*transport.PageSize, transport.AccessLocalWrite)
	fill(local.bytes(0, c.n), 2)
	if !c.wantOK {
		sent := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
		a.armSentinel(t, sent, 0)
	}
	before := append([]byte(nil), arena.Bytes()...)
	localBefore := append([]byte(nil), local.bytes(0, c.n)...)

	var wr transport.SendWR
	if c.read {
		wr = readWR(9, local.sge(0, c.n), raddr, rkey)
	} else {
		wr = writeWR(9, local.sge(0, c.n), raddr, rkey)
	}
	wc := b.do(t, wr)
	if c.wantOK {
		op := transport.WCRDMAWrite
		if c.read {
			op = transport.WCRDMARead
		}
		if !checkOK(t, wc, 9, b.qp, op) {
			return
		}
		if c.read {
			checkBytes(t, "READ data", local.bytes(0, c.n), arena.Bytes()[mrOff+c.off:mrOff+c.off+c.n])
		} else {
			want := append([]byte(nil), before...)
			copy(want[mrOff+c.off:], localBefore)
			checkBytes(t, "A's arena after WRITE", arena.Bytes(), want)
		}
		return
	}
	checkWC(t, wc, 9, b.qp, transport.StatusRemAccessErr)
	checkBytes(t, "A's arena after the failed access", arena.Bytes(), before)
	if c.read {
		checkBytes(t, "B's READ sink after the failed READ", local.bytes(0, c.n), localBefore)
	}
	if st := b.qp.State(); st != transport.QPErr {
		t.Errorf("requester QP after REM_ACCESS_ERR is %v, want ERR", st)
	}
	a.expectErrState(t, "responder after a remote access violation")
}

// The responder of a remote access violation gets QP_ACCESS_ERR
// (docs/verbs.md#errors-and-flushes, docs/verbs.md#async-events) and goes to
// ERR. Under Quirks.NoQPErrorEvents (rxe) it goes to ERR without the event:
// the error shows only in completions.
func testRemoteAccessEvent(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	target := newBuf(t, p, a.pd, transport.PageSize, accRW)
	local := newBuf(t, p, b.pd, transport.PageSize, transport.AccessLocalWrite)
	a.armSentinel(t, target, 2048)
	wc := b.do(t, writeWR(1, local.sge(0, 8), target.addr(0), target.mr.RKey().Bump()))
	checkWC(t, wc, 1, b.qp, transport.StatusRemAccessErr)
	match := func(ev transport.AsyncEvent) bool {
		return ev.QPNum == a.qp.Num() && ev.Type == transport.EventQPAccessErr
	}
	if a.attr.Quirks.NoQPErrorEvents {
		a.expectErrState(t, "responder after a remote access violation")
		expectNoEvent(t, a.dev, "QP_ACCESS_ERR for the responder (Quirks.NoQPErrorEvents is set)", match)
		return
	}
	ev, ok := waitEvent(t, a.dev, Timeout, match)
	if !ok {
		t.Errorf("no QP_ACCESS_ERR event for responder QP %d within %v", a.qp.Num(), Timeout)
		return
	}
	t.Logf("event: %v qp=%d %q", ev.Type, ev.QPNum, ev.Reason)
	a.expectErrState(t, "responder after a remote access violation")
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

func testArenaShared(t *testing.T, p transport.Provider) {
	a, err := transport.NewArena(transport.PageSize, transport.ArenaOptions{Shared: true, Name: "transporttest"})
	if err != nil {
		t.Skipf("shared arenas unavailable here: %v", err)
	}
	if a.FD() < 0 {
		t.Errorf("shared arena FD = %d", a.FD())
	}
	a.Bytes()[0] = 1
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if a.FD() != -1 {
		t.Errorf("FD after Close = %d, want -1", a.FD())
	}
}
