package emu

import (
	"context"
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// conn is an established connection: the transport.Conn of one side.
type conn struct {
	q      *qp
	l      link
	priv   []byte
	local  string
	remote string
	done   chan struct{}

	mu  sync.Mutex
	err error
}

func newConn(q *qp, l link, priv []byte, local, remote string) *conn {
	return &conn{q: q, l: l, priv: append([]byte(nil), priv...), local: local, remote: remote, done: make(chan struct{})}
}

func (c *conn) QP() transport.QP      { return c.q }
func (c *conn) PrivateData() []byte   { return c.priv }
func (c *conn) LocalAddr() string     { return c.local }
func (c *conn) RemoteAddr() string    { return c.remote }
func (c *conn) Done() <-chan struct{} { return c.done }

func (c *conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends this side of the connection: the QP goes to ERR and flushes,
// as rdma_cm does when it handles a DREQ or a link failure. retryExc
// reports the oldest outstanding request as RETRY_EXC_ERR (the peer
// vanished under it) instead of flushing it.
func (c *conn) fail(err error, retryExc bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	q := c.q
	q.mu.Lock()
	if !q.closed && q.state != transport.QPErr && q.state != transport.QPReset {
		if retryExc {
			q.failInflightLocked(err.Error())
		}
		q.toErrLocked(transport.StatusSuccess, err.Error())
	}
	q.unlock()
}

func (c *conn) Disconnect() error {
	c.l.disconnect(fmt.Errorf("emu: disconnected by %s: %w", c.local, transport.ErrDisconnected))
	return nil
}

func checkPrivate(what string, b []byte, limit int) error {
	if len(b) > limit {
		return fmt.Errorf("emu: %s private data of %d bytes (limit %d, as RDMA-CM on IB/RoCE): %w", what, len(b), limit, transport.ErrInvalidArgument)
	}
	return nil
}

func asQP(d *device, x transport.QP) (*qp, error) {
	q, ok := x.(*qp)
	if !ok || q.dev != d {
		return nil, fmt.Errorf("emu: QP is not this NIC's: %w", transport.ErrInvalidArgument)
	}
	return q, nil
}

// acceptFrom waits for the next connection request a wire's listener
// queued; once the listener's socket has failed (fail, nil on the loop
// wire) it returns that error.
func acceptFrom[R transport.ConnRequest](ctx context.Context, reqs <-chan R, done <-chan struct{}, fail *listenFail, addr string) (transport.ConnRequest, error) {
	var failed <-chan struct{}
	if fail != nil {
		failed = fail.ch
	}
	select {
	case r := <-reqs:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
		return nil, fmt.Errorf("emu: accept on %s: %w", addr, transport.ErrClosed)
	case <-failed:
		return nil, fail.err
	}
}

// rejectPending refuses the requests still queued on a closing listener.
func rejectPending[R transport.ConnRequest](reqs <-chan R) {
	for {
		select {
		case r := <-reqs:
			r.Reject(nil)
		default:
			return
		}
	}
}

// ---- loop wire ----

// loopRegistry holds the loop wire's listeners for the whole process, so
// two NICs in one process (an initiator's and a target's) can connect.
var loopRegistry struct {
	mu        sync.Mutex
	listeners map[string]*loopListener
	next      int
}

type loopListener struct {
	p    *Provider
	addr string
	reqs chan *loopReq
	done chan struct{}
	once sync.Once
}

func (p *Provider) listenLoop(addr string) (transport.Listener, error) {
	loopRegistry.mu.Lock()
	defer loopRegistry.mu.Unlock()
	if loopRegistry.listeners == nil {
		loopRegistry.listeners = map[string]*loopListener{}
	}
	if addr == "" {
		loopRegistry.next++
		addr = fmt.Sprintf("loop:%d", loopRegistry.next)
	}
	if _, busy := loopRegistry.listeners[addr]; busy {
		return nil, fmt.Errorf("emu: listen on %q: address in use: %w", addr, transport.ErrBusy)
	}
	l := &loopListener{p: p, addr: addr, reqs: make(chan *loopReq, 16), done: make(chan struct{})}
	if err := p.own(l); err != nil {
		return nil, err
	}
	loopRegistry.listeners[addr] = l
	return l, nil
}

func (l *loopListener) Addr() string { return l.addr }

func (l *loopListener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	return acceptFrom(ctx, l.reqs, l.done, nil, l.addr)
}

func (l *loopListener) Close() error {
	l.once.Do(func() {
		loopRegistry.mu.Lock()
		if loopRegistry.listeners[l.addr] == l {
			delete(loopRegistry.listeners, l.addr)
		}
		loopRegistry.mu.Unlock()
		close(l.done)
		rejectPending(l.reqs)
		l.p.disown(l)
	})
	return nil
}

type loopReq struct {
	l      *loopListener
	client *qp
	priv   []byte
	from   string
	reply  chan loopReply

	mu       sync.Mutex
	answered bool
	gaveUp   bool
}

type loopReply struct {
	conn *conn
	err  error
}

func (r *loopReq) Device() transport.Device { return r.l.p.dev }
func (r *loopReq) PrivateData() []byte      { return r.priv }
func (r *loopReq) RemoteAddr() string       { return r.from }

func (r *loopReq) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.gaveUp:
		return fmt.Errorf("emu: the requester gave up: %w", transport.ErrDisconnected)
	case r.answered:
		return fmt.Errorf("emu: request already answered: %w", transport.ErrInvalidState)
	}
	r.answered = true
	return nil
}

func (r *loopReq) Accept(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	if err := checkPrivate("accept", priv, transport.MaxAcceptPrivateData); err != nil {
		return nil, err
	}
	server, err := asQP(r.l.p.dev, x)
	if err != nil {
		return nil, err
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	sh := &loopShared{}
	se := &loopEnd{sh: sh, peer: r.client}
	ce := &loopEnd{sh: sh, peer: server}
	sc := newConn(server, se, r.priv, r.l.addr, r.from)
	cc := newConn(r.client, ce, priv, r.from, r.l.addr)
	sh.a, sh.b = sc, cc
	if err := server.connect(se, sc); err != nil {
		r.reply <- loopReply{err: err}
		return nil, err
	}
	if err := r.client.connect(ce, cc); err != nil {
		server.Modify(transport.QPErr)
		r.reply <- loopReply{err: err}
		return nil, err
	}
	r.reply <- loopReply{conn: cc}
	return sc, nil
}

func (r *loopReq) Reject(priv []byte) error {
	if err := checkPrivate("reject", priv, transport.MaxRejectPrivateData); err != nil {
		return err
	}
	if err := r.answer(); err != nil {
		return err
	}
	r.reply <- loopReply{err: &transport.RejectError{PrivateData: append([]byte(nil), priv...)}}
	return nil
}

type loopShared struct {
	once sync.Once
	a, b *conn
}

type loopEnd struct {
	sh   *loopShared
	peer *qp
}

func (e *loopEnd) direct() bool           { return false }
func (e *loopEnd) closeSinks()            {}
func (e *loopEnd) sendRequest(p *packet)  { e.peer.onRequest(p) }
func (e *loopEnd) sendResponse(p *packet) { e.peer.onResponse(p) }
func (e *loopEnd) flush()                 {}
func (e *loopEnd) disconnect(err error) {
	e.sh.once.Do(func() {
		e.sh.a.fail(err, false)
		e.sh.b.fail(err, false)
	})
}

// ---- active side ----

type endpoint struct {
	p    *Provider
	addr string
	used bool
}

func (e *endpoint) Device() transport.Device { return e.p.dev }
func (e *endpoint) Close() error             { return nil }

func (e *endpoint) Connect(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	if err := checkPrivate("connect", priv, transport.MaxConnectPrivateData); err != nil {
		return nil, err
	}
	q, err := asQP(e.p.dev, x)
	if err != nil {
		return nil, err
	}
	if st := q.State(); st != transport.QPReset && st != transport.QPInit {
		return nil, fmt.Errorf("emu: connect qp %d in %s: %w", q.num, st, transport.ErrInvalidState)
	}
	if e.used {
		return nil, fmt.Errorf("emu: endpoint already used: %w", transport.ErrInvalidState)
	}
	e.used = true
	switch e.p.cfg.Wire {
	case WireTCP:
		return e.p.connectTCP(ctx, e.addr, q, priv)
	case WireShm:
		return e.p.connectShm(ctx, e.addr, q, priv)
	}
	loopRegistry.mu.Lock()
	l := loopRegistry.listeners[e.addr]
	loopRegistry.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("emu: connect to %q: no listener (connection refused): %w", e.addr, transport.ErrNotFound)
	}
	r := &loopReq{l: l, client: q, priv: append([]byte(nil), priv...), from: fmt.Sprintf("loop-qp:%d", q.num), reply: make(chan loopReply, 1)}
	select {
	case l.reqs <- r:
	case <-l.done:
		return nil, fmt.Errorf("emu: connect to %q: listener closed: %w", e.addr, transport.ErrNotFound)
	case <-ctx.Done():
		return nil, fmt.Errorf("emu: connect to %q: %w", e.addr, ctx.Err())
	}
	select {
	case rep := <-r.reply:
		if rep.err != nil {
			return nil, rep.err
		}
		return rep.conn, nil
	case <-ctx.Done():
		r.mu.Lock()
		answered := r.answered
		r.gaveUp = !answered
		r.mu.Unlock()
		if answered {
			if rep := <-r.reply; rep.conn != nil {
				rep.conn.Disconnect()
			}
		}
		return nil, fmt.Errorf("emu: connect to %q: %w", e.addr, ctx.Err())
	}
}
