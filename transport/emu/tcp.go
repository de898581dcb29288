package emu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
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
// goroutine (frames → responder/requester) and a flusher goroutine that
// only runs when the socket is full. Frames are written by whichever
// goroutine flushes while nobody else is writing (see add and flush), with a
// non-blocking write, so a packet normally leaves without waking anyone.
// disconnect stops both goroutines.
type tcpLink struct {
	p    *Provider
	q    *qp
	c    *conn
	nc   net.Conn
	rc   syscall.RawConn
	quit chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	// txMu guards the transmit state below. Frames are appended to pend;
	// the goroutine that finds txBusy clear becomes the writer: it swaps
	// pend with spare and writes it outside the lock, until pend is empty
	// or the socket is full, when it hands the rest to the flusher.
	txMu    sync.Mutex
	txRoom  sync.Cond // signalled when pend was taken or the link ended
	pend    []byte
	spare   []byte
	txBusy  bool
	txEnded bool
	// ackOnly is set while pend holds nothing but ACKs (see
	// flushAnswers).
	ackOnly bool
	// ackAt is the offset in pend of its last frame when that frame is an
	// ACK, else -1: a later ACK replaces it (see add).
	ackAt  int
	ackPSN uint32
	full   chan struct{} // cap 1: the flusher takes over (socket full, or link busy)
	// lastWrite is when the last batch was written (clock.Nanos).
	lastWrite int64

	// Owned by the writer of the moment: the bytes it writes, the
	// outcome, and tryFn, bound once so a write allocates nothing.
	wbuf  []byte
	wn    int
	werr  error
	tryFn func(fd uintptr) bool
}

// tcpBusyGap: a flush this soon after the previous write hands the batch
// to the flusher goroutine instead of writing it inline (see flush).
const tcpBusyGap = int64(20 * time.Microsecond)

// tcpPendMax bounds the bytes queued behind a write in progress; a producer
// beyond it waits, as a full send queue back-pressures a NIC.
const tcpPendMax = 4 << 20

func startTCP(p *Provider, q *qp, nc net.Conn, peerPriv []byte) (transport.Conn, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("emu: %T has no file descriptor", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("emu: tcp link: %w", err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	l := &tcpLink{p: p, q: q, nc: nc, rc: rc,
		quit:  make(chan struct{}),
		full:  make(chan struct{}, 1),
		pend:  make([]byte, 0, 256<<10),
		spare: make([]byte, 0, 256<<10),
		ackAt: -1,
	}
	l.txRoom.L = &l.txMu
	l.tryFn = l.try
	l.c = newConn(q, l, peerPriv, nc.LocalAddr().String(), nc.RemoteAddr().String())
	if err := q.connect(l, l.c); err != nil {
		nc.Close()
		return nil, err
	}
	l.wg.Add(2)
	go l.reader()
	go l.flusher()
	p.own(l)
	return l.c, nil
}

// Close ends the link (provider shutdown).
func (l *tcpLink) Close() error {
	l.disconnect(fmt.Errorf("emu: provider closed: %w", transport.ErrDisconnected))
	l.wg.Wait()
	return nil
}

// try is one non-blocking write of wbuf (the socket is non-blocking, as Go
// keeps every socket); returning true tells RawConn.Write not to wait.
func (l *tcpLink) try(fd uintptr) bool {
	for {
		l.wn, l.werr = unix.Write(int(fd), l.wbuf)
		if l.werr != unix.EINTR {
			return true
		}
	}
}

// add frames a packet into the pending batch; flush sends it. A sender
// adds every packet it has ready and then flushes once (the doorbell), so
// a chain of WRs, or the answers to a burst of requests, leave in one
// write.
//
// Only requests wait for room (back-pressure on the requester, as a full
// send queue); responses never do, so the reader goroutine always goes
// back to reading. The peer's window of outstanding requests bounds the
// responses queued.
func (l *tcpLink) add(p *packet, mayWait bool) {
	m := p.dataLen()
	n := headerLen + m
	l.txMu.Lock()
	for mayWait && len(l.pend) > tcpPendMax && !l.txEnded {
		if !l.txBusy {
			l.txMu.Unlock()
			l.flush()
			l.txMu.Lock()
			continue
		}
		l.txRoom.Wait()
	}
	if !l.txEnded {
		k := len(l.pend)
		if p.kind == pktAck && l.ackAt >= 0 && int32(p.psn-l.ackPSN) > 0 {
			// The responder coalesces ACKs (IBA 9.7.5.1.2): an ACK
			// acknowledges every request before it, so one queued
			// behind another, with nothing between them, replaces
			// it. The requester completes the earlier SENDs and
			// WRITEs on it (onResponse). At a deep queue this halves
			// the frames on the wire. A duplicate's ACK (an older
			// PSN, after a retry) is queued as it is.
			l.ackPSN = p.psn
			putHeader(l.pend[l.ackAt:], &header{kind: pktAck, psn: p.psn})
			l.txMu.Unlock()
			return
		}
		l.ackAt = -1
		if p.kind == pktAck {
			l.ackAt, l.ackPSN = k, p.psn
		}
		l.ackOnly = p.kind == pktAck && (k == 0 || l.ackOnly)
		// Grow, not append(make): every byte is written just below, and
		// zeroing the frame first showed as 2.5% of the target's CPU.
		l.pend = slices.Grow(l.pend, n)[:k+n]
		putHeader(l.pend[k:], &header{kind: p.kind, flags: p.flags, nak: p.nak, psn: p.psn, imm: p.imm,
			key: p.key, va: p.va, length: p.length, paylen: uint32(m)})
		p.gather(l.pend[k+headerLen:])
	}
	l.txMu.Unlock()
}

// flush writes the pending batch unless another goroutine is writing
// already, which then writes it with its next batch: frames added while a
// write is in the kernel go out together, so a deep queue costs one
// syscall per batch, not per packet, and an idle link sends at once
// without waking a writer goroutine. The write never blocks: what a full
// socket does not take goes to the flusher, so the reader goroutine, which
// sends the responder's answers, always returns to reading (two peers
// blocked writing to each other would never read again).
func (l *tcpLink) flush() {
	l.txMu.Lock()
	if l.txBusy || len(l.pend) == 0 {
		l.txMu.Unlock()
		return
	}
	l.txBusy = true
	if now := clock.Nanos(); now-l.lastWrite < tcpBusyGap {
		// Writes follow each other closely: the link is busy, and a
		// writer goroutine that keeps writing while the producers go on
		// producing batches more per syscall than writing inline would.
		l.txMu.Unlock()
		l.full <- struct{}{}
		return
	}
	for len(l.pend) > 0 && !l.txEnded {
		b := l.takeLocked()
		l.wbuf = b
		err := l.rc.Write(l.tryFn)
		l.wbuf = nil
		if err == nil {
			err = l.werr
		}
		if w := max(l.wn, 0); err == unix.EAGAIN || (err == nil && w < len(b)) {
			// The socket is full: the unwritten rest goes first, and the
			// flusher, which may block, keeps the writer's role.
			l.txMu.Lock()
			rest := append(b[:0], b[w:]...)
			rest = append(rest, l.pend...)
			l.spare, l.pend = l.pend[:0], rest
			l.ackAt = -1
			l.txMu.Unlock()
			l.full <- struct{}{}
			return
		}
		if !l.wrote(b, err) {
			return
		}
	}
	l.idleLocked()
}

// takeLocked hands the pending batch to the writer and starts a new one in
// the spare buffer. REQUIRES: txMu and the writer's role; releases txMu.
func (l *tcpLink) takeLocked() []byte {
	b := l.pend
	l.pend = l.spare[:0]
	l.ackAt = -1
	l.txRoom.Broadcast()
	l.txMu.Unlock()
	return b
}

// wrote takes the written batch back as the spare buffer, with txMu
// held on return; a failed write gives up the writer's role and ends the
// link, and wrote then reports false with txMu released.
func (l *tcpLink) wrote(b []byte, err error) bool {
	l.txMu.Lock()
	l.spare = b[:0]
	if err != nil {
		l.txBusy = false
		l.txMu.Unlock()
		l.disconnect(fmt.Errorf("emu: write to %s: %w: %w", l.nc.RemoteAddr(), errLinkLost, err))
		return false
	}
	return true
}

// idleLocked gives up the writer's role. REQUIRES: txMu; releases it.
func (l *tcpLink) idleLocked() {
	l.lastWrite = clock.Nanos()
	l.txBusy = false
	l.txMu.Unlock()
}

// flushAnswers sends what the responder queued for a burst of requests.
// If that is only ACKs, the reader first yields once: a SEND it just
// delivered has made the consumer runnable on this P (the CQ signal), and
// if the consumer answers at once its post flushes the ACKs along with
// the answer, one write and one wake-up for the peer instead of two.
// Otherwise, and for anything but ACKs (READ responses, NAKs), the batch
// goes at once. A timer would not do: Go's netpoller sleeps in whole
// milliseconds, so a sub-millisecond ACK delay stretched a lone WRITE's
// completion to half a millisecond.
func (l *tcpLink) flushAnswers() {
	l.txMu.Lock()
	acks := l.ackOnly && len(l.pend) > 0 && !l.txBusy
	l.txMu.Unlock()
	if acks {
		runtime.Gosched()
	}
	l.flush()
}

// flusher writes, blocking, what a full socket did not take or what a busy
// link handed over, holding the writer's role until the pending batch is
// empty.
func (l *tcpLink) flusher() {
	defer l.wg.Done()
	for {
		select {
		case <-l.full:
		case <-l.quit:
			return
		}
		l.txMu.Lock()
		for len(l.pend) > 0 && !l.txEnded {
			b := l.takeLocked()
			_, err := l.nc.Write(b)
			if !l.wrote(b, err) {
				return
			}
		}
		l.idleLocked()
	}
}

func (l *tcpLink) direct() bool           { return false }
func (l *tcpLink) closeSinks()            {}
func (l *tcpLink) sendRequest(p *packet)  { l.add(p, true) }
func (l *tcpLink) sendResponse(p *packet) { l.add(p, false) }

func (l *tcpLink) disconnect(err error) {
	l.once.Do(func() {
		close(l.quit)
		l.txMu.Lock()
		l.txEnded = true
		l.txRoom.Broadcast()
		l.txMu.Unlock()
		// Best effort DREQ so the peer learns of an orderly disconnect.
		// Writes to one socket are whole (the fd's write lock), so it
		// lands between batches, never inside a frame.
		var b [headerLen]byte
		putHeader(b[:], &header{kind: pktDisconnect})
		l.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		l.nc.Write(b[:])
		l.nc.Close()
		l.c.fail(err, errors.Is(err, errLinkLost))
	})
}

var errLinkLost = errors.New("emu: link lost")

func (l *tcpLink) reader() {
	defer l.wg.Done()
	// 64 KiB: a burst of small frames per read, while a large payload
	// is read straight into its buffer (bufio bypasses itself for reads
	// at least its size) instead of through a second copy.
	br := bufio.NewReaderSize(newSockReader(l), 64<<10)
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
		if br.Buffered() == 0 {
			// No more frames at hand: send the answers to this burst.
			l.flushAnswers()
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

// tcpSpinAwait is how long the reader polls a quiet socket while its QP
// has requests in flight, before it parks in the netpoller. Parking costs
// an epoll_wait, a sleep and a wake-up per burst; the peer's answers to a
// deep queue come within tens of microseconds. Linux's busy polling
// (SO_BUSY_POLL, net.core.busy_read) makes the same trade in the kernel,
// and does not apply to loopback.
const tcpSpinAwait = 50 * time.Microsecond

// sockReader is the reader goroutine's view of the socket: reads that
// poll for up to tcpSpinAwait while answers are due (and the CPUs are not
// oversubscribed, judged as the shm reader judges it) before parking.
type sockReader struct {
	l    *tcpLink
	buf  []byte
	n    int
	err  error
	fn   func(fd uintptr) bool // r.try, bound once: a read allocates nothing
	cont contention            // no polling while the CPUs are oversubscribed
}

func newSockReader(l *tcpLink) *sockReader {
	r := &sockReader{l: l}
	r.fn = r.try
	return r
}

func (r *sockReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = p, 0, nil
	err := r.l.rc.Read(r.fn)
	r.buf = nil
	if err != nil {
		return 0, err
	}
	return r.n, r.err
}

// try reads once, and on an empty socket polls while that pays; false
// parks the goroutine until the socket is readable.
func (r *sockReader) try(fd uintptr) bool {
	var start, prev int64
	for {
		n, err := unix.Read(int(fd), r.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
		case err != nil:
			r.err = err
			return true
		case n == 0:
			r.err = io.EOF
			return true
		default:
			r.n = n
			return true
		}
		now := clock.Nanos()
		switch {
		case start == 0:
			if r.cont.contended(now) || !r.l.q.awaitingAnswers() {
				return false
			}
			start = now
		case r.cont.observe(prev, now):
			return false
		case now-start >= int64(tcpSpinAwait):
			return false
		}
		prev = now
		runtime.Gosched() // let this process's other goroutines run
	}
}
