package emu

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// onRequest is the responder: it executes a peer's request against this
// QP's receive queue and this device's memory, and answers. Requests are
// delivered by one goroutine per connection (the peer's requester on the
// loop wire, the reader on the tcp wire), so the responder's answer packet
// and buffer are never shared.
func (q *qp) onRequest(pkt *packet) {
	q.mu.Lock()
	switch {
	case q.closed, q.link == nil:
		q.unlock()
		return
	case q.state != transport.QPRTR && q.state != transport.QPRTS && q.state != transport.QPSQD:
		// A QP in ERR (or RESET) does not answer; the requester retries
		// into silence and reports RETRY_EXC_ERR.
		q.unlock()
		return
	}
	resp := &q.respPkt
	*resp = packet{kind: pktAck, psn: pkt.psn}
	l := q.link
	if pkt.psn != q.expPSN {
		if int32(pkt.psn-q.expPSN) > 0 {
			// Beyond a NAKed request: dropped until the requester goes back.
			q.unlock()
			return
		}
		// Duplicate: answer again without re-executing, except READ, which
		// is re-executed against the memory's current state (IBA 9.5
		// duplicate READ handling; docs/registration.md#duplicate-packets).
		q.dev.p.counters.duplicates.Add(1)
		if pkt.kind == pktRead {
			q.readLocked(pkt, resp, true)
		}
		q.answer(l, resp)
		return
	}
	q.replay.set = false // a new request closes the last one's window
	switch pkt.kind {
	case pktSend:
		if !q.sendLocked(pkt, resp) {
			q.answer(l, resp) // RNR: expPSN stays, the request comes again
			return
		}
	case pktWrite:
		if !q.writeLocked(pkt, resp) {
			q.answer(l, resp)
			return
		}
	case pktRead:
		if q.conn.credit.In == 0 {
			// The connection agreed to serve no READs (its responder
			// resources, max_dest_rd_atomic, are 0): IBA 9.7.5.2.8
			// class C, invalid request, as rxe_resp.c's
			// check_resource answers it (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
			// The requester, which gates its READs by its own credit
			// (requester.go), never sends one; a hostile peer does.
			resp.kind, resp.nak = pktNak, nakInvReq
			q.responderErrLocked(transport.EventQPReqErr, transport.StatusRemInvReqErr, "RDMA READ on a connection that serves none (READ credit 0)")
			break
		}
		q.readLocked(pkt, resp, false)
	default:
		q.unlock()
		return
	}
	q.expPSN++
	if q.withhold > 0 && resp.kind == pktAck && !q.respErr.set {
		q.withhold--
		q.unlock()
		return
	}
	q.answer(l, resp)
}

// respErr is a responder error whose flush and event wait for its NAK.
type respErr struct {
	set    bool
	ev     transport.EventType
	reason string
}

// responderErrLocked moves the responder to ERR after a request it could
// not serve (rxe_resp.c error classes). The state changes at once, so the
// failed receive's completion and the ERR state are seen together, but
// the flush of the other WRs and the async event wait until the NAK is
// sent (answer): rxe_resp.c sends the NAK from the responder task and
// only then flushes the queues. Flushing first let a consumer see its
// receives flush, tear the connection down and lose the NAK, leaving the
// requester with WR_FLUSH_ERR instead of the status that names the fault.
func (q *qp) responderErrLocked(ev transport.EventType, status transport.Status, reason string) {
	q.dev.p.log.Debug("responder error", "qp", q.num, "status", status, "reason", reason)
	if q.enterErrLocked(status, reason) {
		q.respErr = respErr{set: true, ev: ev, reason: reason}
	}
}

// answer unlocks the QP and sends resp; after a responder error it then
// flushes the queues and raises the async event, unless the device raises
// none (Quirks.NoQPErrorEvents: rxe, where the error shows only in
// completions).
func (q *qp) answer(l link, resp *packet) {
	if !q.respErr.set {
		q.unlock()
		l.sendResponse(resp)
		return
	}
	e := q.respErr
	q.respErr = respErr{}
	q.unlock()
	l.sendResponse(resp)
	q.mu.Lock()
	if q.state == transport.QPErr { // not reset by the consumer meanwhile
		q.flushLocked()
	}
	q.unlock()
	if !q.dev.p.quirks.NoQPErrorEvents {
		q.dev.event(transport.AsyncEvent{Type: e.ev, QPNum: q.num, Reason: e.reason})
	}
}

// takeRecvLocked pops the oldest posted receive, or reports RNR.
func (q *qp) takeRecvLocked(resp *packet) (*rwqe, bool) {
	if q.rqHead == q.rqTail {
		resp.kind, resp.nak = pktNak, nakRNR
		return nil, false
	}
	r := &q.rq[q.rqHead%uint64(len(q.rq))]
	q.rqHead++
	return r, true
}

// recvDoneLocked reports a consumed receive; seq numbers its completion
// in the receive CQ (cq.push).
func (q *qp) recvDoneLocked(r *rwqe, wc *transport.WC) (seq uint64) {
	wc.ID = r.id
	wc.QPNum = q.num
	if wc.Status != transport.StatusSuccess {
		q.scrambleLocked(wc)
	}
	return q.pushLocked(q.recvCQ, wc)
}

func (q *qp) sendLocked(pkt *packet, resp *packet) bool {
	d := q.dev
	r, ok := q.takeRecvLocked(resp)
	if !ok {
		return false
	}
	n := pkt.dataLen()
	if uint64(n) > transport.SGLLen(r.sgl) {
		// IBA: LOC_LEN_ERR here, an invalid-request NAK to the sender
		// (REM_INV_REQ_ERR). Under Quirks.RecvLenErrStatus the receive
		// WQE counts as malformed (rxe: LOC_QP_OP_ERR here, a remote
		// operational error NAK, REM_OP_ERR at the sender).
		st, nak := transport.StatusLocLenErr, nakInvReq
		if s := d.p.quirks.RecvLenErrStatus; s != transport.StatusSuccess {
			st, nak = s, nakRemOp
		}
		q.recvDoneLocked(r, &transport.WC{Status: st})
		resp.kind, resp.nak = pktNak, nak
		q.responderErrLocked(transport.EventQPFatal, st,
			fmt.Sprintf("SEND of %d bytes into a %d-byte receive", n, transport.SGLLen(r.sgl)))
		return true
	}
	if bad := q.scatter(r.sgl, pkt); bad != nil {
		st := d.sgeStatus(bad)
		q.recvDoneLocked(r, &transport.WC{Status: st})
		resp.kind, resp.nak = pktNak, nakRemOp
		q.responderErrLocked(transport.EventQPFatal, st, "receive buffer: "+bad.reason)
		return true
	}
	wc := transport.WC{Status: transport.StatusSuccess, Opcode: transport.WCRecv, ByteLen: uint32(n)}
	if pkt.flags&pfImm != 0 {
		wc.Flags |= transport.WCWithImm
		wc.Imm = pkt.imm
	}
	if pkt.flags&pfInv != 0 {
		// The device invalidates before it reports the receive
		// (IB_WC_WITH_INVALIDATE). A bad key fails the receive with
		// REM_INV_REQ_ERR and moves this QP to ERR; the sender is not
		// told (rdma-unit-test NoNakOnSendInvalidateErrors).
		d.mem.Lock()
		err := d.invalidateLocked(q, pkt.key, true)
		d.mem.Unlock()
		if err != nil {
			q.recvDoneLocked(r, &transport.WC{Status: transport.StatusRemInvReqErr})
			q.responderErrLocked(transport.EventQPReqErr, transport.StatusRemInvReqErr, "SEND_WITH_INV: "+err.reason)
			return true
		}
		wc.Flags |= transport.WCWithInv
		wc.InvalidatedKey = pkt.key
	}
	q.keepReplayLocked(pkt, q.recvDoneLocked(r, &wc))
	return true
}

func (q *qp) writeLocked(pkt *packet, resp *packet) bool {
	d := q.dev
	var r *rwqe
	if pkt.flags&pfImm != 0 {
		var ok bool
		if r, ok = q.takeRecvLocked(resp); !ok {
			return false
		}
	}
	n := uint64(pkt.dataLen())
	if n > 0 {
		d.mem.RLock()
		dst, bad := d.checkRemoteLocked(q, pkt.key, pkt.va, n, transport.AccessRemoteWrite)
		if bad == "" {
			pkt.gather(dst)
		}
		d.mem.RUnlock()
		if bad != "" {
			d.p.counters.remoteAccessErrors.Add(1)
			resp.kind, resp.nak = pktNak, nakAccess
			if r != nil {
				q.recvDoneLocked(r, &transport.WC{Status: transport.StatusRemAccessErr})
			}
			q.responderErrLocked(transport.EventQPAccessErr, transport.StatusRemAccessErr, "RDMA WRITE: "+bad)
			return true
		}
	}
	if r != nil {
		q.recvDoneLocked(r, &transport.WC{Status: transport.StatusSuccess, Opcode: transport.WCRecvRDMAWithImm,
			ByteLen: uint32(n), Flags: transport.WCWithImm, Imm: pkt.imm})
	}
	return true
}

func (q *qp) readLocked(pkt *packet, resp *packet, dup bool) {
	d := q.dev
	n := uint64(pkt.length)
	resp.kind = pktReadResp
	if n == 0 {
		return
	}
	var bad string
	if sl, ok := q.link.(*shmLink); ok {
		d.mem.RLock()
		a, off, why := d.remoteRangeLocked(q, pkt.key, pkt.va, n, transport.AccessRemoteRead)
		if bad = why; bad == "" {
			if dup {
				// The requester may be done with this READ and its
				// sinks: it copies the bytes itself if it still
				// waits for them (its PSN check).
				q.respSeg[0] = seg{arena: a, off: off, n: int(n)}
				resp.segs = q.respSeg[:]
			} else {
				// Place the data now, as it is at execution time.
				sl.place(pkt.pieces, a.Bytes()[off:off+int(n)])
				resp.placed = true
				resp.length = uint32(n)
			}
		}
		d.mem.RUnlock()
	} else {
		// Copied under the shared lock, as every access through a remote
		// key is: a key invalidated right after the check must not let
		// the memory's later contents out.
		if cap(q.respBuf) < int(n) {
			q.respBuf = make([]byte, n)
		}
		resp.payload = q.respBuf[:n]
		d.mem.RLock()
		src, why := d.checkRemoteLocked(q, pkt.key, pkt.va, n, transport.AccessRemoteRead)
		if bad = why; bad == "" {
			copy(resp.payload, src)
		}
		d.mem.RUnlock()
	}
	if bad != "" {
		d.p.counters.remoteAccessErrors.Add(1)
		resp.kind, resp.nak, resp.payload, resp.segs, resp.placed = pktNak, nakAccess, nil, nil, false
		if dup {
			bad = "duplicate " + bad
		}
		q.responderErrLocked(transport.EventQPAccessErr, transport.StatusRemAccessErr, "RDMA READ: "+bad)
	}
}
