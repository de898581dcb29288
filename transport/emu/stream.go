package emu

// The connection setup the stream wires (tcp, shm) share: the listener
// that reads each accepted socket's connect request and queues it, the
// request and its one answer, and the active side's dial; a streamWire
// supplies the messages and the link of each wire.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// cmTimeout bounds how long a passive side waits for a connect request's
// first frame, so a silent client cannot pin a goroutine, and how long a
// reject may take to write.
const cmTimeout = 10 * time.Second

// streamWire is what a stream wire does its own way in connection setup:
// the connect, accept and reject messages on its socket and the link it
// starts. Its implementations are empty structs (tcpWire, shmWire), named
// as the type parameter of streamListener, streamReq and dialStream.
type streamWire interface {
	// network is the socket type dialed: "tcp" or "unixpacket".
	network() string
	// readRequest reads the connect request on a socket just accepted
	// (the read deadline is set) and returns its private data and the
	// requester's READ credit offer (its view). It counts and logs a
	// malformed request; the caller closes the socket on any error.
	readRequest(p *Provider, nc net.Conn) ([]byte, transport.ReadCredit, error)
	// remote names the requester of a socket just accepted.
	remote(nc net.Conn) string
	// accept answers r with priv and r.credit and starts the link of q;
	// it closes the socket when it fails.
	accept(ctx context.Context, r *sockReq, q *qp, priv []byte) (transport.Conn, error)
	// writeReject answers a request with a reject carrying priv.
	writeReject(nc net.Conn, priv []byte) error
	// writeRequest sends the connect request with priv and the READ
	// credit offer.
	writeRequest(nc net.Conn, priv []byte, offer transport.ReadCredit) error
	// readAnswer reads the answer to a connect request to addr: an accept,
	// or a *transport.RejectError. Its errors are wrapped for the caller
	// of Connect; the caller closes the socket on any error.
	readAnswer(ctx context.Context, p *Provider, nc net.Conn, addr string) (streamAnswer, error)
	// release undoes what readAnswer took for an accept the caller
	// abandons.
	release(a streamAnswer)
	// start starts the link of q over nc after an accept.
	start(p *Provider, q *qp, nc net.Conn, a streamAnswer, addr string) (transport.Conn, error)
}

// streamAnswer is an accept as the active side read it.
type streamAnswer struct {
	priv   []byte               // the acceptor's private data
	credit transport.ReadCredit // the acceptor's READ credit, its view; then the requester's (agreedCredit)
	region []byte               // shm: the connection region, mapped
}

// streamListener is a stream wire's listener: its accept loop
// (acceptLoop) hands each socket to a handshake goroutine, which reads
// the connect request and queues it for Accept.
type streamListener[W streamWire] struct {
	p    *Provider
	ln   net.Listener
	addr string
	reqs chan *streamReq[W]
	done chan struct{}
	fail *listenFail
	once sync.Once
	wg   sync.WaitGroup
	hs   handshakes // connections still silent, which acceptLoop may shed
}

// serveStream starts accepting connection requests on ln; accept is ln
// itself, or a wrapper of it (tests inject accept errors), and addr the
// address Addr reports.
func serveStream[W streamWire](p *Provider, ln, accept net.Listener, addr string) (*streamListener[W], error) {
	l := &streamListener[W]{p: p, ln: ln, addr: addr, reqs: make(chan *streamReq[W], 64), done: make(chan struct{}), fail: newListenFail()}
	if err := p.own(l); err != nil {
		ln.Close()
		return nil, err
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		p.acceptLoop(accept, addr, l.done, l.fail, &l.hs, func(nc net.Conn) {
			l.wg.Add(1)
			go l.handshake(nc)
		})
	}()
	return l, nil
}

func (l *streamListener[W]) Addr() string { return l.addr }

// handshake reads the connect request of a new connection and queues it;
// a closing listener rejects it.
func (l *streamListener[W]) handshake(nc net.Conn) {
	defer l.wg.Done()
	waiting := l.hs.add(nc)
	defer l.hs.done(waiting)
	select {
	case <-l.done:
		// Closing, and past its shedAll, or it would have shed nc.
		nc.Close()
		return
	default:
	}
	var w W
	nc.SetReadDeadline(time.Now().Add(cmTimeout))
	priv, offer, err := w.readRequest(l.p, nc)
	if err != nil {
		nc.Close()
		return
	}
	nc.SetReadDeadline(time.Time{})
	if !l.hs.done(waiting) { // shed while its request came in
		return
	}
	r := &streamReq[W]{sockReq{p: l.p, nc: nc, priv: priv, credit: offeredCredit(offer), from: w.remote(nc), at: l.addr, hs: &l.hs}}
	select {
	case l.reqs <- r:
	case <-l.done:
		r.Reject(nil)
	}
}

func (l *streamListener[W]) Accept(ctx context.Context) (transport.ConnRequest, error) {
	return acceptFrom(ctx, l.reqs, l.done, l.fail, l.addr)
}

func (l *streamListener[W]) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.hs.shedAll()
		l.wg.Wait()
		rejectPending(l.reqs)
		l.p.disown(l)
	})
	return nil
}

// sockReq is a connection request a stream wire read from a socket.
type sockReq struct {
	p      *Provider
	nc     net.Conn
	priv   []byte               // the requester's private data
	credit transport.ReadCredit // what the connection gets (offeredCredit)
	from   string               // the requester's address
	at     string               // the listener's address
	hs     *handshakes          // the listener's silent connections, shed for room
	answerOnce
}

// streamReq is a stream wire's transport.ConnRequest.
type streamReq[W streamWire] struct{ sockReq }

func (r *streamReq[W]) Device() transport.Device { return r.p.dev }
func (r *streamReq[W]) PrivateData() []byte      { return r.priv }
func (r *streamReq[W]) RemoteAddr() string       { return r.from }

func (r *streamReq[W]) ReadCredit() transport.ReadCredit { return r.credit }

func (r *streamReq[W]) Accept(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	q, err := r.accepting(r.p.dev, x, priv)
	if err != nil {
		return nil, err
	}
	var w W
	return w.accept(ctx, &r.sockReq, q, priv)
}

func (r *streamReq[W]) Reject(priv []byte) error {
	if err := r.rejecting(priv); err != nil {
		return err
	}
	var w W
	r.nc.SetWriteDeadline(time.Now().Add(cmTimeout))
	err := w.writeReject(r.nc, priv)
	r.nc.Close()
	if err != nil {
		return fmt.Errorf("emu: reject: %w", err)
	}
	return nil
}

// dialStream connects q to the stream listener at addr: it sends the
// connect request, waits for the answer, both bounded by ctx, and starts
// the link on an accept.
func dialStream[W streamWire](ctx context.Context, p *Provider, addr string, q *qp, priv []byte, offer transport.ReadCredit) (transport.Conn, error) {
	var w W
	var d net.Dialer
	nc, err := d.DialContext(ctx, w.network(), addr)
	if err != nil {
		// Nothing listening: a TCP RST, or a unix path with no socket
		// (removed by a listener's Close) or one nobody accepts on (left
		// by a listener that was killed).
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrRefused, err)
		}
		return nil, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrNotFound, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if err := w.writeRequest(nc, priv, offer); err != nil {
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, err)
	}
	a, err := w.readAnswer(ctx, p, nc, addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	if !stop() {
		w.release(a)
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
	}
	nc.SetDeadline(time.Time{})
	a.credit = agreedCredit(offer, a.credit)
	return w.start(p, q, nc, a, addr)
}
