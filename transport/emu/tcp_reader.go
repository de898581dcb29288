package emu

// The tcp link's reader goroutine: frames from the socket to the
// responder and the requester, read by polling while that pays.

import (
	"bufio"
	"fmt"
	"io"
	"runtime"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
)

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
		payload, err := readPayload(br, &buf, int(h.paylen))
		if err != nil {
			l.disconnect(fmt.Errorf("emu: read from %s: truncated %s frame: %w: %w", l.nc.RemoteAddr(), h.kind, errLinkLost, err))
			return
		}
		pkt = packet{kind: h.kind, flags: h.flags, nak: h.nak, psn: h.psn, imm: h.imm, key: h.key, va: h.va, length: h.length, payload: payload}
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

// tcpPayloadStep is the first size the reader's payload buffer grows to
// while a frame larger than it arrives (see readPayload).
const tcpPayloadStep = 64 << 10

// readPayload reads an n-byte frame payload into *buf, which it grows
// only as the bytes arrive: at most doubling what has been read, from
// tcpPayloadStep on. A header is the peer's word only (decodeHeader
// bounds it by maxMsgSize, 64 MiB), and sizing the buffer from it let a
// peer that sent a header and nothing more pin 64 MiB per connection.
// The buffer is kept for the next frame: after a large payload really
// arrived, the next one as large needs no allocation.
func readPayload(r io.Reader, buf *[]byte, n int) ([]byte, error) {
	b := *buf
	if n <= cap(b) {
		b = b[:n]
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b = b[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(n, max(2*cap(b), tcpPayloadStep)))
			copy(nb, b)
			b = nb
			*buf = b
		}
		k, err := io.ReadFull(r, b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
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
	l.disconnect(fmt.Errorf("%w: %w", err, transport.ErrDisconnected))
}

// sockReader is the reader goroutine's view of the socket: reads that
// poll for up to tcpSpinAwait while answers are due, or tcpSpinIdle while
// none is, before parking; neither while the CPUs are oversubscribed
// (judged as the shm reader judges it).
type sockReader struct {
	l    *tcpLink
	buf  []byte
	n    int
	err  error
	fn   func(fd uintptr) bool // r.try, bound once: a read allocates nothing
	cont contention            // no polling while the CPUs are oversubscribed
}

func newSockReader(l *tcpLink) *sockReader {
	r := &sockReader{l: l, cont: contention{g: l.p.pressure}}
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
	var start, prev, limit int64
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
			if r.cont.contended(now) {
				return false
			}
			limit = int64(tcpSpinAwait)
			if !r.l.q.awaitingAnswers() {
				if r.cont.busy(now) {
					return false
				}
				limit = int64(tcpSpinIdle)
			}
			start = now
		case r.cont.observe(prev, now):
			return false
		case now-start >= limit:
			return false
		}
		prev = now
		runtime.Gosched() // let this process's other goroutines run
	}
}
