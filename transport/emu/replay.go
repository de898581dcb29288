package emu

import "github.com/gosrp/gosrp/transport"

// replayReq is the SEND the responder carried out last, kept under
// Quirks.ReplayOnErr. rxe on Linux 6.12.95 carries the request it is
// completing as its QP enters ERR out again for every receive still posted
// (rxe_resp.c do_complete re-enters check_resource with the same packet);
// rxe's window is the few microseconds between executing the request and
// posting its completion, so the consumer cannot have seen it, let alone
// answered it. Here the window stays open while its completion waits in
// the CQ unpolled and no other request has arrived: wider than rxe's, and
// never wide enough to replay a request already answered.
type replayReq struct {
	set   bool
	seq   uint64 // its receive completion's number in the CQ (cq.push)
	flags uint8
	imm   uint32
	key   transport.Key
	data  []byte // reused from one SEND to the next
}

// keepReplayLocked remembers pkt, a SEND just carried out whose receive
// completion is seq, when the device replays at ERR.
func (q *qp) keepReplayLocked(pkt *packet, seq uint64) {
	if !q.dev.p.quirks.ReplayOnErr {
		return
	}
	rp := &q.replay
	n := pkt.dataLen()
	if cap(rp.data) < n {
		rp.data = make([]byte, n)
	}
	rp.data = rp.data[:n]
	pkt.gather(rp.data)
	rp.set, rp.seq, rp.flags, rp.imm, rp.key = true, seq, pkt.flags, pkt.imm, pkt.key
}

// replayLocked carries the kept SEND out again for every receive still
// posted, each a successful completion, as the QP enters ERR. A
// SEND_WITH_INV invalidates its key again: its window is FREE by then,
// and rxe's kernel oopses on that (rxe_do_invalidate_mw puts the
// window's NULL QP). The NIC counts it (Counters.KernelOopses) and logs
// it as an error; a consumer that lets a peer invalidate its keys on such
// a device fails the tests that check the count.
func (q *qp) replayLocked() {
	rp := &q.replay
	if !rp.set {
		return
	}
	rp.set = false
	if !q.recvCQ.unpolled(rp.seq) {
		return // the consumer has seen it: rxe's window has closed
	}
	d := q.dev
	pkt := packet{kind: pktSend, flags: rp.flags, imm: rp.imm, key: rp.key, payload: rp.data}
	for q.rqHead != q.rqTail {
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		if uint64(len(rp.data)) > transport.SGLLen(r.sgl) {
			return // rxe fails such a receive; the flush takes it and the rest
		}
		q.rqHead++
		if q.scatter(r.sgl, &pkt) != nil {
			q.recvDoneLocked(r, &transport.WC{Status: transport.StatusWRFlushErr})
			continue
		}
		wc := transport.WC{Status: transport.StatusSuccess, Opcode: transport.WCRecv, ByteLen: uint32(len(rp.data))}
		if rp.flags&pfImm != 0 {
			wc.Flags |= transport.WCWithImm
			wc.Imm = rp.imm
		}
		if rp.flags&pfInv != 0 {
			d.mem.Lock()
			if !d.oopsLocked(q, rp.key, "a SEND_WITH_INV replayed at ERR (Quirks.ReplayOnErr)") {
				d.invalidateLocked(q, rp.key, true)
			}
			d.mem.Unlock()
			wc.Flags |= transport.WCWithInv
			wc.InvalidatedKey = rp.key
		}
		d.p.counters.replays.Add(1)
		q.recvDoneLocked(r, &wc)
	}
}
