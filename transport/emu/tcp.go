package emu

import (
	"bufio"
	"context"
	"errors"
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
	l := &tcpListener{p: p, ln: ln, reqs: make(chan *tcpReq, 64), done: make(chan struct{})}
	l.wg.Add(1)
	go l.acceptLoop()
	p.own(l)
	return l, nil
}

func (l *tcpListener) Addr() string { return l.ln.Addr().String() }

func (l *tcpListener) acceptLoop() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.handshake(nc)
	}
}

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
	return acceptFrom(ctx, l.reqs, l.done, l.Addr())
}

func (l *tcpListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.wg.Wait()
		rejectPending(l.reqs)
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

// tcpLink is a connected QP's end of a TCP connection. It owns a reader
// goroutine (frames → responder/requester) and a writer goroutine (queued
// frames → socket); disconnect stops both.
type tcpLink struct {
	p    *Provider
	q    *qp
	c    *conn
	nc   net.Conn
	wq   chan []byte
	free chan []byte
	quit chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func startTCP(p *Provider, q *qp, nc net.Conn, peerPriv []byte) (transport.Conn, error) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	l := &tcpLink{p: p, q: q, nc: nc,
		wq:   make(chan []byte, 4*window+16),
		free: make(chan []byte, 4*window+16),
		quit: make(chan struct{}),
	}
	l.c = newConn(q, l, peerPriv, nc.LocalAddr().String(), nc.RemoteAddr().String())
	if err := q.connect(l, l.c); err != nil {
		nc.Close()
		return nil, err
	}
	l.wg.Add(2)
	go l.writer()
	go l.reader()
	p.own(l)
	return l.c, nil
}

// Close ends the link (provider shutdown).
func (l *tcpLink) Close() error {
	l.disconnect(fmt.Errorf("emu: provider closed: %w", transport.ErrDisconnected))
	l.wg.Wait()
	return nil
}

func (l *tcpLink) getBuf(n int) []byte {
	select {
	case b := <-l.free:
		if cap(b) >= n {
			return b[:n]
		}
	default:
	}
	return make([]byte, n, max(n, 4096))
}

func (l *tcpLink) enqueue(p *packet) {
	b := l.getBuf(headerLen + len(p.payload))
	putHeader(b, &header{kind: p.kind, flags: p.flags, nak: p.nak, psn: p.psn, imm: p.imm,
		key: p.key, va: p.va, length: p.length, paylen: uint32(len(p.payload))})
	copy(b[headerLen:], p.payload)
	select {
	case l.wq <- b:
	case <-l.quit:
	}
}

func (l *tcpLink) direct() bool           { return false }
func (l *tcpLink) closeSinks()            {}
func (l *tcpLink) sendRequest(p *packet)  { l.enqueue(p) }
func (l *tcpLink) sendResponse(p *packet) { l.enqueue(p) }

func (l *tcpLink) disconnect(err error) {
	l.once.Do(func() {
		// Best effort DREQ so the peer learns of an orderly disconnect.
		var b [headerLen]byte
		putHeader(b[:], &header{kind: pktDisconnect})
		l.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		close(l.quit)
		l.nc.Write(b[:])
		l.nc.Close()
		l.c.fail(err, errors.Is(err, errLinkLost))
	})
}

var errLinkLost = errors.New("emu: link lost")

func (l *tcpLink) writer() {
	defer l.wg.Done()
	bw := bufio.NewWriterSize(l.nc, 256<<10)
	for {
		var b []byte
		select {
		case b = <-l.wq:
		case <-l.quit:
			return
		}
		for {
			if _, err := bw.Write(b); err != nil {
				l.disconnect(fmt.Errorf("emu: write to %s: %w: %w", l.nc.RemoteAddr(), errLinkLost, err))
				return
			}
			select {
			case l.free <- b:
			default:
			}
			if len(l.wq) == 0 {
				break
			}
			b = <-l.wq
		}
		if err := bw.Flush(); err != nil {
			l.disconnect(fmt.Errorf("emu: write to %s: %w: %w", l.nc.RemoteAddr(), errLinkLost, err))
			return
		}
	}
}

func (l *tcpLink) reader() {
	defer l.wg.Done()
	br := bufio.NewReaderSize(l.nc, 256<<10)
	var hb [headerLen]byte
	var h header
	var buf []byte
	var pkt packet
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			l.disconnect(fmt.Errorf("emu: read from %s: %w: %w", l.nc.RemoteAddr(), errLinkLost, err))
			return
		}
		if err := decodeHeader(hb[:], &h); err != nil || h.kind >= cmReq {
			l.hostile(err, h.kind)
			return
		}
		if cap(buf) < int(h.paylen) {
			buf = make([]byte, h.paylen)
		}
		pkt = packet{kind: h.kind, flags: h.flags, nak: h.nak, psn: h.psn, imm: h.imm, key: h.key, va: h.va, length: h.length, payload: buf[:h.paylen]}
		if _, err := io.ReadFull(br, pkt.payload); err != nil {
			l.disconnect(fmt.Errorf("emu: read from %s: truncated %s frame: %w: %w", l.nc.RemoteAddr(), h.kind, errLinkLost, err))
			return
		}
		switch {
		case h.kind == pktDisconnect:
			l.disconnect(fmt.Errorf("emu: peer %s disconnected: %w", l.nc.RemoteAddr(), transport.ErrDisconnected))
			return
		case h.kind.isRequest():
			l.q.onRequest(&pkt)
		default:
			l.q.onResponse(&pkt)
		}
	}
}

// hostile handles a frame no conforming peer sends: the QP goes to ERR
// with a logged reason and the connection is dropped.
func (l *tcpLink) hostile(err error, kind pktKind) {
	l.p.counters.badFrms.Add(1)
	if err == nil {
		err = fmt.Errorf("%w: CM message %s on an established connection", errBadFrame, kind)
	}
	l.p.log.Warn("malformed frame: QP to ERR", "qp", l.q.num, "remote", l.nc.RemoteAddr().String(), "err", err)
	l.q.fatal(transport.EventQPFatal, err.Error())
	l.disconnect(fmt.Errorf("emu: %w", err))
}
