package emu

// Posting work to a QP: PostSend's checks of each work request against
// the QP's state and limits, and PostRecv.

import (
	"fmt"
	"time"

	"github.com/gosrp/gosrp/transport"
)

func (q *qp) PostSend(wrs []transport.SendWR) (int, error) {
	q.mu.Lock()
	for i := range wrs {
		if err := q.postOneLocked(&wrs[i], i); err != nil {
			q.unlock()
			q.pump() // what was accepted runs (bad_wr contract)
			return i, err
		}
	}
	q.unlock()
	q.pump()
	return len(wrs), nil
}

func (q *qp) postOneLocked(wr *transport.SendWR, i int) error {
	p := q.dev.p
	if q.closed {
		return fmt.Errorf("emu: post send: %w", transport.ErrClosed)
	}
	if q.postFail == i {
		q.postFail = -1
		p.counters.postFailures.Add(1)
		return fmt.Errorf("emu: post send WR %d on qp %d (injected): %w", i, q.num, transport.ErrQueueFull)
	}
	if p.chance(p.cfg.Faults.PostFail) {
		p.counters.postFailures.Add(1)
		return fmt.Errorf("emu: post send WR %d on qp %d (random fault, seed %d): %w", i, q.num, p.cfg.Seed, transport.ErrQueueFull)
	}
	if err := q.validateLocked(wr); err != nil {
		return fmt.Errorf("emu: post send WR %d (%s) on qp %d: %w", i, wr.Opcode, q.num, err)
	}
	switch q.state {
	case transport.QPReset, transport.QPInit, transport.QPRTR:
		if p.quirks.DropPostsBeforeRTS {
			return nil // accepted and silently dropped, never completes
		}
		return fmt.Errorf("emu: post send on qp %d in %s: %w", q.num, q.state, transport.ErrInvalidState)
	}
	if q.sqTail-q.sqHead == uint64(len(q.sq)) {
		return fmt.Errorf("emu: post send on qp %d: %d WRs outstanding (unsignaled WRs hold their slot until a later signaled WR completes): %w", q.num, len(q.sq), transport.ErrQueueFull)
	}
	w := q.slot(q.sqTail)
	w.wr = *wr
	w.sgl = append(w.sgl[:0], wr.SGL...)
	w.wr.SGL = w.sgl
	w.signaled = wr.Flags&transport.FlagSignaled != 0 || q.cfg.SignalAll
	w.state = wqeQueued
	w.status = transport.StatusSuccess
	w.byteLen = 0
	w.retries, w.rnr = 0, 0
	w.sentAt = time.Time{}
	w.psn = 0
	w.reason = ""
	w.regMap = mapping{}
	if wr.Flags&transport.FlagInline != 0 {
		w.inline = w.inline[:0]
		for _, s := range wr.SGL {
			a, off, ok := transport.LookupArena(s.Addr, uint64(s.Length))
			if !ok {
				return fmt.Errorf("emu: post send WR %d: inline data at %#x is not arena memory: %w", i, s.Addr, transport.ErrInvalidArgument)
			}
			w.inline = append(w.inline, a.Bytes()[off:off+int(s.Length)]...)
		}
	}
	if wr.Opcode == transport.OpRegMR {
		f := wr.Reg.MR.(*frmr)
		if f.hasMap {
			w.regMap = f.staged
		}
	}
	q.sqTail++
	if q.state == transport.QPErr {
		// Posts to a QP in ERR are accepted and flushed (IBA 10.3.1 ERR).
		q.flushSendLocked()
	}
	return nil
}

func (q *qp) validateLocked(wr *transport.SendWR) error {
	if len(wr.SGL) > q.cfg.MaxSendSGE {
		return fmt.Errorf("%d SGEs, qp allows %d: %w", len(wr.SGL), q.cfg.MaxSendSGE, transport.ErrInvalidArgument)
	}
	switch wr.Opcode {
	case transport.OpSend, transport.OpSendWithImm, transport.OpSendWithInv,
		transport.OpRDMAWrite, transport.OpRDMAWriteWithImm, transport.OpRDMARead:
		n := transport.SGLLen(wr.SGL)
		if n > maxMsgSize {
			return fmt.Errorf("message of %d bytes, max %d: %w", n, maxMsgSize, transport.ErrInvalidArgument)
		}
		if wr.Flags&transport.FlagInline != 0 {
			if wr.Opcode == transport.OpRDMARead {
				return fmt.Errorf("inline RDMA READ: %w", transport.ErrInvalidArgument)
			}
			if n > uint64(q.cfg.MaxInline) {
				return fmt.Errorf("%d bytes inline, qp allows %d: %w", n, q.cfg.MaxInline, transport.ErrInvalidArgument)
			}
		}
	case transport.OpLocalInv:
	case transport.OpRegMR:
		f, ok := wr.Reg.MR.(*frmr)
		if !ok || f.dev != q.dev {
			return fmt.Errorf("REG_MR needs a fast-reg MR of this device: %w", transport.ErrInvalidArgument)
		}
	case transport.OpBindMW:
		w, ok1 := wr.Bind.MW.(*mw)
		m, ok2 := wr.Bind.MR.(*mr)
		if !ok1 || !ok2 || w.dev != q.dev || m.dev != q.dev {
			return fmt.Errorf("BIND_MW needs a window and an MR of this device: %w", transport.ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("opcode %d: %w", wr.Opcode, transport.ErrInvalidArgument)
	}
	return nil
}

func (q *qp) PostRecv(wrs []transport.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.unlock()
	for i := range wrs {
		wr := &wrs[i]
		switch {
		case q.closed:
			return i, fmt.Errorf("emu: post recv: %w", transport.ErrClosed)
		case q.state == transport.QPReset:
			return i, fmt.Errorf("emu: post recv on qp %d in RESET: %w", q.num, transport.ErrInvalidState)
		case len(wr.SGL) > q.cfg.MaxRecvSGE:
			return i, fmt.Errorf("emu: post recv WR %d: %d SGEs, qp allows %d: %w", i, len(wr.SGL), q.cfg.MaxRecvSGE, transport.ErrInvalidArgument)
		case q.cfg.MaxRecvWR == 0 || q.rqTail-q.rqHead == uint64(len(q.rq)):
			return i, fmt.Errorf("emu: post recv on qp %d: %d receives outstanding: %w", q.num, q.rqTail-q.rqHead, transport.ErrQueueFull)
		}
		r := &q.rq[q.rqTail%uint64(len(q.rq))]
		r.id = wr.ID
		r.sgl = append(r.sgl[:0], wr.SGL...)
		q.rqTail++
		if q.state == transport.QPErr {
			q.flushRecvLocked()
		}
	}
	return len(wrs), nil
}
