package emu

// The tcp link: a connected QP's end of the tcp wire, its lifecycle, and
// its transmit path (frames batched, written by writev without blocking).

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
)

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

	// txMu guards the transmit state below. Frames are added to pend; the
	// goroutine that finds txBusy clear becomes the writer: it swaps pend
	// with out and writes out outside the lock, until pend is empty or
	// the socket is full, when it hands the rest to the flusher.
	txMu    sync.Mutex
	txRoom  sync.Cond // signalled when pend was taken or the link ended
	pend    txBatch
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

	// Owned by the writer of the moment: the batch being written and
	// its writev state.
	out txBatch
	w   txWriter
}

// txBatch is a run of frames written together: their bytes, except
// large request payloads, which are referenced where they lie (refs) and
// written from there by writev rather than copied into b first.
type txBatch struct {
	b    []byte
	refs []txRef
	size int // len(b) and the referenced bytes
}

// txRef is a payload referenced in place; it goes out after b[:at].
type txRef struct {
	at int
	p  []byte
}

func (t *txBatch) reset() {
	t.b = t.b[:0]
	clear(t.refs)
	t.refs = t.refs[:0]
	t.size = 0
}

// tcpRefMin is the smallest request payload sent from where it lies. A
// requester's payload may be, because the consumer leaves a WR's buffers
// alone until it completes (ibv_post_send(3): only inline data may be
// reused as soon as the post returns), and the completion waits for the
// peer's ACK, which comes after the peer has read the bytes; a READ
// response is copied, as the responder reuses its buffer. A smaller
// payload is copied into the batch: 4 KiB ones ran the same either way
// (randread and randwrite QD32), while 128 KiB ones gained 3-14% in
// bandwidth from skipping the copy.
const tcpRefMin = 8 << 10

// txWriter writes a batch with writev, resuming after short writes.
type txWriter struct {
	iov   []unix.Iovec
	at    int  // the first iovec not yet written
	block bool // wait for room (the flusher) rather than report EAGAIN
	err   error
	fn    func(fd uintptr) bool // try, bound once: a write allocates nothing
}

// load prepares to write t.
func (w *txWriter) load(t *txBatch) {
	w.iov, w.at = w.iov[:0], 0
	prev := 0
	for _, r := range t.refs {
		w.push(t.b[prev:r.at])
		w.push(r.p)
		prev = r.at
	}
	w.push(t.b[prev:])
}

func (w *txWriter) push(p []byte) {
	if len(p) > 0 {
		w.iov = append(w.iov, unix.Iovec{Base: &p[0]})
		w.iov[len(w.iov)-1].SetLen(len(p))
	}
}

// pending reports whether a loaded batch is not all written.
func (w *txWriter) pending() bool { return w.at < len(w.iov) }

// tcpIovMax is the most iovecs one writev takes (IOV_MAX).
const tcpIovMax = 1024

// try writes until the batch is out, the socket is full or the write
// fails; false tells RawConn.Write to wait until the socket has room.
func (w *txWriter) try(fd uintptr) bool {
	for w.at < len(w.iov) {
		k := min(len(w.iov)-w.at, tcpIovMax)
		n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[w.at])), uintptr(k))
		switch e {
		case 0:
			w.advance(int(n))
		case unix.EINTR:
		case unix.EAGAIN:
			if w.block {
				return false
			}
			w.err = e
			return true
		default:
			w.err = e
			return true
		}
	}
	return true
}

// advance drops the first n written bytes from the iovecs.
func (w *txWriter) advance(n int) {
	for n > 0 {
		v := &w.iov[w.at]
		k := int(v.Len)
		if n < k {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.SetLen(k - n)
			return
		}
		n -= k
		w.at++
	}
}

// write writes the loaded batch; with w.block clear, a full socket
// returns EAGAIN with the rest still loaded.
func (l *tcpLink) write() error {
	l.w.err = nil
	if err := l.rc.Write(l.w.fn); err != nil {
		return err
	}
	return l.w.err
}

// tcpBusyGap: a flush this soon after the previous write hands the batch
// to the flusher goroutine instead of writing it inline (see flush).
const tcpBusyGap = int64(20 * time.Microsecond)

// tcpPendMax bounds the bytes queued behind a write in progress; a producer
// beyond it waits, as a full send queue back-pressures a NIC.
const tcpPendMax = 4 << 20

func startTCP(p *Provider, q *qp, nc net.Conn, peerPriv []byte, credit transport.ReadCredit) (transport.Conn, error) {
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
		pend:  txBatch{b: make([]byte, 0, 256<<10)},
		out:   txBatch{b: make([]byte, 0, 256<<10)},
		ackAt: -1,
	}
	l.txRoom.L = &l.txMu
	l.w.fn = l.w.try
	l.c = newConn(q, l, peerPriv, credit, nc.LocalAddr().String(), nc.RemoteAddr().String())
	// Owned before the QP can reach it: disconnect, which disowns, may
	// run as soon as q.connect returns.
	if err := p.own(l); err != nil {
		nc.Close()
		return nil, err
	}
	if err := q.connect(l, l.c); err != nil {
		p.disown(l)
		nc.Close()
		return nil, err
	}
	l.wg.Add(2)
	go l.reader()
	go l.flusher()
	return l.c, nil
}

// Close ends the link (provider shutdown).
func (l *tcpLink) Close() error {
	l.disconnect(fmt.Errorf("emu: provider closed: %w", transport.ErrDisconnected))
	l.wg.Wait()
	return nil
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
	l.txMu.Lock()
	for mayWait && l.pend.size > tcpPendMax && !l.txEnded {
		if !l.txBusy {
			l.txMu.Unlock()
			l.flush()
			l.txMu.Lock()
			continue
		}
		l.txRoom.Wait()
	}
	if !l.txEnded {
		t := &l.pend
		k := len(t.b)
		if p.kind == pktAck && l.ackAt >= 0 && int32(p.psn-l.ackPSN) > 0 {
			// The responder coalesces ACKs (IBA 9.7.5.1.2): an ACK
			// acknowledges every request before it, so one queued
			// behind another, with nothing between them, replaces
			// it. The requester completes the earlier SENDs and
			// WRITEs on it (onResponse). At a deep queue a burst's
			// ACKs leave as one frame. A duplicate's ACK (an older
			// PSN, after a retry) is queued as it is.
			l.ackPSN = p.psn
			putHeader(t.b[l.ackAt:], &header{kind: pktAck, psn: p.psn})
			l.txMu.Unlock()
			return
		}
		l.ackAt = -1
		if p.kind == pktAck {
			l.ackAt, l.ackPSN = k, p.psn
		}
		l.ackOnly = p.kind == pktAck && (k == 0 || l.ackOnly)
		in := m
		if p.pieces != nil && m >= tcpRefMin {
			in = 0
		}
		// Grow, not append(make): every byte is written just below, and
		// zeroing the frame first showed as 2.5% of the target's CPU.
		t.b = slices.Grow(t.b, headerLen+in)[:k+headerLen+in]
		putHeader(t.b[k:], &header{kind: p.kind, flags: p.flags, nak: p.nak, psn: p.psn, imm: p.imm,
			key: p.key, va: p.va, length: p.length, paylen: uint32(m)})
		if in > 0 {
			p.gather(t.b[k+headerLen:])
		} else {
			for _, b := range p.pieces {
				if len(b) > 0 {
					t.refs = append(t.refs, txRef{at: len(t.b), p: b})
				}
			}
		}
		t.size += headerLen + m
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
	if l.txBusy || l.pend.size == 0 {
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
	l.w.block = false
	for l.pend.size > 0 && !l.txEnded {
		l.takeLocked()
		err := l.write()
		if err == unix.EAGAIN {
			// The socket is full: the flusher, which may block,
			// writes the rest of the batch and keeps the writer's
			// role.
			l.full <- struct{}{}
			return
		}
		if !l.wrote(err) {
			return
		}
	}
	l.idleLocked()
}

// takeLocked hands the pending batch to the writer, loaded to write, and
// starts a new one. REQUIRES: txMu and the writer's role; releases txMu.
func (l *tcpLink) takeLocked() {
	l.out, l.pend = l.pend, l.out
	l.pend.reset()
	l.ackAt = -1
	l.w.load(&l.out)
	l.txRoom.Broadcast()
	l.txMu.Unlock()
}

// wrote ends the write of the writer's batch, with txMu held on return; a
// failed write gives up the writer's role and ends the link, and wrote
// then reports false with txMu released.
func (l *tcpLink) wrote(err error) bool {
	l.txMu.Lock()
	l.out.reset()
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
	acks := l.ackOnly && l.pend.size > 0 && !l.txBusy
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
		l.w.block = true
		if l.w.pending() {
			// The rest of a batch a full socket did not take.
			if !l.wrote(l.write()) {
				return
			}
		} else {
			l.txMu.Lock()
		}
		for l.pend.size > 0 && !l.txEnded {
			l.takeLocked()
			if !l.wrote(l.write()) {
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
		l.p.disown(l)
	})
}

var errLinkLost = errors.New("emu: link lost")
