package transporttest

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("ReadCredit/Default", testReadCreditDefault)
	register("ReadCredit/Asymmetric", testReadCreditAsymmetric)
	register("ReadCredit/None", testReadCreditNone)
}

// Without an offer both sides get the same credit each way, at least one
// READ and at most MaxReadCredit, and each side's In is the other's Out.
func testReadCreditDefault(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a.conn.ReadCredit(), pr.b.conn.ReadCredit()
	if a.Out < 1 || a.Out > transport.MaxReadCredit || a.In < 1 || a.In > transport.MaxReadCredit {
		t.Errorf("active side's credit %+v, want 1..%d each way", a, transport.MaxReadCredit)
	}
	if a.Out != b.In || a.In != b.Out {
		t.Errorf("credits disagree: active %+v, passive %+v (each side's In is the other's Out)", a, b)
	}
	if pr.b.reqCredit != b {
		t.Errorf("the request offered %+v, the accepted connection has %+v", pr.b.reqCredit, b)
	}
}

// A requester that serves READs but asks for none (as the kernel's ib_srp
// does: it never reads from its target) leaves the acceptor its READ
// credit: the acceptor's view is the requester's swapped (the kernel's
// cm_format_req_event), and twice as many READs as the credit all
// complete, the later ones waiting for earlier responses. A provider that
// takes the figures the wrong way round leaves the acceptor no credit and
// its READs never complete (what made every ib_srp write through srpd
// hang on rxe).
func testReadCreditAsymmetric(t *testing.T, p transport.Provider) {
	const credit = 4
	offer := transport.ReadCredit{Out: 0, In: credit}
	pr := connectPair(t, p, pairConfig{offer: &offer})
	want := transport.ReadCredit{Out: credit, In: 0}
	if got := pr.b.reqCredit; got != want {
		t.Errorf("ConnRequest.ReadCredit() = %+v for an offer of %+v, want %+v", got, offer, want)
	}
	if got := pr.b.conn.ReadCredit(); got != want {
		t.Errorf("acceptor's Conn.ReadCredit() = %+v, want %+v", got, want)
	}
	if got := pr.a.conn.ReadCredit(); got != offer {
		t.Errorf("requester's Conn.ReadCredit() = %+v, want %+v", got, offer)
	}

	const n, size = 2 * credit, 4096
	src := newBuf(t, p, pr.a.pd, n*size, transport.AccessRemoteRead)
	dst := newBuf(t, p, pr.b.pd, n*size, transport.AccessLocalWrite)
	fill(src.bytes(0, n*size), 77)
	wrs := make([]transport.SendWR, n)
	for i := range wrs {
		wrs[i] = readWR(uint64(100+i), dst.sge(i*size, size), src.addr(i*size), src.mr.RKey())
		wrs[i].Flags |= transport.FlagSignaled
	}
	postSend(t, pr.b.qp, wrs...)
	wcs := waitWC(t, pr.b.scq, n, Timeout)
	for i, wc := range wcs {
		checkOK(t, wc, uint64(100+i), pr.b.qp, transport.WCRDMARead)
	}
	checkBytes(t, "data read", dst.bytes(0, n*size), src.bytes(0, n*size))
}

// With no READ credit a READ never executes and holds the send queue
// behind it (the kernel's rxe_requester waits for rd_atomic; IBA gives a
// requester no other way to issue it), but it does not wedge the QP: a
// SEND the other way still arrives, and a disconnect flushes the READ and
// the SEND queued behind it.
func testReadCreditNone(t *testing.T, p transport.Provider) {
	offer := transport.ReadCredit{Out: 0, In: 1}
	pr := connectPair(t, p, pairConfig{offer: &offer})
	if got := pr.a.conn.ReadCredit().Out; got != 0 {
		t.Fatalf("requester asked for no READ credit and got %d", got)
	}
	src := newBuf(t, p, pr.b.pd, transport.PageSize, transport.AccessRemoteRead)
	dst := newBuf(t, p, pr.a.pd, 2*transport.PageSize, transport.AccessLocalWrite)
	rd := readWR(1, dst.sge(0, 512), src.addr(0), src.mr.RKey())
	rd.Flags |= transport.FlagSignaled
	send := sendWR(2, dst.sge(transport.PageSize, 16))
	send.Flags |= transport.FlagSignaled
	landing := newBuf(t, p, pr.b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.b.qp, recvWR(3, landing.sge(0, 64)))
	postSend(t, pr.a.qp, rd, send)

	// The other direction works; after its round trip, nothing of A's
	// has completed and B has received nothing.
	rb := newBuf(t, p, pr.a.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, pr.a.qp, recvWR(4, rb.sge(0, 64)))
	sb := newBuf(t, p, pr.b.pd, transport.PageSize, 0)
	pr.b.doOK(t, sendWR(5, sb.sge(0, 32)), transport.WCSend)
	checkOK(t, waitWC(t, pr.a.rcq, 1, Timeout)[0], 4, pr.a.qp, transport.WCRecv)
	expectNoWC(t, pr.a.scq, "a READ without credit and the SEND behind it")
	expectNoWC(t, pr.b.rcq, "the SEND behind a READ without credit")

	if err := pr.a.conn.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	wcs := waitWC(t, pr.a.scq, 2, Timeout)
	checkWC(t, wcs[0], 1, pr.a.qp, transport.StatusWRFlushErr)
	checkWC(t, wcs[1], 2, pr.a.qp, transport.StatusWRFlushErr)
}
