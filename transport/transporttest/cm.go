package transporttest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("CM/PrivateData", testCMPrivateData)
	register("CM/PrivateDataTooLong", testCMPrivateDataTooLong)
	register("CM/Reject", testCMReject)
	register("CM/Disconnect", testCMDisconnect)
	register("CM/ListenerClose", testCMListenerClose)
	register("CM/AcceptDeadline", testCMAcceptDeadline)
	register("CM/ConnectionsIndependent", testCMIndependent)
	register("CM/ProviderClose", testCMProviderClose)
}

// samePrivateData: what arrived starts with what was sent and is zero after
// it (IB CM pads private data to its field size).
func samePrivateData(t *testing.T, what string, got, sent []byte) {
	t.Helper()
	if !bytes.HasPrefix(got, sent) {
		t.Errorf("%s: got %d bytes %x, sent %d bytes %x", what, len(got), got, len(sent), sent)
		return
	}
	for _, b := range got[len(sent):] {
		if b != 0 {
			t.Errorf("%s: got %d bytes, sent %d, and the extra bytes are not zero padding", what, len(got), len(sent))
			return
		}
	}
}

func testCMPrivateData(t *testing.T, p transport.Provider) {
	req := pattern(transport.MaxConnectPrivateData, 30)
	rep := pattern(transport.MaxAcceptPrivateData, 31)
	pr := connectPair(t, p, pairConfig{connectData: req, acceptData: rep})
	samePrivateData(t, "passive side's request private data", pr.b.peerData, req)
	samePrivateData(t, "active side's accept private data", pr.a.peerData, rep)
	samePrivateData(t, "passive Conn.PrivateData", pr.b.conn.PrivateData(), req)
	for _, s := range []*side{pr.a, pr.b} {
		if s.conn.QP() != s.qp {
			t.Errorf("%s: Conn.QP() is not the QP connected", s.name)
		}
		if s.conn.LocalAddr() == "" || s.conn.RemoteAddr() == "" {
			t.Errorf("%s: empty address: local %q remote %q", s.name, s.conn.LocalAddr(), s.conn.RemoteAddr())
		}
		if s.conn.Err() != nil {
			t.Errorf("%s: Err() = %v on a live connection", s.name, s.conn.Err())
		}
		select {
		case <-s.conn.Done():
			t.Errorf("%s: Done closed on a live connection", s.name)
		default:
		}
	}
	// Small data, too.
	pr2 := connectPair(t, p, pairConfig{connectData: []byte("hi"), acceptData: []byte("ok")})
	samePrivateData(t, "short request data", pr2.b.peerData, []byte("hi"))
	samePrivateData(t, "short accept data", pr2.a.peerData, []byte("ok"))
}

// listen opens a listener on a fresh address, with a context for the
// test bounded by Timeout; the test's cleanup closes the listener, then
// ends the context.
func listen(t *testing.T, p transport.Provider) (context.Context, transport.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return ctx, l
}

// answerOne accepts one connection request on l, in a goroutine, and
// answers it with answer; the channel gets Accept's error or answer's.
func answerOne(ctx context.Context, l transport.Listener, answer func(transport.ConnRequest) error) <-chan error {
	errc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			err = answer(req)
		}
		errc <- err
	}()
	return errc
}

// resolveSide resolves addr and builds the active side "A" on the
// endpoint's device. The test's cleanup closes the side and then, when
// closeEP is set, the endpoint.
func resolveSide(ctx context.Context, t *testing.T, p transport.Provider, addr string, closeEP bool) (transport.Endpoint, *side) {
	t.Helper()
	ep, err := p.Resolve(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if closeEP {
		t.Cleanup(func() { ep.Close() })
	}
	a, err := newSide("A", ep.Device(), nil, pairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	return ep, a
}

// Private data over the RDMA-CM limits fails with ErrInvalidArgument
// (cm.go); a request then rejected with data gives a *RejectError carrying
// it.
func testCMPrivateDataTooLong(t *testing.T, p transport.Provider) {
	ctx, l := listen(t, p)

	ep, a := resolveSide(ctx, t, p, l.Addr(), false)
	if _, err := ep.Connect(ctx, a.qp, make([]byte, transport.MaxConnectPrivateData+1)); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("Connect with %d bytes of private data: %v, want ErrInvalidArgument", transport.MaxConnectPrivateData+1, err)
	}
	ep.Close()

	rejData := pattern(transport.MaxRejectPrivateData, 32)
	errc := answerOne(ctx, l, func(req transport.ConnRequest) error {
		b, err := newSide("B", req.Device(), nil, pairConfig{})
		if err != nil {
			req.Reject(nil)
			return err
		}
		defer b.close()
		var errs []error
		if _, err := req.Accept(ctx, b.qp, make([]byte, transport.MaxAcceptPrivateData+1)); !errors.Is(err, transport.ErrInvalidArgument) {
			errs = append(errs, errors.New("Accept with too much private data: "+errString(err)+", want ErrInvalidArgument"))
		}
		if err := req.Reject(make([]byte, transport.MaxRejectPrivateData+1)); !errors.Is(err, transport.ErrInvalidArgument) {
			errs = append(errs, errors.New("Reject with too much private data: "+errString(err)+", want ErrInvalidArgument"))
		}
		if err := req.Reject(rejData); err != nil {
			errs = append(errs, errors.New("Reject: "+err.Error()))
		}
		return errors.Join(errs...)
	})
	ep2, a2 := resolveSide(ctx, t, p, l.Addr(), true)
	_, err := ep2.Connect(ctx, a2.qp, pattern(transport.MaxConnectPrivateData, 33))
	var rej *transport.RejectError
	if !errors.As(err, &rej) {
		t.Errorf("Connect to a rejecting listener: %v, want *RejectError", err)
	} else {
		samePrivateData(t, "reject private data", rej.PrivateData, rejData)
	}
	if err := <-errc; err != nil {
		t.Error(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func testCMReject(t *testing.T, p transport.Provider) {
	ctx, l := listen(t, p)
	errc := answerOne(ctx, l, func(req transport.ConnRequest) error {
		if !bytes.HasPrefix(req.PrivateData(), []byte("login")) {
			req.Reject(nil)
			return errors.New("request private data " + string(req.PrivateData()))
		}
		return req.Reject([]byte("go away"))
	})
	ep, a := resolveSide(ctx, t, p, l.Addr(), true)
	_, err := ep.Connect(ctx, a.qp, []byte("login"))
	var rej *transport.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("Connect: %v, want *RejectError", err)
	}
	if !errors.Is(err, transport.ErrRejected) {
		t.Errorf("Connect: %v does not wrap ErrRejected", err)
	}
	samePrivateData(t, "reject private data", rej.PrivateData, []byte("go away"))
	if err := <-errc; err != nil {
		t.Errorf("passive side: %v", err)
	}
}

// Disconnect: the local QP goes to ERR and flushes; the peer's Done closes,
// its Err wraps ErrDisconnected, and its QP flushes its posted receives.
func testCMDisconnect(t *testing.T, p transport.Provider) {
	pr := connectPair(t, p, pairConfig{})
	a, b := pr.a, pr.b
	ab := newBuf(t, p, a.pd, transport.PageSize, transport.AccessLocalWrite)
	bb := newBuf(t, p, b.pd, transport.PageSize, transport.AccessLocalWrite)
	postRecv(t, a.qp, recvWR(1, ab.sge(0, 64)), recvWR(2, ab.sge(64, 64)))
	postRecv(t, b.qp, recvWR(3, bb.sge(0, 64)))
	if err := a.conn.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	wcs := waitWC(t, a.rcq, 2, Timeout)
	checkWC(t, wcs[0], 1, a.qp, transport.StatusWRFlushErr)
	checkWC(t, wcs[1], 2, a.qp, transport.StatusWRFlushErr)
	if st := a.qp.State(); st != transport.QPErr {
		t.Errorf("QP after Disconnect in %v, want ERR", st)
	}
	if !waitClosed(b.conn.Done(), Timeout) {
		t.Fatalf("peer's Conn.Done not closed %v after Disconnect", Timeout)
	}
	if err := b.conn.Err(); !errors.Is(err, transport.ErrDisconnected) {
		t.Errorf("peer's Conn.Err() = %v, want ErrDisconnected", err)
	}
	checkWC(t, waitWC(t, b.rcq, 1, Timeout)[0], 3, b.qp, transport.StatusWRFlushErr)
	if !waitClosed(a.conn.Done(), Timeout) {
		t.Errorf("Conn.Done of the side that disconnected not closed")
	}
	if err := a.conn.Err(); !errors.Is(err, transport.ErrDisconnected) {
		t.Errorf("Conn.Err() after Disconnect = %v, want ErrDisconnected", err)
	}
}

// A closed listener stops accepting; connecting to it is refused.
func testCMListenerClose(t *testing.T, p transport.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		errc <- err
	}()
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Accept on a closed listener returned a request")
		} else if !errors.Is(err, transport.ErrClosed) {
			t.Logf("note: Accept on a closed listener: %v (not ErrClosed)", err)
		}
	case <-time.After(Timeout):
		t.Fatal("Accept did not return after Close")
	}
	ep, err := p.Resolve(ctx, addr)
	if err != nil {
		return // refusing to resolve is fine too
	}
	defer ep.Close()
	a, err := newSide("A", ep.Device(), nil, pairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	conn, err := ep.Connect(ctx, a.qp, nil)
	if err == nil {
		conn.Disconnect()
		t.Fatal("Connect to a closed listener succeeded")
	}
	// Refused, not a timeout or a generic failure: multipath initiators
	// fail over at once on it (transport.ErrRefused).
	if !errors.Is(err, transport.ErrRefused) {
		t.Errorf("Connect to a closed listener: %v, want ErrRefused", err)
	}
}

func testCMAcceptDeadline(t *testing.T, p transport.Provider) {
	l, err := p.Listen(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accept past its deadline: %v, want context.DeadlineExceeded", err)
	}
}

// Two connections on one provider do not see each other's traffic, and
// Disconnect of one leaves the other up.
func testCMIndependent(t *testing.T, p transport.Provider) {
	p1 := connectPair(t, p, pairConfig{})
	p2 := connectPair(t, p, pairConfig{})
	r1 := newBuf(t, p, p1.a.pd, transport.PageSize, transport.AccessLocalWrite)
	r2 := newBuf(t, p, p2.a.pd, transport.PageSize, transport.AccessLocalWrite)
	s1 := newBuf(t, p, p1.b.pd, transport.PageSize, 0)
	s2 := newBuf(t, p, p2.b.pd, transport.PageSize, 0)
	fill(s1.bytes(0, 32), 40)
	fill(s2.bytes(0, 32), 41)
	postRecv(t, p1.a.qp, recvWR(1, r1.sge(0, 64)))
	postRecv(t, p2.a.qp, recvWR(2, r2.sge(0, 64)))
	p2.b.doOK(t, sendWR(3, s2.sge(0, 32)), transport.WCSend)
	p1.b.doOK(t, sendWR(4, s1.sge(0, 32)), transport.WCSend)
	checkOK(t, waitWC(t, p1.a.rcq, 1, Timeout)[0], 1, p1.a.qp, transport.WCRecv)
	checkOK(t, waitWC(t, p2.a.rcq, 1, Timeout)[0], 2, p2.a.qp, transport.WCRecv)
	checkBytes(t, "connection 1", r1.bytes(0, 32), s1.bytes(0, 32))
	checkBytes(t, "connection 2", r2.bytes(0, 32), s2.bytes(0, 32))
	if err := p1.a.conn.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if !waitClosed(p1.b.conn.Done(), Timeout) {
		t.Fatal("peer of the disconnected connection did not see Done")
	}
	postRecv(t, p2.a.qp, recvWR(5, r2.sge(0, 64)))
	p2.b.doOK(t, sendWR(6, s2.sge(0, 32)), transport.WCSend)
	checkOK(t, waitWC(t, p2.a.rcq, 1, Timeout)[0], 5, p2.a.qp, transport.WCRecv)
	select {
	case <-p2.a.conn.Done():
		t.Error("the other connection ended too")
	default:
	}
}

// testCMProviderClose: the provider is closed while a Connect waits for
// its answer (the listener holds the request and never answers it). The
// Connect returns an error, and so do the held request's Accept and
// Reject afterwards; the process goes on. The ibverbs provider's Close
// destroys every rdma_cm id; its Connect, its wait ended, went on to
// rdma_disconnect an id freed meanwhile, and the process died of a
// SIGSEGV (an initiator reconnecting as its provider closed, in the VM).
func testCMProviderClose(t *testing.T, p transport.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ep, err := p.Resolve(ctx, l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	a, err := newSide("A", ep.Device(), nil, pairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	connected := make(chan error, 1)
	go func() {
		c, err := ep.Connect(ctx, a.qp, nil)
		if err == nil {
			c.Disconnect()
		}
		connected <- err
	}()
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newSide("B", req.Device(), nil, pairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if err := p.Close(); err != nil {
		t.Logf("note: Close: %v", err)
	}
	select {
	case err := <-connected:
		if err == nil {
			t.Error("a Connect the provider's Close interrupted succeeded")
		}
	case <-time.After(Timeout):
		t.Fatal("Connect did not return after the provider closed")
	}
	if c, err := req.Accept(ctx, b.qp, nil); err == nil {
		c.Disconnect()
		t.Error("Accept of a request held across the provider's Close succeeded")
	}
	if err := req.Reject(nil); err == nil {
		t.Error("Reject of a request held across the provider's Close succeeded")
	}
}
