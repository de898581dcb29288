package emu

// The shm link: a connected QP's end of the shm wire, its shared region,
// its lifecycle, and the producers that publish descriptors on its rings.

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// shmLink is a connected QP's end of the shm wire. The ring reader
// goroutine drains the two incoming rings (requests → responder, responses
// → requester) and is the only user of the peer's mapped arenas; the
// control reader goroutine reads the unix socket (arena MAPs, DREQ, and
// EOF when the peer process dies).
type shmLink struct {
	p      *Provider
	q      *qp
	c      *conn
	uc     *net.UnixConn
	region []byte
	hs     *handshakes // accepted side: the listener's silent connections

	inReq, inResp   ring // consumed by the ring reader
	outReq          ring // produced by the requester goroutine
	outResp         ring // produced by the ring reader (responder)
	myBell, peerBel bell
	myGate, peerGat gate // into my sinks (I open/close), into the peer's (I place)

	// Arenas handed to the peer (MAP sent), by ID; mapsSent counts MAPs.
	mapMu    sync.Mutex
	sent     map[uint64]struct{}
	mapsSent atomic.Uint32
	// One-entry caches of the last arena known to be handed over, one per
	// producer goroutine.
	reqLast, respLast *transport.Arena

	// The peer's arenas mapped here, by the peer's ID.
	peerMu     sync.Mutex
	peer       map[uint64][]byte
	peerClosed bool
	mapsRecv   atomic.Uint32
	mapped     chan struct{}
	lastID     uint64 // ring reader's cache of peer[lastID]
	lastMem    []byte

	// Producer and consumer scratch (each used by one goroutine).
	reqDesc, respDesc, rdesc desc
	reqBuf, respBuf, rbuf    [maxDescSlots * shmSlot]byte
	rpieces                  [maxSGE][]byte
	rpkt                     packet
	// The ring reader's held-back ACK (sendResponse).
	ackHeld bool
	ackPSN  uint32
	ackPkt  packet

	wake    chan struct{} // doorbell rung by the peer (cap 1)
	timer   *time.Timer   // the ring reader's sleep bound
	wakeMsg [ctlHdrLen]byte
	quit    chan struct{}
	gone    chan struct{} // the peer ended the connection (DREQ or EOF)
	goneErr error
	goneOne sync.Once
	closing atomic.Bool
	once    sync.Once
	users   atomic.Int64 // goroutines inside the region; see enter
	release sync.Once
	wg      sync.WaitGroup
}

// newShmLink is side's view of a connection region: its rings, doorbells
// and gates, with the link's own reference taken and its sink gate open.
// It has no QP, socket or goroutines yet.
func newShmLink(region []byte, side int) *shmLink {
	in, out := regionRings+(1-side)*dirLen, regionRings+side*dirLen
	l := &shmLink{region: region,
		inReq: newRing(region, in, shmReqSlots), inResp: newRing(region, in+reqRingLen, shmRespSlots),
		outReq: newRing(region, out, shmReqSlots), outResp: newRing(region, out+reqRingLen, shmRespSlots),
		myBell: newBell(region, side), peerBel: newBell(region, 1-side),
		myGate: newGate(region, side), peerGat: newGate(region, 1-side),
		sent: map[uint64]struct{}{}, peer: map[uint64][]byte{},
		mapped: make(chan struct{}, 1), quit: make(chan struct{}), gone: make(chan struct{}),
		wake: make(chan struct{}, 1), timer: time.NewTimer(time.Hour),
	}
	l.timer.Stop()
	putCtl(l.wakeMsg[:], &ctlMsg{kind: ctlWake})
	l.users.Store(1) // the link's own reference, dropped by disconnect
	l.myGate.open.Store(1)
	return l
}

func startShm(p *Provider, q *qp, uc *net.UnixConn, region []byte, side int, peerPriv []byte, credit transport.ReadCredit, local, remote string, hs *handshakes) (transport.Conn, error) {
	l := newShmLink(region, side)
	l.p, l.q, l.uc, l.hs = p, q, uc, hs
	l.c = newConn(q, l, peerPriv, credit, local, remote)
	// Owned before the QP can reach it: disconnect, which disowns, may
	// run as soon as q.connect returns.
	if err := p.own(l); err != nil {
		uc.Close()
		unix.Munmap(region)
		return nil, err
	}
	if err := q.connect(l, l.c); err != nil {
		p.disown(l)
		uc.Close()
		unix.Munmap(region)
		return nil, err
	}
	l.users.Add(1) // the ring reader's
	l.wg.Add(2)
	go l.reader()
	go l.ctlReader()
	return l.c, nil
}

// enter admits a goroutine to the shared region; false once the link is
// closing. The region and the peer's arenas are unmapped when the last
// user leaves a closing link.
func (l *shmLink) enter() bool {
	l.users.Add(1)
	if l.closing.Load() {
		l.exit()
		return false
	}
	return true
}

func (l *shmLink) exit() {
	if l.users.Add(-1) == 0 {
		l.release.Do(l.unmap)
	}
}

func (l *shmLink) unmap() {
	l.peerMu.Lock()
	l.peerClosed = true
	for id, m := range l.peer {
		unix.Munmap(m)
		delete(l.peer, id)
	}
	l.peerMu.Unlock()
	unix.Munmap(l.region)
}

func (l *shmLink) direct() bool { return true }

// place copies READ data into the requester's sinks (the peer's memory)
// if the requester still accepts it. Called by the responder.
func (l *shmLink) place(sinks [][]byte, src []byte) {
	g := l.peerGat
	g.placing.Store(1)
	if g.open.Load() == 1 {
		for _, b := range sinks {
			src = src[copy(b, src):]
		}
	}
	g.placing.Store(0)
}

// closeSinks closes this side's gate and waits out a placement in
// progress (bounded: a peer that never clears its flag is not waited for).
func (l *shmLink) closeSinks() {
	if !l.enter() {
		return // disconnect did it
	}
	l.shutSinks()
	l.exit()
}

// shutSinks is closeSinks for a caller that holds the region mapped.
func (l *shmLink) shutSinks() {
	g := l.myGate
	g.open.Store(0)
	for i := 0; g.placing.Load() != 0 && i < 1_000_000; i++ {
		if i > shmSpinPolls {
			runtime.Gosched()
		}
	}
}

// Close ends the link (provider shutdown).
func (l *shmLink) Close() error {
	l.disconnect(fmt.Errorf("emu: provider closed: %w", transport.ErrDisconnected))
	l.wg.Wait()
	return nil
}

func (l *shmLink) disconnect(err error) {
	l.once.Do(func() {
		l.closing.Store(true)
		close(l.quit)
		l.shutSinks()
		l.uc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		writeCtl(l.uc, &ctlMsg{kind: ctlDisc}, -1) // best effort DREQ
		l.uc.Close()
		l.c.fail(err, errors.Is(err, errLinkLost))
		l.exit()
		l.p.disown(l)
	})
}

// peerDown records that the peer ended the connection; the ring reader
// drains what the peer published before and then disconnects.
func (l *shmLink) peerDown(err error) {
	l.goneOne.Do(func() {
		l.goneErr = err
		close(l.gone)
	})
}

func (l *shmLink) peerGone() bool {
	select {
	case <-l.gone:
		return true
	default:
		return false
	}
}

// hostile handles a descriptor or message no conforming peer sends: the
// QP goes to ERR with a logged reason and the connection is dropped.
func (l *shmLink) hostile(err error) {
	l.p.counters.badFrms.Add(1)
	l.p.log.Warn("malformed descriptor from the shm peer: QP to ERR", "qp", l.q.num, "remote", l.c.remote, "err", err)
	l.q.fatal(transport.EventQPFatal, err.Error())
	l.disconnect(fmt.Errorf("%w: %w", err, transport.ErrDisconnected))
}

func (l *shmLink) flush() {}

func (l *shmLink) sendRequest(p *packet) {
	l.send(&l.outReq, &l.reqDesc, l.reqBuf[:], &l.reqLast, p)
}

// sendResponse publishes a response; an ACK is held back instead (the
// ring reader is the only caller), and a later ACK replaces it, until
// something else goes on the response ring or the reader's poll batch
// ends. The responder may coalesce ACKs (IBA 9.7.5.1.2) and the requester
// completes every SEND and WRITE before an ACK's PSN on it (onResponse,
// as rxe_comp.c check_psn), so answering a burst of requests with one ACK
// saves a descriptor per request on both sides, and the cache lines it
// would move between the two processes' CPUs. A duplicate's ACK (an
// older PSN, after a retry) does not replace the held one: both go, in
// order.
func (l *shmLink) sendResponse(p *packet) {
	if p.kind == pktAck {
		if !l.ackHeld || int32(p.psn-l.ackPSN) <= 0 {
			l.flushAck()
			l.ackHeld = true
		}
		l.ackPSN = p.psn
		return
	}
	l.flushAck()
	l.send(&l.outResp, &l.respDesc, l.respBuf[:], &l.respLast, p)
}

// flushAck publishes the held ACK, if any.
func (l *shmLink) flushAck() {
	if !l.ackHeld {
		return
	}
	l.ackHeld = false
	l.ackPkt = packet{kind: pktAck, psn: l.ackPSN}
	l.send(&l.outResp, &l.respDesc, l.respBuf[:], &l.respLast, &l.ackPkt)
}

// send publishes a packet as a descriptor. Every arena it names is handed
// to the peer first. A ring that stays full for a retry timeout drops the
// packet, as a congested wire would; RC retransmission recovers.
func (l *shmLink) send(r *ring, d *desc, buf []byte, last **transport.Arena, p *packet) {
	if !l.enter() {
		return
	}
	defer l.exit()
	d.kind, d.flags, d.nak, d.psn, d.imm, d.key, d.va = p.kind, p.flags, p.nak, p.psn, p.imm, p.key, p.va
	d.nseg, d.ninline, d.length = 0, 0, 0
	switch {
	case len(p.payload) > maxInline:
		l.p.log.Error("shm: packet payload too large for a descriptor", "qp", l.q.num, "kind", p.kind, "bytes", len(p.payload))
		return
	case len(p.payload) > 0:
		d.ninline = copy(d.inline[:], p.payload)
		d.length = uint32(d.ninline)
	default:
		for _, s := range p.segs {
			if *last != s.arena {
				if !l.handOver(s.arena) {
					return // dropped: the requester retries (and re-checks its lkeys)
				}
				*last = s.arena
			}
			d.segs[d.nseg] = dseg{id: s.arena.ID(), off: uint64(s.off), n: uint32(s.n)}
			d.nseg++
			d.length += uint32(s.n)
		}
	}
	if p.kind == pktRead || p.placed {
		d.length = p.length
	}
	if p.placed {
		d.flags |= dfPlaced
	}
	d.mapSeq = l.mapsSent.Load()
	k := encodeDesc(buf, d)
	var since time.Time
	for i := 0; ; i++ {
		ok, bad := r.space(uint64(k))
		if bad {
			l.hostile(fmt.Errorf("%w: ring head %d beyond tail %d", errBadFrame, r.head.Load(), r.ptail))
			return
		}
		if ok {
			break
		}
		if l.closing.Load() || l.peerGone() {
			return
		}
		switch {
		case i < shmSpinPolls:
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > l.p.cfg.RetryTimeout:
			l.p.log.Debug("shm: ring full, packet dropped", "qp", l.q.num, "kind", p.kind, "psn", p.psn)
			return
		case time.Since(since) < shmSpinMax:
			runtime.Gosched()
		default:
			time.Sleep(20 * time.Microsecond)
		}
	}
	r.put(buf, k)
	if l.peerBel.claim() {
		l.uc.Write(l.wakeMsg[:]) // an error ends the link through the socket reader
	}
}

// handOver passes an arena's memfd to the peer unless it already has it.
func (l *shmLink) handOver(a *transport.Arena) bool {
	l.mapMu.Lock()
	defer l.mapMu.Unlock()
	id := a.ID()
	if _, ok := l.sent[id]; ok {
		return true
	}
	fd := a.MemFD()
	if fd < 0 {
		l.p.log.Warn("shm: arena has no memfd and cannot be shared with the peer process", "qp", l.q.num, "arena", id)
		return false
	}
	if err := writeCtl(l.uc, &ctlMsg{kind: ctlMap, id: id, size: uint64(a.Len())}, fd); err != nil {
		l.disconnect(fmt.Errorf("emu: shm: hand arena to %s: %w (%w): %w", l.c.remote, errLinkLost, transport.ErrDisconnected, err))
		return false
	}
	l.sent[id] = struct{}{}
	l.mapsSent.Add(1)
	return true
}
