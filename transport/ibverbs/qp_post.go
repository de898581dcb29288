//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// Posting to a QP's queues and retiring the slots completions name: the
// bad_wr contract, the rings the provider keeps beside the device's, and
// the translation of each work request.

// postable reports whether the QP's state takes posts on the send queue
// (send) or the receive queue. It reads the state the provider set and,
// only when that says no, asks the device (which may have moved to ERR).
func (q *QP) postable(send bool) (transport.QPState, bool) {
	ok := func(s transport.QPState) bool {
		if send {
			return s >= transport.QPRTS
		}
		return s != transport.QPReset
	}
	st := transport.QPState(q.state.Load())
	if ok(st) {
		return st, true
	}
	st = q.State()
	return st, ok(st)
}

var (
	errRegMR       = fmt.Errorf("ibverbs: REG_MR work requests are kernel-only (use BIND_MW on a type-2 window): %w", transport.ErrUnsupported)
	errBadOpcode   = fmt.Errorf("ibverbs: unknown opcode: %w", transport.ErrInvalidArgument)
	errTooManySGE  = fmt.Errorf("ibverbs: more SGEs than the QP was created with: %w", transport.ErrInvalidArgument)
	errBadFlags    = fmt.Errorf("ibverbs: unknown send flags: %w", transport.ErrInvalidArgument)
	errInlineSize  = fmt.Errorf("ibverbs: inline data larger than the QP's max_inline_data: %w", transport.ErrInvalidArgument)
	errBindObjects = fmt.Errorf("ibverbs: BIND_MW needs an ibverbs MW and MR of this device: %w", transport.ErrInvalidArgument)
	errQPClosed    = fmt.Errorf("ibverbs: QP: %w", transport.ErrClosed)
)

var opcodeToIBV = [...]C.uint32_t{
	transport.OpSend:             C.IBV_WR_SEND,
	transport.OpSendWithImm:      C.IBV_WR_SEND_WITH_IMM,
	transport.OpSendWithInv:      C.IBV_WR_SEND_WITH_INV,
	transport.OpRDMAWrite:        C.IBV_WR_RDMA_WRITE,
	transport.OpRDMAWriteWithImm: C.IBV_WR_RDMA_WRITE_WITH_IMM,
	transport.OpRDMARead:         C.IBV_WR_RDMA_READ,
	transport.OpLocalInv:         C.IBV_WR_LOCAL_INV,
	transport.OpRegMR:            0, // refused before lookup
	transport.OpBindMW:           C.IBV_WR_BIND_MW,
}

// fillSend writes wr into entry i of the C arrays, as ring slot seq.
func (q *QP) fillSend(i int, seq uint32, wr *transport.SendWR) error {
	if wr.Opcode == transport.OpRegMR {
		return errRegMR
	}
	if int(wr.Opcode) >= len(opcodeToIBV) {
		return errBadOpcode
	}
	if len(wr.SGL) > q.sSGE {
		return errTooManySGE
	}
	if wr.Flags&^(transport.FlagSignaled|transport.FlagFence|transport.FlagSolicited|transport.FlagInline) != 0 {
		return errBadFlags
	}
	var fl C.uint32_t
	if wr.Flags&transport.FlagSignaled != 0 {
		fl |= C.IBV_SEND_SIGNALED
	}
	if wr.Flags&transport.FlagFence != 0 {
		fl |= C.IBV_SEND_FENCE
	}
	if wr.Flags&transport.FlagSolicited != 0 {
		fl |= C.IBV_SEND_SOLICITED
	}
	if wr.Flags&transport.FlagInline != 0 {
		if transport.SGLLen(wr.SGL) > uint64(q.caps.max_inline_data) {
			return errInlineSize
		}
		fl |= C.IBV_SEND_INLINE
	}
	s := &q.swr[i]
	*s = C.struct_gosrp_swr{}
	slot := seq & q.smask
	q.sring[slot] = sendSlot{id: wr.ID}
	s.wr_id = q.wrID(true, seq)
	s.opcode = opcodeToIBV[wr.Opcode]
	s.flags = fl
	s.num_sge = C.uint32_t(len(wr.SGL))
	s.imm = C.uint32_t(wr.Imm)
	s.inv_rkey = C.uint32_t(wr.InvalidateKey)
	s.rkey = C.uint32_t(wr.RKey)
	s.remote_addr = C.uint64_t(wr.RemoteAddr)
	if wr.Opcode == transport.OpBindMW {
		mw, ok := wr.Bind.MW.(*MW)
		mr, ok2 := wr.Bind.MR.(*MR)
		if !ok || !ok2 || mw == nil || mr == nil || mw.pd.d != q.d || mr.pd.d != q.d {
			return errBindObjects
		}
		mwp := q.d.mws.get(mw.h)
		if mwp == nil {
			return fmt.Errorf("ibverbs: BIND_MW on a closed window: %w", transport.ErrClosed)
		}
		mrp, err := mr.ptr()
		if err != nil {
			return err
		}
		s.mw = (*C.struct_ibv_mw)(mwp)
		s.mr = mrp
		s.bind_addr = C.uint64_t(wr.Bind.Addr)
		s.bind_len = C.uint64_t(wr.Bind.Length)
		s.bind_rkey = C.uint32_t(wr.Bind.Key)
		s.bind_access = C.uint32_t(accessToIBV(wr.Bind.Access))
		q.d.winMu.Lock()
		s.mw_rkey = C.uint32_t(mw.cur)
		if q.d.isRxe && wr.Bind.Key.Index() != mw.key.Index() {
			// rxe binds under the window's own index with the new 8-bit
			// key whatever the index of the new rkey; a strict device
			// fails the bind. Make rxe fail it too (its check of
			// ibv_mw.rkey against the device key): MW_BIND_ERR, QP to ERR.
			s.mw_rkey = C.uint32_t(mw.cur ^ 0x80)
		} else {
			q.sring[slot].w, q.sring[slot].before = mw, mw.winState
			q.sring[slot].bind, q.sring[slot].doubts = true, mw.doubts
			mw.bound, mw.cur, mw.bqp = true, wr.Bind.Key, q
		}
		q.d.winMu.Unlock()
	}
	switch {
	case wr.Opcode == transport.OpLocalInv:
		q.trackInvalidate(i, slot, wr.InvalidateKey, false)
	case wr.Opcode == transport.OpSendWithInv && q.loopback.Load():
		q.trackInvalidate(i, slot, wr.InvalidateKey, true)
	}
	base := i * q.sSGE
	for j := range wr.SGL {
		g := &q.ssge[base+j]
		g.addr = C.uint64_t(wr.SGL[j].Addr)
		g.length = C.uint32_t(wr.SGL[j].Length)
		g.lkey = C.uint32_t(wr.SGL[j].LKey)
	}
	return nil
}

var (
	errSendBeforeRTS = fmt.Errorf("ibverbs: post send before RTS: %w", transport.ErrInvalidState)
	errRecvInReset   = fmt.Errorf("ibverbs: post recv in RESET: %w", transport.ErrInvalidState)
	errSQFull        = fmt.Errorf("ibverbs: send queue full: %w", transport.ErrQueueFull)
	errRQFull        = fmt.Errorf("ibverbs: receive queue full: %w", transport.ErrQueueFull)
)

// PostSend posts wrs in order with the bad_wr contract: it returns how
// many were accepted and the error of wrs[n].
//
// A send before RTS fails with ErrInvalidState without reaching the
// device: rxe's library queues the WQE and only then has its doorbell
// refused with EINVAL, so the "refused" request would flush (or run)
// later.
func (q *QP) PostSend(wrs []transport.SendWR) (int, error) {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	if q.qp == nil {
		return 0, errQPClosed
	}
	if len(wrs) == 0 {
		return 0, nil
	}
	if _, ok := q.postable(true); !ok {
		return 0, errSendBeforeRTS
	}
	total := 0
	for len(wrs) > 0 {
		q.ringMu.Lock()
		head, free := q.shead, q.scap-(q.shead-q.stail)
		q.ringMu.Unlock()
		if free == 0 {
			return total, errSQFull
		}
		k := min(len(wrs), q.sBatch, int(free))
		n := 0
		var verr error
		for ; n < k; n++ {
			if wrs[n].Opcode == transport.OpBindMW && bindsEarlier(wrs[:n], wrs[n].Bind.MW) {
				// libibverbs takes a window's current key from its
				// ibv_mw when the chain is posted (shim.h), so a
				// second BIND of one window in one ibv_post_send would
				// carry the key the first sets, not the key it
				// replaces: rxe fails it MW_BIND_ERR. It starts the
				// next post instead.
				k = n
				break
			}
			if verr = q.fillSend(n, head+uint32(n), &wrs[n]); verr != nil {
				break
			}
		}
		// Publish the slots before the post, not after: the device may
		// execute a WR, and another goroutine poll its completion, before
		// ibv_post_send returns, and complete() drops a completion for a
		// slot beyond shead as stale. On rxe that lost one SEND completion
		// in a few hundred (Send/PollWhilePosting in the conformance suite).
		q.ringMu.Lock()
		q.shead = head + uint32(n)
		q.ringMu.Unlock()
		rc := C.gosrp_post_send(q.qp, &q.swr[0], q.swrsRaw, &q.ssge[0], C.int(q.sSGE), C.int(n), &q.bad[0])
		bad := q.bad[0]
		q.ringMu.Lock()
		// Undo the window changes of the requests that were not accepted
		// (their slots are beyond the head), then publish the accepted ones.
		q.undoWindows(head+uint32(bad), head+uint32(n))
		q.shead = head + uint32(bad)
		q.ringMu.Unlock()
		total += int(bad)
		if rc != 0 {
			return total, q.postErr("ibv_post_send", int(rc), transport.QPRTS)
		}
		if verr != nil {
			return total, verr
		}
		wrs = wrs[k:]
	}
	return total, nil
}

// bindsEarlier reports whether one of wrs binds mw.
func bindsEarlier(wrs []transport.SendWR, mw transport.MW) bool {
	for i := range wrs {
		if wrs[i].Opcode == transport.OpBindMW && wrs[i].Bind.MW == mw {
			return true
		}
	}
	return false
}

// PostRecv posts receive buffers with the same contract.
func (q *QP) PostRecv(wrs []transport.RecvWR) (int, error) {
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if q.qp == nil {
		return 0, errQPClosed
	}
	if len(wrs) == 0 {
		return 0, nil
	}
	if _, ok := q.postable(false); !ok {
		return 0, errRecvInReset
	}
	total := 0
	for len(wrs) > 0 {
		q.ringMu.Lock()
		head, free := q.rhead, q.rcap-(q.rhead-q.rtail)
		q.ringMu.Unlock()
		if free == 0 {
			return total, errRQFull
		}
		k := min(len(wrs), q.rBatch, int(free))
		n := 0
		var verr error
		for ; n < k; n++ {
			wr := &wrs[n]
			if len(wr.SGL) > int(q.caps.max_recv_sge) {
				verr = errTooManySGE
				break
			}
			seq := head + uint32(n)
			q.rring[seq&q.rmask] = wr.ID
			q.rids[n] = q.wrID(false, seq)
			q.rnsge[n] = C.uint32_t(len(wr.SGL))
			base := n * q.rSGE
			for j := range wr.SGL {
				g := &q.rsge[base+j]
				g.addr = C.uint64_t(wr.SGL[j].Addr)
				g.length = C.uint32_t(wr.SGL[j].Length)
				g.lkey = C.uint32_t(wr.SGL[j].LKey)
			}
		}
		// Published before the post, as for sends: a receive can complete
		// before ibv_post_recv returns.
		q.ringMu.Lock()
		q.rhead = head + uint32(n)
		q.ringMu.Unlock()
		rc := C.gosrp_post_recv(q.qp, &q.rids[0], &q.rnsge[0], q.rwrsRaw, &q.rsge[0], C.int(q.rSGE), C.int(n), &q.bad[1])
		bad := q.bad[1]
		q.ringMu.Lock()
		q.rhead = head + uint32(bad)
		q.ringMu.Unlock()
		total += int(bad)
		if bad > 0 && q.d.isRxe && transport.QPState(q.state.Load()) == transport.QPErr {
			q.flushRecvs()
		}
		if rc != 0 {
			return total, q.postErr("ibv_post_recv", int(rc), transport.QPInit)
		}
		if verr != nil {
			return total, verr
		}
		wrs = wrs[k:]
	}
	return total, nil
}

// complete retires the slot a completion names and returns the consumer's
// ID. Every earlier outstanding slot of that queue has completed too (in
// order, silently if unsignaled), successfully. A failed or flushed send
// and everything after it may or may not have executed: the windows they
// touched are doubted (doubtWindows). A successful BIND_MW confirms its
// window (windowsConfirmed).
func (q *QP) complete(send bool, seq uint32, st transport.Status) (uint64, bool) {
	q.ringMu.Lock()
	defer q.ringMu.Unlock()
	if send {
		if seq-q.stail >= q.shead-q.stail {
			return 0, false // not outstanding (QP reset, or a stale completion)
		}
		id := q.sring[seq&q.smask].id
		end := seq + 1
		if st != transport.StatusSuccess {
			q.doubtWindows(seq, q.shead)
			end = seq
		}
		if q.d.doubted.Load() > 0 {
			q.windowsConfirmed(q.stail, end)
		}
		q.stail = seq + 1
		return id, true
	}
	if seq-q.rtail >= q.rhead-q.rtail {
		return 0, false
	}
	q.rtail = seq + 1
	return q.rring[seq&q.rmask], true
}
