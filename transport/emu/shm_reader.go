package emu

// The shm link's two reader goroutines: the control reader on the unix
// socket and the ring reader that drains the incoming rings.

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/internal/spin"
)

// ctlReader reads the unix socket until it closes. EOF means the peer
// process is gone (the kernel closes its descriptors when it dies).
func (l *shmLink) ctlReader() {
	defer l.wg.Done()
	rcv, err := newCtlRecv(l.uc, make([]byte, ctlMaxLen), make([]byte, unix.CmsgSpace(4*4)))
	if err != nil {
		l.peerDown(fmt.Errorf("emu: shm link to %s: %w: %w", l.c.remote, errLinkLost, err))
		return
	}
	var m ctlMsg
	for {
		fds, err := rcv.read(&m)
		if err != nil {
			if l.closing.Load() {
				return
			}
			if errors.Is(err, errBadFrame) {
				l.hostile(err)
				return
			}
			if errors.Is(err, errNoDescriptors) {
				// The link cannot go on without the arena it was handed.
				// Shedding a silent connection makes room for the
				// peer's next attempt.
				l.hs.shedOldest()
				l.p.log.Warn("shm: out of descriptors; dropping the connection", "qp", l.q.num, "peer", l.c.remote, "err", err)
				l.peerDown(fmt.Errorf("emu: shm link to %s: %w (%w): %w", l.c.remote, errLinkLost, transport.ErrDisconnected, err))
				return
			}
			l.peerDown(fmt.Errorf("emu: shm peer %s gone: %w (%w): %w", l.c.remote, errLinkLost, transport.ErrDisconnected, err))
			return
		}
		switch {
		case m.kind == ctlWake && len(fds) == 0:
			select {
			case l.wake <- struct{}{}:
			default:
			}
		case m.kind == ctlDisc && len(fds) == 0:
			l.peerDown(fmt.Errorf("emu: peer %s disconnected: %w", l.c.remote, transport.ErrDisconnected))
			return
		case m.kind == ctlMap && len(fds) == 1:
			err = l.mapPeer(m.id, m.size, fds[0])
			unix.Close(fds[0])
			if err != nil {
				l.hostile(err)
				return
			}
		default:
			closeFDs(fds)
			l.hostile(fmt.Errorf("%w: control kind %d with %d descriptors on an established connection", errBadFrame, m.kind, len(fds)))
			return
		}
	}
}

func (l *shmLink) mapPeer(id, size uint64, fd int) error {
	mem, err := mapPeerFD(fd, size, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return err
	}
	l.peerMu.Lock()
	_, dup := l.peer[id]
	if l.peerClosed || dup {
		l.peerMu.Unlock()
		unix.Munmap(mem)
		if dup {
			return fmt.Errorf("%w: arena %d handed over twice", errBadFrame, id)
		}
		return nil
	}
	l.peer[id] = mem
	l.peerMu.Unlock()
	l.mapsRecv.Add(1)
	select {
	case l.mapped <- struct{}{}:
	default:
	}
	return nil
}

// reader is the ring reader: it drains both incoming rings, answering
// requests as the responder and handing responses to the requester, and
// waits adaptively when there is nothing to do.
func (l *shmLink) reader() {
	defer l.wg.Done()
	defer l.exit()
	var avgWait spin.Average // of idle waits
	var since int64          // start of the current idle wait; 0 while busy
	// awaiting, for this wait: 0 not decided yet, 1 answers are due, 2
	// none are but new requests are worth polling for, 3 neither.
	awaiting := 0
	slept := false   // this wait went to sleep
	var sleepy int64 // moving average of waits that slept, in 1/1024
	var prev int64   // the previous idle poll
	cont := contention{g: l.p.pressure}
	eager := l.p.cfg.ShmPoll == ShmPollEager
	for !l.closing.Load() {
		n, ok := l.poll()
		if !ok {
			return
		}
		if n > 0 {
			if since != 0 {
				avgWait.Observe(clock.Nanos() - since)
				s := int64(0)
				if slept {
					s = 1024
				}
				sleepy += (s - sleepy) / 8
				since, awaiting, slept = 0, 0, false
			}
			continue
		}
		if l.peerGone() {
			// A peer publishes its last answers and then goes: poll once
			// more after seeing it gone, so an answer published between
			// the empty poll and its going is not lost.
			n, ok := l.poll()
			if !ok {
				return
			}
			if n > 0 {
				continue
			}
			l.disconnect(l.goneErr) // everything published before is done
			return
		}
		now := clock.Nanos()
		if since == 0 {
			since, prev = now, now
			continue
		}
		cont.observe(prev, now)
		prev = now
		if now-since < spin.Budget(avgWait.Nanos(), int64(shmSpinMin), int64(shmSpinMax)) {
			runtime.Gosched() // let this process's other goroutines run
			continue
		}
		if awaiting == 0 {
			// Decided once per wait, as the tcp reader decides.
			switch {
			case l.q.awaitingAnswers():
				awaiting = 1
			case sleepy < 512 && !cont.busy(now):
				awaiting = 2
			default:
				awaiting = 3
			}
		}
		if awaiting == 1 && now-since < int64(shmSpinAwait) && (eager || !cont.contended(now)) {
			// Our requests are out: the peer's NIC answers them without
			// waiting for anyone, so the answer is worth polling for.
			runtime.Gosched()
			continue
		}
		if awaiting == 2 && now-since < int64(shmSpinIdle) && !cont.contended(now) {
			runtime.Gosched()
			continue
		}
		slept = true
		l.sleep()
	}
}

// sleep waits for the doorbell after announcing it, unless work arrived
// in between (the producer stores its tail and then reads the flag; we
// store the flag and then read the tails: one of us sees the other).
func (l *shmLink) sleep() {
	b := l.myBell
	b.sleeping.Store(1)
	n1, ok1 := l.inReq.avail()
	n2, ok2 := l.inResp.avail()
	if n1+n2 == 0 && ok1 && ok2 {
		l.timer.Reset(shmSleep)
		select {
		case <-l.wake:
		case <-l.quit:
		case <-l.gone:
		case <-l.timer.C:
		}
		l.timer.Stop()
	}
	b.sleeping.Store(0)
}

// poll handles up to a batch of descriptors; false when the link ended.
func (l *shmLink) poll() (int, bool) {
	n := 0
	for n < 64 {
		got := false
		for _, isReq := range [2]bool{false, true} {
			r := &l.inResp
			if isReq {
				r = &l.inReq
			}
			k, ok := r.avail()
			if !ok {
				l.hostile(fmt.Errorf("%w: ring tail %d from head %d", errBadFrame, r.tail.Load(), r.chead))
				return n, false
			}
			if k == 0 {
				continue
			}
			if !l.take(r, k, isReq) {
				return n, false
			}
			got = true
			n++
		}
		if !got {
			break
		}
	}
	l.flushAck()
	return n, true
}

// take copies one descriptor out of the ring, validates it and delivers it.
func (l *shmLink) take(r *ring, avail uint64, isReq bool) bool {
	b := l.rbuf[:]
	copy(b[:shmSlot], r.slot(r.chead))
	extra, err := descExtra(b[:shmSlot])
	if err == nil && uint64(1+extra) > avail {
		err = fmt.Errorf("%w: descriptor of %d slots, %d published", errBadFrame, 1+extra, avail)
	}
	if err != nil {
		l.hostile(err)
		return false
	}
	for i := 1; i <= extra; i++ {
		copy(b[i*shmSlot:(i+1)*shmSlot], r.slot(r.chead+uint64(i)))
	}
	r.release(uint64(1 + extra))
	d := &l.rdesc
	if err := decodeDesc(b[:(1+extra)*shmSlot], d); err != nil {
		l.hostile(err)
		return false
	}
	if d.kind.isRequest() != isReq {
		l.hostile(fmt.Errorf("%w: %s in the wrong ring", errBadFrame, d.kind))
		return false
	}
	pkt := &l.rpkt
	*pkt = packet{kind: d.kind, flags: d.flags &^ dfPlaced, nak: d.nak, psn: d.psn, imm: d.imm, key: d.key, va: d.va, length: d.length,
		placed: d.flags&dfPlaced != 0}
	switch {
	case d.ninline > 0:
		pkt.payload = d.inline[:d.ninline]
	case d.nseg > 0:
		if !l.awaitMaps(d.mapSeq) {
			return false
		}
		for i := 0; i < d.nseg; i++ {
			s := &d.segs[i]
			mem := l.lastMem
			if s.id != l.lastID {
				l.peerMu.Lock()
				m, ok := l.peer[s.id]
				l.peerMu.Unlock()
				if !ok {
					l.hostile(fmt.Errorf("%w: %s names arena %d, never handed over", errBadFrame, d.kind, s.id))
					return false
				}
				l.lastID, l.lastMem, mem = s.id, m, m
			}
			if s.off > uint64(len(mem)) || uint64(s.n) > uint64(len(mem))-s.off {
				l.hostile(fmt.Errorf("%w: %s segment [%d,+%d) outside arena %d of %d bytes", errBadFrame, d.kind, s.off, s.n, s.id, len(mem)))
				return false
			}
			l.rpieces[i] = mem[s.off : s.off+uint64(s.n) : s.off+uint64(s.n)]
		}
		pkt.pieces = l.rpieces[:d.nseg]
	}
	if isReq {
		l.q.onRequest(pkt)
	} else {
		l.q.onResponse(pkt)
	}
	return true
}

// awaitMaps waits until the peer's MAP messages sent before a descriptor
// have been mapped here.
func (l *shmLink) awaitMaps(seq uint32) bool {
	if int32(seq-l.mapsRecv.Load()) <= 0 {
		return true
	}
	t := time.NewTimer(shmMapWait)
	defer t.Stop()
	for int32(seq-l.mapsRecv.Load()) > 0 {
		select {
		case <-l.mapped:
		case <-l.quit:
			return false
		case <-l.gone:
			if int32(seq-l.mapsRecv.Load()) > 0 {
				l.disconnect(l.goneErr)
				return false
			}
		case <-t.C:
			l.hostile(fmt.Errorf("%w: descriptor waits for arena hand-over %d, %d received", errBadFrame, seq, l.mapsRecv.Load()))
			return false
		}
	}
	return true
}
