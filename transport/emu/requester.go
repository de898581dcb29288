package emu

import (
	"fmt"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// window bounds transmitted, unanswered network WRs per QP (the IB
// requester's outstanding-request limit).
const window = 64

// run is the QP's requester goroutine: it owns the retry timer and starts
// whatever the posting goroutine could not (work queued behind the window,
// a fence, or an RNR wait). Close stops it.
func (q *qp) run() {
	defer close(q.stopped)
	for {
		select {
		case <-q.stop:
			return
		case <-q.doorbell:
		case <-q.timer.C:
			q.mu.Lock()
			q.armedAt = time.Time{}
			q.mu.Unlock()
		}
		q.pump()
	}
}

// pump runs the requester in the calling goroutine unless another
// goroutine already does; then that one runs it once more. Work posted by
// ibv_post_send on an idle send queue thus goes out without a hand-off to
// the requester goroutine, as a hardware doorbell starts the NIC at once,
// while one goroutine at a time transmits, which keeps packets in PSN
// order and the staging buffers single-owner.
func (q *qp) pump() {
	q.mu.Lock()
	if q.pumping {
		q.pumpAgain = true
		q.mu.Unlock()
		return
	}
	q.pumping = true
	q.mu.Unlock()
	for {
		if l := q.progress(); l != nil {
			l.flush()
		}
		q.mu.Lock()
		if !q.pumpAgain {
			q.pumping = false
			q.mu.Unlock()
			return
		}
		q.pumpAgain = false
		q.mu.Unlock()
	}
}

// awaitingAnswers reports whether transmitted requests wait for answers.
func (q *qp) awaitingAnswers() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.inflight) > 0
}

// armLocked sets the timer for the earliest retry or RNR deadline.
func (q *qp) armLocked(now time.Time) {
	var at time.Time
	if len(q.inflight) > 0 {
		at = q.slot(q.inflight[0]).sentAt.Add(q.dev.p.cfg.RetryTimeout)
	}
	if !q.rnrUntil.IsZero() && (at.IsZero() || q.rnrUntil.Before(at)) {
		at = q.rnrUntil
	}
	// A timer armed for an earlier instant stays: firing early only makes
	// the requester look again, and re-arming on every packet is costly.
	if !at.IsZero() && (q.armedAt.IsZero() || at.Before(q.armedAt)) {
		q.armedAt = at
		q.timer.Reset(max(at.Sub(now), 0))
	}
}

// rewindLocked makes every transmitted WR from slot idx on go out again
// (go-back-N after an RNR NAK or a timeout). Local operations that already
// executed stay done, as IBA has it
// (docs/verbs.md#send-queue-ordering-and-fences), unless the device has
// Quirks.RetryRepeatsLocalOps: then they execute again, as rxe's
// req_retry and rxe_requester make them.
func (q *qp) rewindLocked(idx uint64) {
	q.dev.p.counters.retries.Add(1)
	for _, i := range q.inflight {
		q.slot(i).state = wqeQueued
	}
	if q.dev.p.quirks.RetryRepeatsLocalOps {
		for i := idx; i < q.sqNext; i++ {
			if w := q.slot(i); w.wr.Opcode.IsLocal() && w.state == wqeDone && w.status == transport.StatusSuccess {
				w.state, w.repeat = wqeQueued, true
			}
		}
	}
	q.inflight = q.inflight[:0]
	q.sqNext = idx
}

func (q *qp) readInflightLocked() bool {
	for _, i := range q.inflight {
		if q.slot(i).wr.Opcode == transport.OpRDMARead {
			return true
		}
	}
	return false
}

// readsInflightLocked counts the transmitted RDMA READs without their
// response, which hold the connection's READ credit.
func (q *qp) readsInflightLocked() int {
	n := 0
	for _, i := range q.inflight {
		if q.slot(i).wr.Opcode == transport.OpRDMARead {
			n++
		}
	}
	return n
}

// progress starts every WR it can, in order; it returns the link it sent
// packets on, which the caller then flushes, or nil.
func (q *qp) progress() (sent link) {
	p := q.dev.p
	// One clock reading per pass: a burst of WRs shares its send time
	// (time.Now costs about 70 ns on this kind of VM, per WR it showed
	// in profiles).
	now := time.Now()
	for {
		q.mu.Lock()
		if q.closed || q.state != transport.QPRTS || q.link == nil {
			q.unlock()
			return
		}
		if len(q.inflight) > 0 {
			w := q.slot(q.inflight[0])
			if now.Sub(w.sentAt) >= p.cfg.RetryTimeout {
				if w.retries >= p.cfg.RetryCount {
					q.inflight = q.inflight[:0]
					q.endLocked(w, transport.StatusRetryExcErr, fmt.Sprintf("no answer from the peer after %d retries", w.retries))
					q.retireLocked()
					q.unlock()
					continue
				}
				w.retries++
				q.rewindLocked(q.inflight[0])
			}
		}
		if !q.rnrUntil.IsZero() {
			if now.Before(q.rnrUntil) {
				q.armLocked(now)
				q.unlock()
				return
			}
			q.rnrUntil = time.Time{}
		}
		if q.blocked || q.sqNext == q.sqTail {
			q.armLocked(now)
			q.unlock()
			return
		}
		idx := q.sqNext
		w := q.slot(idx)
		if w.state == wqeDone {
			q.sqNext++ // executed before a rewind
			q.unlock()
			continue
		}
		op := w.wr.Opcode
		if w.wr.Flags&transport.FlagFence != 0 {
			// One FENCE bit: on LOCAL_INV the Local Invalidate Fence
			// (wait for every earlier WR), otherwise wait for earlier
			// RDMA READs (IBA 10.8.3.3 as cited in rxe_wqe_is_fenced).
			if (op == transport.OpLocalInv && q.sqDone != idx) || (op != transport.OpLocalInv && q.readInflightLocked()) {
				q.armLocked(now)
				q.unlock()
				return
			}
		}
		if op == transport.OpRDMARead && q.readsInflightLocked() >= q.conn.credit.Out {
			// No READ credit left (the connection's initiator_depth): the
			// READ, and the queue behind it, waits for an earlier READ's
			// response; with no credit at all, for ever, as the kernel's
			// rxe_requester waits for rd_atomic.
			q.armLocked(now)
			q.unlock()
			return
		}
		if !op.IsLocal() && len(q.inflight) >= window {
			q.armLocked(now)
			q.unlock()
			return
		}
		first := w.sentAt.IsZero()
		if first {
			if q.errAfter == 0 || p.chance(p.cfg.Faults.QPError) {
				q.errAfter = -1
				p.counters.injectedQPErrors.Add(1)
				q.failInflightLocked("injected QP error")
				q.toErrLocked(transport.StatusGeneralErr, fmt.Sprintf("injected QP error before WR %#x (seed %d)", w.wr.ID, p.cfg.Seed))
				q.dev.event(transport.AsyncEvent{Type: transport.EventQPFatal, QPNum: q.num, Reason: "injected"})
				q.unlock()
				return
			}
			if q.errAfter > 0 {
				q.errAfter--
			}
		}
		q.sqNext++
		if op.IsLocal() {
			w.sentAt = now
			repeat := w.repeat
			w.repeat = false
			if !repeat && len(q.inflight) > 0 {
				p.counters.exposedLocalOps.Add(1)
			}
			q.mu.Unlock()
			if repeat {
				p.counters.repeatedLocalOps.Add(1)
			}
			err := q.execLocal(w, repeat)
			q.mu.Lock()
			if idx >= q.sqDone && w.state != wqeDone {
				if err != nil {
					q.failLocalLocked(w, err)
				} else {
					w.state = wqeDone
				}
				q.retireLocked()
			}
			q.unlock()
			continue
		}
		if first {
			w.psn = q.nextPSN
			q.nextPSN++
		}
		pkt, bad := q.buildRequestLocked(w)
		if bad != nil {
			q.failLocalLocked(w, bad)
			q.retireLocked()
			q.unlock()
			continue
		}
		w.state = wqeSent
		w.sentAt = now
		q.inflight = append(q.inflight, idx)
		l := q.link
		dup := q.dupNext == 0 || p.chance(p.cfg.Faults.Duplicate)
		if q.dupNext >= 0 {
			q.dupNext--
		}
		cut := p.chance(p.cfg.Faults.LinkCut)
		var delay time.Duration
		if p.chance(p.cfg.Faults.Delay) {
			delay = p.randDuration(p.cfg.Faults.MaxDelay)
		}
		q.unlock()
		if cut {
			p.counters.linkCuts.Add(1)
			l.disconnect(fmt.Errorf("emu: injected link cut (seed %d): %w", p.cfg.Seed, transport.ErrDisconnected))
			continue
		}
		if delay > 0 {
			time.Sleep(delay) // the wire is in order: a late packet holds up the ones behind it
			now = time.Now()
		}
		l.sendRequest(pkt)
		sent = l
		if dup {
			p.counters.duplicates.Add(1)
			l.sendRequest(pkt)
		}
	}
}

// buildRequestLocked describes the WR as a packet whose payload is the
// checked source memory itself (pieces). It fails if a local SGE is bad: the
// sinks of a READ with LOC_PROT_ERR, the sources of a SEND or WRITE with
// device.sgeStatus. REQUIRES: q.mu.
func (q *qp) buildRequestLocked(w *wqe) (*packet, *opError) {
	wr := &w.wr
	pkt := &q.txPkt
	*pkt = packet{psn: w.psn, key: wr.RKey, va: wr.RemoteAddr, imm: wr.Imm}
	switch wr.Opcode {
	case transport.OpSend, transport.OpSendWithImm, transport.OpSendWithInv:
		pkt.kind = pktSend
		if wr.Opcode == transport.OpSendWithImm {
			pkt.flags |= pfImm
		}
		if wr.Opcode == transport.OpSendWithInv {
			pkt.flags |= pfInv
			pkt.key = wr.InvalidateKey
		}
	case transport.OpRDMAWrite, transport.OpRDMAWriteWithImm:
		pkt.kind = pktWrite
		if wr.Opcode == transport.OpRDMAWriteWithImm {
			pkt.flags |= pfImm
		}
	case transport.OpRDMARead:
		pkt.kind = pktRead
		n := transport.SGLLen(wr.SGL)
		pkt.length = uint32(n)
		// Check the sinks now so a bad lkey fails before the peer is asked.
		if q.link.direct() {
			// The responder's NIC places the data itself: name the sinks.
			segs, bad := q.segsLocked(wr.SGL, true)
			if bad != nil {
				return nil, &opError{status: transport.StatusLocProtErr, reason: bad.reason, sink: true}
			}
			pkt.segs = segs
			return pkt, nil
		}
		d := q.dev
		d.mem.RLock()
		defer d.mem.RUnlock()
		for _, s := range wr.SGL {
			if _, bad := d.checkLocalLocked(q, s, true); bad != nil {
				return nil, &opError{status: transport.StatusLocProtErr, reason: bad.reason, sink: true}
			}
		}
		return pkt, nil
	}
	if wr.Flags&transport.FlagSolicited != 0 {
		pkt.flags |= pfSolicited
	}
	if wr.Flags&transport.FlagInline != 0 {
		pkt.payload = w.inline
		return pkt, nil
	}
	if q.link.direct() {
		// The peer's NIC reads the sources itself: name them.
		segs, bad := q.segsLocked(wr.SGL, false)
		if bad != nil {
			return nil, &opError{status: q.dev.sgeStatus(bad), reason: bad.reason}
		}
		pkt.segs = segs
		return pkt, nil
	}
	// The link copies the sources into its frame itself (pieces): no
	// staging copy here.
	d := q.dev
	d.mem.RLock()
	defer d.mem.RUnlock()
	pieces := q.txPieces[:0]
	for _, s := range wr.SGL {
		src, bad := d.checkLocalLocked(q, s, false)
		if bad != nil {
			return nil, &opError{status: d.sgeStatus(bad), reason: bad.reason}
		}
		if len(src) > 0 {
			pieces = append(pieces, src)
		}
	}
	q.txPieces = pieces
	pkt.pieces = pieces
	return pkt, nil
}

// segsLocked checks an SGL and names its memory for a direct link, merging
// SGEs that are contiguous in one arena. REQUIRES: q.mu.
func (q *qp) segsLocked(sgl []transport.SGE, write bool) ([]seg, *sgeErr) {
	d := q.dev
	d.mem.RLock()
	defer d.mem.RUnlock()
	if q.txSegs == nil {
		q.txSegs = make([]seg, 0, maxSGE)
	}
	segs := q.txSegs[:0]
	for _, s := range sgl {
		a, off, bad := d.localRangeLocked(q, s, write)
		if bad != nil {
			return nil, bad
		}
		if s.Length == 0 {
			continue
		}
		if k := len(segs) - 1; k >= 0 && segs[k].arena == a && segs[k].off+segs[k].n == off {
			segs[k].n += int(s.Length)
			continue
		}
		segs = append(segs, seg{arena: a, off: off, n: int(s.Length)})
	}
	return segs, nil
}

// execLocal runs a memory operation on the device; repeat says a retry
// runs it again (Quirks.RetryRepeatsLocalOps).
func (q *qp) execLocal(w *wqe, repeat bool) *opError {
	d := q.dev
	d.mem.Lock()
	defer d.mem.Unlock()
	wr := &w.wr
	switch wr.Opcode {
	case transport.OpLocalInv:
		if repeat {
			if done, err := d.repeatInvalidateLocked(q, wr.InvalidateKey); done {
				return err
			}
		}
		return d.invalidateLocked(q, wr.InvalidateKey, false)
	case transport.OpRegMR:
		f := wr.Reg.MR.(*frmr)
		return d.execRegLocked(q, f.o, wr.Reg.Key, wr.Reg.Access, w.regMap)
	case transport.OpBindMW:
		m := wr.Bind.MR.(*mr)
		return d.execBindLocked(q, wr.Bind.MW.(*mw).o, wr.Bind.Key, m.o, wr.Bind.Addr, wr.Bind.Length, wr.Bind.Access)
	}
	return &opError{status: transport.StatusLocQPOpErr, reason: "unknown local operation"}
}

// onResponse handles the peer responder's answer to the oldest transmitted
// request. Answers to anything else are stale (duplicates) and ignored.
func (q *qp) onResponse(pkt *packet) {
	p := q.dev.p
	q.mu.Lock()
	if q.closed || (q.state != transport.QPRTS && q.state != transport.QPSQD) || len(q.inflight) == 0 {
		q.unlock()
		return
	}
	idx := q.inflight[0]
	w := q.slot(idx)
	if pkt.kind == pktAck && int32(pkt.psn-w.psn) > 0 && int32(pkt.psn-q.nextPSN) < 0 {
		// A coalesced ACK (IBA 9.7.5.1.2) acknowledges the SENDs and
		// WRITEs before its PSN as well (rxe_comp.c check_psn). A READ
		// among them is not: its data comes only in its response, so
		// the ACK implies the response was lost, and the retry timer
		// sends the READ again. An ACK for a PSN never sent is stale or
		// forged and acknowledges nothing.
		for w.psn != pkt.psn {
			if int32(pkt.psn-w.psn) < 0 || w.state != wqeSent || w.wr.Opcode == transport.OpRDMARead {
				q.retireUnlock()
				return
			}
			w.byteLen = uint32(transport.SGLLen(w.wr.SGL))
			q.ackedLocked(w, transport.StatusSuccess, "")
			if len(q.inflight) == 0 {
				q.retireUnlock()
				return
			}
			idx = q.inflight[0]
			w = q.slot(idx)
		}
	}
	if w.psn != pkt.psn || w.state != wqeSent {
		q.unlock()
		return
	}
	status := transport.StatusSuccess
	var reason string
	switch pkt.kind {
	case pktAck:
		w.byteLen = uint32(transport.SGLLen(w.wr.SGL))
	case pktReadResp:
		if pkt.placed {
			// The responder's NIC wrote the sinks before answering.
			w.byteLen = uint32(transport.SGLLen(w.wr.SGL))
			break
		}
		if bad := q.scatter(w.wr.SGL, pkt); bad != nil {
			status, reason = transport.StatusLocProtErr, bad.reason
		}
		w.byteLen = uint32(pkt.dataLen())
	case pktNak:
		switch pkt.nak {
		case nakRNR:
			w.rnr++
			if p.cfg.RNRRetry >= RNRRetryForever || w.rnr <= p.cfg.RNRRetry {
				q.rewindLocked(idx)
				q.rnrUntil = time.Now().Add(p.cfg.RNRTimeout)
				q.unlock()
				q.kick()
				return
			}
			status, reason = transport.StatusRNRRetryExcErr, fmt.Sprintf("receiver not ready after %d retries", p.cfg.RNRRetry)
		case nakAccess:
			status, reason = transport.StatusRemAccessErr, "peer NAK: remote access error"
		case nakInvReq:
			status, reason = transport.StatusRemInvReqErr, "peer NAK: invalid request"
		default:
			status, reason = transport.StatusRemOpErr, "peer NAK: remote operational error"
		}
	default:
		q.unlock()
		return
	}
	q.ackedLocked(w, status, reason)
	q.retireUnlock()
}

// retireUnlock reports the requests that are done and releases q.mu.
func (q *qp) retireUnlock() {
	q.retireLocked()
	// The requester goroutine is needed only if work waits behind the
	// window or a fence; an idle send queue has nothing to start.
	waiting := q.sqNext != q.sqTail
	q.unlock()
	if waiting {
		q.kick()
	}
}

// ackedLocked ends the oldest request in flight, w, with status; a
// failed one takes the rest of the window with it. REQUIRES: q.mu.
func (q *qp) ackedLocked(w *wqe, status transport.Status, reason string) {
	copy(q.inflight, q.inflight[1:])
	q.inflight = q.inflight[:len(q.inflight)-1]
	q.endLocked(w, status, reason)
	if status != transport.StatusSuccess {
		q.inflight = q.inflight[:0]
	}
}

// failLocalLocked ends w, which failed at the requester, with its
// error's status, or with WR_FLUSH_ERR where the device reports such a
// failure as a flush (Quirks.LocalErrFlushed: rxe on Linux 6.12).
// REQUIRES: q.mu.
func (q *qp) failLocalLocked(w *wqe, err *opError) {
	if q.dev.p.quirks.LocalErrFlushed && !err.sink {
		q.endLocked(w, transport.StatusWRFlushErr, err.reason+" (reported as a flush: Quirks.LocalErrFlushed)")
		return
	}
	q.endLocked(w, err.status, err.reason)
}

// endLocked ends w with status. A failed WQE blocks the send queue:
// nothing after it is sent or completed but by the flush, as a send
// queue error stops a real QP's send queue at the failed WR.
// REQUIRES: q.mu.
func (q *qp) endLocked(w *wqe, status transport.Status, reason string) {
	w.state = wqeDone
	w.status, w.reason = status, reason
	if status != transport.StatusSuccess {
		q.blocked = true
	}
}

// scatter copies a message's bytes into local sinks, checking each sink
// it reaches. REQUIRES: q.mu.
func (q *qp) scatter(sgl []transport.SGE, p *packet) *sgeErr {
	d := q.dev
	d.mem.RLock()
	defer d.mem.RUnlock()
	src, rest := p.payload, p.pieces
	for _, s := range sgl {
		for len(src) == 0 && len(rest) > 0 {
			src, rest = rest[0], rest[1:]
		}
		if len(src) == 0 {
			break
		}
		dst, bad := d.checkLocalLocked(q, s, true)
		if bad != nil {
			return bad
		}
		for len(dst) > 0 {
			if len(src) == 0 {
				if len(rest) == 0 {
					break
				}
				src, rest = rest[0], rest[1:]
				continue
			}
			n := copy(dst, src)
			dst, src = dst[n:], src[n:]
		}
	}
	return nil
}
