package transporttest

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Send/Basic", testSendBasic)
	register("Send/ZeroLength", testSendZeroLength)
	register("Send/MultiSGE", testSendMultiSGE)
	register("Send/WithImm", testSendWithImm)
	register("Send/Inline", testSendInline)
	register("Send/SignalAll", testSendSignalAll)
	register("Send/RecvTooSmall", testRecvTooSmall)
	register("Send/RNRRetryExceeded", testRNR)
	register("Write/WithImm", testWriteWithImm)
	register("Order/ManySends", testManySends)
	register("Order/WriteThenSend", testWriteThenSend)
	register("Order/ReadAfterWrite", testReadAfterWrite)
	register("Send/InlineTooLong", testInlineTooLong)
	register("Order/FenceAfterRead", testFenceAfterRead)
	register("Write/Large", testLarge)
}

// SEND/RECV both ways: byte_len, data, opcodes, QP numbers.
func testSendBasic(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	for i, dir := range [][2]*side{{pr.b, pr.a}, {pr.a, pr.b}} {
		from, to := dir[0], dir[1]
		rb := newBuf(t, p, to.pd, 2*transport.PageSize, transport.AccessLocalWrite)
		sb := newBuf(t, p, from.pd, 2*transport.PageSize, 0)
		n := 1000 + i*3000
		fill(sb.bytes(0, n), uint32(10+i))
		postRecv(t, to.qp, recvWR(50, rb.sge(0, rb.a.Len())))
		from.doOK(t, sendWR(60, sb.sge(0, n)), transport.WCSend)
		wc := waitWC(t, to.rcq, 1, Timeout)[0]
		if checkOK(t, wc, 50, to.qp, transport.WCRecv) {
			if wc.ByteLen != uint32(n) {
				t.Errorf("%s->%s: recv byte_len %d, want %d", from.name, to.name, wc.ByteLen, n)
			}
			if wc.Flags&(transport.WCWithImm|transport.WCWithInv) != 0 {
				t.Errorf("%s->%s: plain SEND received with flags %v", from.name, to.name, wc.Flags)
			}
			checkBytes(t, "received data", rb.bytes(0, n), sb.bytes(0, n))
		}
	}
}

func testSendZeroLength(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 64)))
	pr.b.doOK(t, sendWR(2), transport.WCSend)
	wc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 1, pr.a.qp, transport.WCRecv) && wc.ByteLen != 0 {
		t.Errorf("zero-length SEND received with byte_len %d", wc.ByteLen)
	}
}

// Gather from three SGEs, scatter into two.
func testSendMultiSGE(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	if pr.a.attr.MaxSGE < 3 {
		t.Skipf("device MaxSGE %d < 3", pr.a.attr.MaxSGE)
	}
	sb := newBuf(t, p, pr.b.pd, 2*transport.PageSize, 0)
	rb := newBuf(t, p, pr.a.pd, 2*transport.PageSize, transport.AccessLocalWrite)
	fill(sb.a.Bytes(), 3)
	gather := []transport.SGE{sb.sge(10, 100), sb.sge(500, 1), sb.sge(4000, 2000)}
	var want []byte
	for _, s := range gather {
		want = append(want, sb.bytes(int(s.Addr-sb.a.Addr()), int(s.Length))...)
	}
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 1500), rb.sge(3000, 1000)))
	pr.b.doOK(t, sendWR(2, gather...), transport.WCSend)
	wc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
	if !checkOK(t, wc, 1, pr.a.qp, transport.WCRecv) {
		return
	}
	if wc.ByteLen != uint32(len(want)) {
		t.Errorf("byte_len %d, want %d", wc.ByteLen, len(want))
	}
	got := append(append([]byte(nil), rb.bytes(0, 1500)...), rb.bytes(3000, len(want)-1500)...)
	checkBytes(t, "scattered data", got, want)
}

func testSendWithImm(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	sb := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	fill(sb.a.Bytes(), 4)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 512)))
	pr.b.doOK(t, transport.SendWR{ID: 2, Opcode: transport.OpSendWithImm, Imm: 0xdeadbeef, SGL: []transport.SGE{sb.sge(0, 300)}}, transport.WCSend)
	wc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
	if !checkOK(t, wc, 1, pr.a.qp, transport.WCRecv) {
		return
	}
	if wc.Flags&transport.WCWithImm == 0 || wc.Imm != 0xdeadbeef {
		t.Errorf("SEND_WITH_IMM received with flags %v imm %#x, want WCWithImm and 0xdeadbeef", wc.Flags, wc.Imm)
	}
	if wc.ByteLen != 300 {
		t.Errorf("byte_len %d, want 300", wc.ByteLen)
	}
	checkBytes(t, "data", rb.bytes(0, 300), sb.bytes(0, 300))
}

// FlagInline copies the data at post time and needs no lkey.
func testSendInline(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	if pr.b.attr.MaxInline < 32 {
		t.Skipf("device MaxInline %d < 32", pr.b.attr.MaxInline)
	}
	src := newArena(t, p, transport.PageSize)
	fill(src.Bytes()[:32], 5)
	want := append([]byte(nil), src.Bytes()[:32]...)
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 64)))
	postSend(t, pr.b.qp, transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled | transport.FlagInline,
		SGL: []transport.SGE{{Addr: src.Addr(), Length: 32}}})
	fill(src.Bytes()[:32], 6) // reuse the buffer at once
	checkOK(t, waitWC(t, pr.b.scq, 1, Timeout)[0], 2, pr.b.qp, transport.WCSend)
	wc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 1, pr.a.qp, transport.WCRecv) {
		checkBytes(t, "inline data", rb.bytes(0, 32), want)
	}
}

// A QP created with SignalAll completes every send WR.
func testSendSignalAll(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{signalAll: true})
	sb := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	for i := range 3 {
		postRecv(t, pr.a.qp, recvWR(uint64(i), rb.sge(i*64, 64)))
	}
	postSend(t, pr.b.qp, sendWR(10, sb.sge(0, 8)), sendWR(11, sb.sge(0, 8)), sendWR(12, sb.sge(0, 8)))
	wcs := waitWC(t, pr.b.scq, 3, Timeout)
	for i, wc := range wcs {
		checkOK(t, wc, uint64(10+i), pr.b.qp, transport.WCSend)
	}
	waitWC(t, pr.a.rcq, 3, Timeout)
}

// A receive buffer too small for the SEND: LOC_LEN_ERR on the receiver,
// whose QP goes to ERR; the sender does not see success
// (docs/verbs.md#completion-statuses).
func testRecvTooSmall(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	sb := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.a.qp, recvWR(1, rb.sge(0, 100)))
	pr.a.armSentinel(t, rb, 1024)
	wc := pr.b.do(t, sendWR(2, sb.sge(0, 200)))
	if wc.ID != 2 || wc.QPNum != pr.b.qp.Num() {
		t.Errorf("sender completion %s: want ID 2 on QP %d", wc.String(), pr.b.qp.Num())
	}
	if wc.Status == transport.StatusSuccess {
		t.Errorf("sender of a SEND too large for the receive buffer got SUCCESS")
	} else {
		t.Logf("sender status %v", wc.Status)
	}
	want := transport.StatusLocLenErr
	if s := pr.a.attr.Quirks.RecvLenErrStatus; s != transport.StatusSuccess {
		want = s // rxe: the receive WQE counts as malformed, LOC_QP_OP_ERR
	}
	rwc := waitWC(t, pr.a.rcq, 1, Timeout)[0]
	checkWC(t, rwc, 1, pr.a.qp, want)
	pr.a.expectErrState(t, "receiver after "+want.String())
}

// No receive posted: RNR NAKs, then RNR_RETRY_EXC_ERR at the sender.
func testRNR(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	sb := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	wc := pr.b.do(t, sendWR(3, sb.sge(0, 16)))
	checkWC(t, wc, 3, pr.b.qp, transport.StatusRNRRetryExcErr)
	if st := pr.b.qp.State(); st != transport.QPErr {
		t.Errorf("sender after RNR_RETRY_EXC_ERR in %v, want ERR", st)
	}
}

// RDMA_WRITE_WITH_IMM places the data and consumes a receive, whose
// completion carries the immediate.
func testWriteWithImm(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	target := newBuf(t, p, a.pd, 2*transport.PageSize, accRW)
	rb := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	src := newBuf(t, p, b.pd, transport.PageSize, 0)
	fill(src.a.Bytes(), 7)
	postRecv(t, a.qp, recvWR(1, rb.sge(0, 64)), recvWR(2, rb.sge(64, 64)))
	b.doOK(t, transport.SendWR{ID: 3, Opcode: transport.OpRDMAWriteWithImm, Imm: 0x01020304,
		SGL: []transport.SGE{src.sge(0, 500)}, RemoteAddr: target.addr(1000), RKey: target.mr.RKey()}, transport.WCRDMAWrite)
	wc := waitWC(t, a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 1, a.qp, transport.WCRecvRDMAWithImm) {
		if wc.Flags&transport.WCWithImm == 0 || wc.Imm != 0x01020304 {
			t.Errorf("flags %v imm %#x, want WCWithImm and 0x01020304", wc.Flags, wc.Imm)
		}
		if wc.ByteLen != 500 {
			t.Errorf("byte_len %d, want 500 (the length written)", wc.ByteLen)
		}
	}
	checkBytes(t, "written data", target.bytes(1000, 500), src.bytes(0, 500))
	// The next SEND lands in the second receive: the first was consumed.
	fill(src.bytes(0, 8), 8)
	b.doOK(t, sendWR(4, src.sge(0, 8)), transport.WCSend)
	wc = waitWC(t, a.rcq, 1, Timeout)[0]
	if checkOK(t, wc, 2, a.qp, transport.WCRecv) {
		checkBytes(t, "SEND after WRITE_WITH_IMM", rb.bytes(64, 8), src.bytes(0, 8))
	}
}

// Many SENDs arrive in posting order with their own payloads; send
// completions come back in posting order.
func testManySends(t *testing.T, p transport.Provider) {
	const n = 48
	pr := connectPair(t, p, pairConfig{sendWR: 64, recvWR: 64})
	a, b := pr.a, pr.b
	sb := newBuf(t, p, b.pd, n*256, 0)
	rb := newBuf(t, p, a.pd, n*256, transport.AccessLocalWrite)
	recvs := make([]transport.RecvWR, n)
	for i := range recvs {
		recvs[i] = recvWR(uint64(1000+i), rb.sge(i*256, 256))
	}
	postRecv(t, a.qp, recvs...)
	var wrs []transport.SendWR
	var signaled []uint64
	for i := range n {
		size := 1 + (i*37)%256
		fill(sb.bytes(i*256, size), uint32(100+i))
		wr := sendWR(uint64(i), sb.sge(i*256, size))
		if i%4 == 3 || i == n-1 {
			wr.Flags = transport.FlagSignaled
			signaled = append(signaled, uint64(i))
		}
		wrs = append(wrs, wr)
	}
	for i := 0; i < n; i += 8 { // several posts of a chain each
		postSend(t, b.qp, wrs[i:min(i+8, n)]...)
	}
	swcs := waitWC(t, b.scq, len(signaled), Timeout)
	for i, wc := range swcs {
		checkOK(t, wc, signaled[i], b.qp, transport.WCSend)
	}
	rwcs := waitWC(t, a.rcq, n, Timeout)
	for i, wc := range rwcs {
		size := 1 + (i*37)%256
		if !checkOK(t, wc, uint64(1000+i), a.qp, transport.WCRecv) {
			continue
		}
		if wc.ByteLen != uint32(size) {
			t.Errorf("SEND %d: byte_len %d, want %d", i, wc.ByteLen, size)
		}
		checkBytes(t, "SEND payload", rb.bytes(i*256, size), sb.bytes(i*256, size))
	}
}

// RC ordering: WRITEs posted before a SEND are placed before the SEND's
// receive completes (the initiator's read path relies on it: the target
// WRITEs the data and then SENDs the response).
func testWriteThenSend(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	const rounds, size = 16, 3000
	target := newBuf(t, p, a.pd, rounds*4096, accRW)
	rb := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	src := newBuf(t, p, b.pd, rounds*4096, 0)
	for r := range rounds {
		fill(src.bytes(r*4096, size), uint32(200+r))
		binary.LittleEndian.PutUint32(src.bytes(r*4096+size, 4), uint32(r))
		postRecv(t, a.qp, recvWR(uint64(r), rb.sge(0, 64)))
		postSend(t, b.qp,
			writeWR(uint64(2*r), src.sge(r*4096, size/2), target.addr(r*4096), target.mr.RKey()),
			writeWR(uint64(2*r+1), src.sge(r*4096+size/2, size-size/2), target.addr(r*4096+size/2), target.mr.RKey()),
			transport.SendWR{ID: 1000 + uint64(r), Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{src.sge(r*4096+size, 4)}},
		)
		wc := waitWC(t, a.rcq, 1, Timeout)[0]
		// The data must be visible as soon as the receive completes.
		checkBytes(t, "WRITE data at the time the following SEND is received", target.bytes(r*4096, size), src.bytes(r*4096, size))
		if checkOK(t, wc, uint64(r), a.qp, transport.WCRecv) {
			if got := binary.LittleEndian.Uint32(rb.bytes(0, 4)); got != uint32(r) {
				t.Errorf("round %d: SEND carried %d", r, got)
			}
		}
		checkOK(t, waitWC(t, b.scq, 1, Timeout)[0], 1000+uint64(r), b.qp, transport.WCSend)
	}
}

// A READ after a WRITE to the same remote bytes on one QP returns the
// written data.
func testReadAfterWrite(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	target := newBuf(t, p, a.pd, 2*transport.PageSize, accRW)
	local := newBuf(t, p, b.pd, 2*transport.PageSize, transport.AccessLocalWrite)
	fill(target.a.Bytes(), 9)
	fill(local.bytes(0, 4096), 10)
	postSend(t, b.qp,
		writeWR(1, local.sge(0, 4096), target.addr(2048), target.mr.RKey()),
		transport.SendWR{ID: 2, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{local.sge(4096, 4096)}, RemoteAddr: target.addr(2048), RKey: target.mr.RKey()},
	)
	checkOK(t, waitWC(t, b.scq, 1, Timeout)[0], 2, b.qp, transport.WCRDMARead)
	checkBytes(t, "READ after WRITE", local.bytes(4096, 4096), local.bytes(0, 4096))
}

// Inline data beyond the QP's MaxInline is refused at post time.
func testInlineTooLong(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	max := min(64, pr.b.attr.MaxInline)
	if max <= 0 {
		t.Skip("device has no inline data")
	}
	src := newArena(t, p, transport.PageSize)
	n, err := pr.b.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagInline | transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: src.Addr(), Length: uint32(max + 1)}}}})
	if n != 0 || err == nil {
		t.Errorf("inline SEND of %d bytes on a QP with MaxInline %d: n=%d err=%v, want 0 and an error", max+1, max, n, err)
	} else if !errors.Is(err, transport.ErrInvalidArgument) {
		t.Logf("note: refused with %v (not ErrInvalidArgument)", err)
	}
}

// FENCE on a SEND waits for earlier RDMA READs (IBA 10.8.3.3 as cited in
// docs/verbs.md#send-queue-ordering-and-fences): a SEND gathering the READ's
// sink carries the data the READ fetched.
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
