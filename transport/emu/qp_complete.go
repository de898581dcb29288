package emu

// A QP's completions and its error state: completing and retiring send
// WRs, entering ERR, and flushing both queues.

import (
	"time"

	"github.com/gosrp/gosrp/transport"
)

func (q *qp) pushLocked(c *cq, wc *transport.WC) (seq uint64) {
	v, seq := c.push(wc)
	if v != nil {
		q.victims = append(q.victims, v...)
		q.overrun = append(q.overrun, c)
	}
	return seq
}

// completeSendLocked reports one finished send WR. Errors always complete;
// successes only when signaled (IBA 10.8.6, ibv_post_send(3)).
func (q *qp) completeSendLocked(w *wqe) {
	p := q.dev.p
	if w.wr.ID == StrayWRID && q.stray != nil {
		q.stray <- w.status
		q.stray = nil
	}
	if w.status == transport.StatusSuccess && !w.signaled {
		return
	}
	wc := transport.WC{ID: w.wr.ID, Status: w.status, QPNum: q.num}
	if w.status == transport.StatusSuccess {
		if q.statusCQE == 0 {
			q.statusCQE = -1
			wc.Status = q.statusSet
			w.status = q.statusSet
			p.counters.corruptedCQEs.Add(1)
		} else if q.statusCQE > 0 {
			q.statusCQE--
		} else if p.chance(p.cfg.Faults.CorruptCQE) {
			wc.Status = transport.StatusGeneralErr
			w.status = wc.Status
			p.counters.corruptedCQEs.Add(1)
		}
	}
	if wc.Status == transport.StatusSuccess {
		wc.Opcode = wcOpcode(w.wr.Opcode)
		wc.ByteLen = w.byteLen
	} else {
		q.scrambleLocked(&wc)
	}
	if q.dropCQE == 0 {
		q.dropCQE = -1
		p.counters.droppedCQEs.Add(1)
		return
	} else if q.dropCQE > 0 {
		q.dropCQE--
	}
	if p.chance(p.cfg.Faults.DropCQE) {
		p.counters.droppedCQEs.Add(1)
		return
	}
	q.pushLocked(q.sendCQ, &wc)
}

// scrambleLocked fills the fields of an error completion that ibv_poll_cq(3)
// calls undefined with garbage on devices that do so.
func (q *qp) scrambleLocked(wc *transport.WC) {
	if !q.dev.p.quirks.ScrambleErrorWC {
		return
	}
	r := q.dev.p.randUint32()
	wc.Opcode = transport.WCOpcode(r % 10)
	wc.ByteLen = r
	wc.Flags = transport.WCFlags(r >> 8)
	wc.Imm = ^r
	wc.InvalidatedKey = transport.Key(r * 2654435761)
}

func wcOpcode(o transport.Opcode) transport.WCOpcode {
	switch o {
	case transport.OpRDMAWrite, transport.OpRDMAWriteWithImm:
		return transport.WCRDMAWrite
	case transport.OpRDMARead:
		return transport.WCRDMARead
	case transport.OpLocalInv:
		return transport.WCLocalInv
	case transport.OpRegMR:
		return transport.WCRegMR
	case transport.OpBindMW:
		return transport.WCBindMW
	}
	return transport.WCSend
}

// retireLocked reports finished WRs from the head in posting order. A
// failed WR moves the QP to ERR after it has been reported.
func (q *qp) retireLocked() {
	for q.sqDone < q.sqNext {
		w := q.slot(q.sqDone)
		if w.state != wqeDone {
			break
		}
		q.completeSendLocked(w)
		q.sqDone++
		if w.signaled || w.status != transport.StatusSuccess {
			// A completion frees this slot and every unsignaled one
			// before it (docs/verbs.md#completions).
			q.sqHead = q.sqDone
		}
		if w.status != transport.StatusSuccess {
			q.toErrLocked(w.status, w.reason)
			return
		}
	}
	q.maybeDrainedLocked()
}

func (q *qp) maybeDrainedLocked() {
	if q.state == transport.QPSQD && q.drainEv && q.sqDone == q.sqNext {
		q.drainEv = false
		q.dev.event(transport.AsyncEvent{Type: transport.EventSQDrained, QPNum: q.num})
	}
}

// toErrLocked moves the QP to ERR and flushes both queues in order
// (IBA 10.3.1; rxe flush_send_queue). status is the error that caused it
// (0 for a consumer's modify), for the async event and log.
func (q *qp) toErrLocked(status transport.Status, reason string) {
	if q.enterErrLocked(status, reason) {
		q.flushLocked()
	}
}

// enterErrLocked is the state change of toErrLocked without the flush; it
// reports false if the QP was in ERR already. A QP in ERR answers no
// request, and a post to it flushes both queues in order (postOneLocked),
// so until flushLocked runs only the flush completions are held back.
func (q *qp) enterErrLocked(status transport.Status, reason string) bool {
	if q.state == transport.QPErr {
		return false
	}
	prev := q.state
	q.state = transport.QPErr
	if q.link != nil {
		q.link.closeSinks()
	}
	if status != transport.StatusSuccess || reason != "" {
		q.dev.p.log.Debug("qp to ERR", "qp", q.num, "from", prev, "status", status, "reason", reason)
	}
	q.blocked = false
	q.rnrUntil = time.Time{}
	q.replayLocked()
	return true
}

// flushLocked completes both queues' outstanding WRs with WR_FLUSH_ERR.
func (q *qp) flushLocked() {
	q.flushSendLocked()
	q.flushRecvLocked()
}

// flushSendLocked completes every unreported send WR with WR_FLUSH_ERR,
// signaled or not. On devices with PoisonOnFlush, memory objects named by
// flushed memory operations are left unusable until deregistered.
func (q *qp) flushSendLocked() {
	d := q.dev
	poison := d.p.quirks.PoisonOnFlush
	for q.sqDone < q.sqTail {
		w := q.slot(q.sqDone)
		w.status = transport.StatusWRFlushErr
		w.state = wqeDone
		d.p.counters.flushed.Add(1)
		if poison && w.wr.Opcode.IsLocal() {
			d.mem.Lock()
			switch w.wr.Opcode {
			case transport.OpRegMR:
				w.wr.Reg.MR.(*frmr).o.poisoned = true
			case transport.OpBindMW:
				w.wr.Bind.MW.(*mw).o.poisoned = true
			case transport.OpLocalInv:
				if o := d.objLocked(w.wr.InvalidateKey); o != nil && o.kind != kindMR {
					o.poisoned = true
				}
			}
			d.mem.Unlock()
		}
		q.completeSendLocked(w)
		q.sqDone++
	}
	q.sqHead, q.sqNext = q.sqTail, q.sqTail
	q.inflight = q.inflight[:0]
}

func (q *qp) flushRecvLocked() {
	for q.rqHead < q.rqTail {
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		wc := transport.WC{ID: r.id, Status: transport.StatusWRFlushErr, QPNum: q.num}
		q.scrambleLocked(&wc)
		q.dev.p.counters.flushed.Add(1)
		q.pushLocked(q.recvCQ, &wc)
		q.rqHead++
	}
}

// fatal moves the QP to ERR from outside (overrun, link cut, injected) and
// raises the async event.
func (q *qp) fatal(ev transport.EventType, reason string) {
	q.mu.Lock()
	if q.state != transport.QPErr && q.state != transport.QPReset && !q.closed {
		q.failInflightLocked(reason)
		q.toErrLocked(transport.StatusGeneralErr, reason)
		q.dev.event(transport.AsyncEvent{Type: ev, QPNum: q.num, Reason: reason})
	}
	q.unlock()
}

// failInflightLocked gives the oldest transmitted WR RETRY_EXC_ERR when the
// wire is gone (the requester would have retried into silence).
func (q *qp) failInflightLocked(reason string) {
	if len(q.inflight) == 0 {
		return
	}
	// Everything before the oldest in-flight WR is done; report those,
	// then that one with its real status, then flush the rest.
	w := q.slot(q.inflight[0])
	w.state = wqeDone
	w.status = transport.StatusRetryExcErr
	w.reason = reason
	for q.sqDone < q.sqNext && q.slot(q.sqDone).state == wqeDone {
		x := q.slot(q.sqDone)
		q.completeSendLocked(x)
		q.sqDone++
		if x == w {
			break
		}
	}
}
