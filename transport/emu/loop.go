package emu

// The loop wire: both ends of a connection in one process, packets handed
// from one QP to the other by a function call.

import (
	"context"
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

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
	offer  transport.ReadCredit // the requester's, its own view
	from   string
	reply  chan loopReply
	answerOnce
}

type loopReply struct {
	conn *conn
	err  error
}

func (r *loopReq) Device() transport.Device { return r.l.p.dev }
func (r *loopReq) PrivateData() []byte      { return r.priv }
func (r *loopReq) RemoteAddr() string       { return r.from }

func (r *loopReq) ReadCredit() transport.ReadCredit { return offeredCredit(r.offer) }

func (r *loopReq) Accept(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	server, err := r.accepting(r.l.p.dev, x, priv)
	if err != nil {
		return nil, err
	}
	sh := &loopShared{}
	se := &loopEnd{sh: sh, peer: r.client}
	ce := &loopEnd{sh: sh, peer: server}
	credit := r.ReadCredit()
	sc := newConn(server, se, r.priv, credit, r.l.addr, r.from)
	cc := newConn(r.client, ce, priv, agreedCredit(r.offer, credit), r.from, r.l.addr)
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
	if err := r.rejecting(priv); err != nil {
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

// connectLoop asks the loop listener at addr to connect q.
func (p *Provider) connectLoop(ctx context.Context, addr string, q *qp, priv []byte, offer transport.ReadCredit) (transport.Conn, error) {
	loopRegistry.mu.Lock()
	l := loopRegistry.listeners[addr]
	loopRegistry.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("emu: connect to %q: no listener: %w", addr, transport.ErrRefused)
	}
	r := &loopReq{l: l, client: q, priv: append([]byte(nil), priv...), offer: offer, from: fmt.Sprintf("loop-qp:%d", q.num), reply: make(chan loopReply, 1)}
	select {
	case l.reqs <- r:
	case <-l.done:
		return nil, fmt.Errorf("emu: connect to %q: listener closed: %w", addr, transport.ErrRefused)
	case <-ctx.Done():
		return nil, fmt.Errorf("emu: connect to %q: %w", addr, ctx.Err())
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
		return nil, fmt.Errorf("emu: connect to %q: %w", addr, ctx.Err())
	}
}
