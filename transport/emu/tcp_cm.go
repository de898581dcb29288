package emu

// The tcp wire's connection management: the listener, its connection
// requests, and the active side's connect.

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// cmTimeout bounds how long a passive side waits for a connect request's
// first frame, so a silent TCP client cannot pin a goroutine.
const cmTimeout = 10 * time.Second

type tcpListener struct {
	p    *Provider
	ln   net.Listener
	reqs chan *tcpReq
	done chan struct{}
	fail *listenFail
	once sync.Once
	wg   sync.WaitGroup
}

func (p *Provider) listenTCP(ctx context.Context, addr string) (transport.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emu: listen on %s: %w", addr, err)
	}
	l, err := p.serveTCP(ln)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// serveTCP starts accepting connection requests on ln.
func (p *Provider) serveTCP(ln net.Listener) (*tcpListener, error) {
	l := &tcpListener{p: p, ln: ln, reqs: make(chan *tcpReq, 64), done: make(chan struct{}), fail: newListenFail()}
	if err := p.own(l); err != nil {
		ln.Close()
		return nil, err
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		p.acceptLoop(ln, l.Addr(), l.done, l.fail, func(nc net.Conn) {
			l.wg.Add(1)
			go l.handshake(nc)
		})
	}()
	return l, nil
}

func (l *tcpListener) Addr() string { return l.ln.Addr().String() }

// handshake reads the connect request of a new TCP connection.
func (l *tcpListener) handshake(nc net.Conn) {
	defer l.wg.Done()
	nc.SetReadDeadline(time.Now().Add(cmTimeout))
	var hb [headerLen]byte
	var h header
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		nc.Close()
		return
	}
	if err := decodeHeader(hb[:], &h); err != nil || h.kind != cmReq {
		l.p.counters.badFrms.Add(1)
		l.p.log.Warn("dropping connection with a bad connect request", "remote", nc.RemoteAddr().String(), "err", err, "kind", h.kind)
		nc.Close()
		return
	}
	priv := make([]byte, h.paylen)
	if _, err := io.ReadFull(nc, priv); err != nil {
		nc.Close()
		return
	}
	nc.SetReadDeadline(time.Time{})
	r := &tcpReq{l: l, nc: nc, priv: priv}
	select {
	case l.reqs <- r:
	case <-l.done:
		r.Reject(nil)
	}
}

func (l *tcpListener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	return acceptFrom(ctx, l.reqs, l.done, l.fail, l.Addr())
}

func (l *tcpListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.wg.Wait()
		rejectPending(l.reqs)
		l.p.disown(l)
	})
	return nil
}

type tcpReq struct {
	l    *tcpListener
	nc   net.Conn
	priv []byte

	mu       sync.Mutex
	answered bool
}

func (r *tcpReq) Device() transport.Device { return r.l.p.dev }
func (r *tcpReq) PrivateData() []byte      { return r.priv }
func (r *tcpReq) RemoteAddr() string       { return r.nc.RemoteAddr().String() }

func (r *tcpReq) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return fmt.Errorf("emu: request already answered: %w", transport.ErrInvalidState)
	}
	r.answered = true
	return nil
}

func writeCM(nc net.Conn, kind pktKind, priv []byte) error {
	b := make([]byte, headerLen+len(priv))
	putHeader(b, &header{kind: kind, paylen: uint32(len(priv))})
	copy(b[headerLen:], priv)
	_, err := nc.Write(b)
	return err
}

func (r *tcpReq) Accept(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	if err := checkPrivate("accept", priv, transport.MaxAcceptPrivateData); err != nil {
		return nil, err
	}
	q, err := asQP(r.l.p.dev, x)
	if err != nil {
		return nil, err
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		r.nc.SetWriteDeadline(dl)
	}
	if err := writeCM(r.nc, cmRep, priv); err != nil {
		r.nc.Close()
		return nil, fmt.Errorf("emu: accept: %w", err)
	}
	r.nc.SetWriteDeadline(time.Time{})
	return startTCP(r.l.p, q, r.nc, r.priv)
}

func (r *tcpReq) Reject(priv []byte) error {
	if err := checkPrivate("reject", priv, transport.MaxRejectPrivateData); err != nil {
		return err
	}
	if err := r.answer(); err != nil {
		return err
	}
	r.nc.SetWriteDeadline(time.Now().Add(cmTimeout))
	err := writeCM(r.nc, cmRej, priv)
	r.nc.Close()
	if err != nil {
		return fmt.Errorf("emu: reject: %w", err)
	}
	return nil
}

func (p *Provider) connectTCP(ctx context.Context, addr string, q *qp, priv []byte) (transport.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrNotFound, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if err := writeCM(nc, cmReq, priv); err != nil {
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, err)
	}
	var hb [headerLen]byte
	var h header
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
		}
		return nil, fmt.Errorf("emu: connect to %s: no answer: %w: %w", addr, transport.ErrDisconnected, err)
	}
	if err := decodeHeader(hb[:], &h); err != nil || (h.kind != cmRep && h.kind != cmRej) {
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: bad answer (%v, kind %s): %w", addr, err, h.kind, transport.ErrDisconnected)
	}
	rp := make([]byte, h.paylen)
	if _, err := io.ReadFull(nc, rp); err != nil {
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, err)
	}
	if h.kind == cmRej {
		nc.Close()
		return nil, &transport.RejectError{PrivateData: rp}
	}
	if !stop() {
		nc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
	}
	nc.SetDeadline(time.Time{})
	return startTCP(p, q, nc, rp)
}
