//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// postBatch caps the work requests one ibv_post_send/ibv_post_recv call
// carries; longer slices are posted in order in several calls, which the
// bad_wr contract cannot tell apart from one.
const postBatch = 256

// QP is a reliable-connected queue pair. Its post paths fill work requests
// into C arrays allocated at creation (max WRs x SGEs), so posting neither
// allocates nor hands C a Go pointer.
//
// The wr_id the device sees is a slot handle, never the consumer's ID: the
// QP's handle, the queue (send or receive) and a sequence number whose slot
// in a per-queue ring holds the consumer's ID and the window state a
// BIND_MW or LOCAL_INV in that slot changed. Completions are matched to
// slots in posting order (both queues complete in order), which gives the
// provider exact queue accounting (ErrQueueFull at the first request that
// does not fit, whatever the device does with unsignaled slots) and lets
// it undo its view of a window when the request that changed it failed or
// was flushed.
type QP struct {
	pd   *PD
	d    *Device
	h    uintptr
	qp   *C.struct_ibv_qp
	num  uint32
	scq  *CQ
	rcq  *CQ
	caps C.struct_ibv_qp_cap

	stateMu sync.Mutex
	closed  bool
	dead    atomic.Bool // closed, for the completion path
	// loopback: connected to a QP of the same device, whose windows the
	// provider therefore knows.
	loopback atomic.Bool
	state    atomic.Uint32 // last state set through this QP (the device may have moved on to ERR)

	sendMu  sync.Mutex
	sBatch  int
	sSGE    int
	swr     []C.struct_gosrp_swr
	swrsRaw *C.struct_ibv_send_wr
	ssge    []C.struct_ibv_sge

	recvMu  sync.Mutex
	rBatch  int
	rSGE    int
	rids    []C.uint64_t
	rnsge   []C.uint32_t
	rwrsRaw *C.struct_ibv_recv_wr
	rsge    []C.struct_ibv_sge

	bad []C.int // C memory for the bad index of the two post calls (a Go variable would escape)

	ringMu       sync.Mutex // the rings' head and tail; slots between them
	sring        []sendSlot
	smask        uint32
	shead, stail uint32
	scap         uint32
	rring        []uint64
	rmask        uint32
	rhead, rtail uint32
	rcap         uint32
}

// sendSlot is an outstanding send work request.
type sendSlot struct {
	id     uint64
	w      *MW      // window whose provider-side state the request changed
	before winState // its state before
}

// winState is the provider's view of a window.
type winState struct {
	bound bool
	cur   transport.Key
	bqp   *QP // the QP that bound it
}

var _ transport.QP = (*QP)(nil)

const wrSendBit = 1 << 32

func (q *QP) wrID(send bool, seq uint32) C.uint64_t {
	id := uint64(q.h)<<33 | uint64(seq)
	if send {
		id |= wrSendBit
	}
	return C.uint64_t(id)
}

func ringSize(n int) uint32 {
	r := uint32(1)
	for int(r) < n {
		r <<= 1
	}
	return r
}

func cAlloc[T any](n int) []T {
	if n <= 0 {
		n = 1
	}
	var zero T
	p := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(zero)))
	if p == nil {
		panic("ibverbs: calloc failed")
	}
	return unsafe.Slice((*T)(p), n)
}

func cFree[T any](s []T) {
	if len(s) > 0 {
		C.free(unsafe.Pointer(&s[0]))
	}
}

func newQP(pd *PD, cfg transport.QPConfig) (*QP, error) {
	d := pd.d
	scq, ok1 := cfg.SendCQ.(*CQ)
	rcq, ok2 := cfg.RecvCQ.(*CQ)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.d != d || rcq.d != d {
		return nil, fmt.Errorf("ibverbs: ibv_create_qp: CQs must be ibverbs CQs of device %s: %w", d.name, transport.ErrInvalidArgument)
	}
	if cfg.MaxSendWR <= 0 || cfg.MaxRecvWR < 0 || cfg.MaxSendSGE < 0 || cfg.MaxRecvSGE < 0 || cfg.MaxInline < 0 ||
		cfg.MaxSendWR > d.attr.MaxQPWR || cfg.MaxRecvWR > d.attr.MaxQPWR ||
		cfg.MaxSendSGE > d.attr.MaxSGE || cfg.MaxRecvSGE > d.attr.MaxSGE {
		return nil, fmt.Errorf("ibverbs: ibv_create_qp %+v (device max WR %d SGE %d): %w",
			cfg, d.attr.MaxQPWR, d.attr.MaxSGE, transport.ErrInvalidArgument)
	}
	ssge, rsge := max(cfg.MaxSendSGE, 1), max(cfg.MaxRecvSGE, 1)
	sig := 0
	if cfg.SignalAll {
		sig = 1
	}
	h := d.newHandle()
	q := &QP{pd: pd, d: d, h: h, scq: scq, rcq: rcq}
	qp, err := C.gosrp_create_qp(pd.pd, scq.cq, rcq.cq, C.uintptr_t(h), C.uint32_t(cfg.MaxSendWR),
		C.uint32_t(cfg.MaxRecvWR), C.uint32_t(ssge), C.uint32_t(rsge), C.uint32_t(cfg.MaxInline), C.int(sig), &q.caps)
	if qp == nil {
		return nil, mapErrno("ibv_create_qp", kindCreate, errnoOf(err))
	}
	q.qp = qp
	q.num = uint32(qp.qp_num)
	q.state.Store(uint32(transport.QPReset))
	q.sBatch = min(int(q.caps.max_send_wr), postBatch)
	q.sSGE = int(q.caps.max_send_sge)
	q.swr = cAlloc[C.struct_gosrp_swr](q.sBatch)
	q.swrsRaw = &cAlloc[C.struct_ibv_send_wr](q.sBatch)[0]
	q.ssge = cAlloc[C.struct_ibv_sge](q.sBatch * q.sSGE)
	q.rBatch = min(max(int(q.caps.max_recv_wr), 1), postBatch)
	q.rSGE = max(int(q.caps.max_recv_sge), 1)
	q.rids = cAlloc[C.uint64_t](q.rBatch)
	q.rnsge = cAlloc[C.uint32_t](q.rBatch)
	q.rwrsRaw = &cAlloc[C.struct_ibv_recv_wr](q.rBatch)[0]
	q.rsge = cAlloc[C.struct_ibv_sge](q.rBatch * q.rSGE)
	q.bad = cAlloc[C.int](2)
	q.scap = uint32(q.caps.max_send_wr)
	q.rcap = uint32(q.caps.max_recv_wr)
	q.sring = make([]sendSlot, ringSize(int(q.scap)))
	q.smask = uint32(len(q.sring) - 1)
	q.rring = make([]uint64, ringSize(int(q.rcap)))
	q.rmask = uint32(len(q.rring) - 1)
	d.mu.Lock()
	d.qps[h] = q
	d.mu.Unlock()
	return q, nil
}

// Num is the QP number.
func (q *QP) Num() uint32 { return q.num }

// State queries the device's view of the QP state (ibv_query_qp).
func (q *QP) State() transport.QPState {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if q.closed {
		return transport.QPErr
	}
	s := int(C.gosrp_query_state(q.qp))
	if s < 0 {
		return transport.QPErr
	}
	return transport.QPState(s)
}

// Modify performs the consumer-initiated transitions: any state to ERR or
// RESET, RESET to INIT, RTS to SQD and SQD to RTS.
func (q *QP) Modify(to transport.QPState) error {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if q.closed {
		return fmt.Errorf("ibverbs: QP %d: %w", q.num, transport.ErrClosed)
	}
	cur := transport.QPState(C.gosrp_query_state(q.qp))
	ok := false
	switch to {
	case transport.QPErr, transport.QPReset:
		ok = true
	case transport.QPInit:
		if cur == transport.QPInit {
			return nil
		}
		ok = cur == transport.QPReset
	case transport.QPSQD:
		ok = cur == transport.QPRTS || cur == transport.QPSQD
	case transport.QPRTS:
		if cur == transport.QPRTS {
			return nil
		}
		ok = cur == transport.QPSQD
	}
	if !ok {
		return fmt.Errorf("ibverbs: QP %d: %s -> %s is done by connection management or illegal: %w", q.num, cur, to, transport.ErrInvalidState)
	}
	if cur == transport.QPReset && to == transport.QPErr {
		// The kernel's transition table (ib_modify_qp_is_ok) has no
		// RESET -> ERR; go through INIT.
		if rc := C.gosrp_modify_simple(q.qp, C.IBV_QPS_INIT, C.int(q.d.port)); rc != 0 {
			return mapErrno(fmt.Sprintf("ibv_modify_qp QP %d RESET -> INIT (-> ERR)", q.num), kindCreate, int(rc))
		}
		q.state.Store(uint32(transport.QPInit))
	}
	if rc := C.gosrp_modify_simple(q.qp, C.int(to), C.int(q.d.port)); rc != 0 {
		if rc == C.int(unix.EINVAL) {
			return fmt.Errorf("ibverbs: ibv_modify_qp QP %d %s -> %s: %w (%w)", q.num, cur, to, transport.ErrInvalidState, unix.EINVAL)
		}
		return mapErrno(fmt.Sprintf("ibv_modify_qp QP %d %s -> %s", q.num, cur, to), kindCreate, int(rc))
	}
	q.state.Store(uint32(to))
	switch {
	case to == transport.QPReset:
		// RESET discards outstanding work without completions.
		q.ringMu.Lock()
		q.rollbackWindows(q.stail)
		q.stail = q.shead
		q.rtail = q.rhead
		q.ringMu.Unlock()
	case to == transport.QPRTS && cur == transport.QPSQD && q.d.isRxe:
		// rxe does not restart the requester on SQD -> RTS: ring the
		// doorbell so that the work posted in SQD runs.
		C.gosrp_rxe_doorbell(q.qp)
	}
	return nil
}

// cmModify moves the QP with the attributes rdma_cm computes for id.
func (q *QP) cmModify(id *C.struct_rdma_cm_id, to transport.QPState, rdAtomic int) error {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if q.closed {
		return fmt.Errorf("ibverbs: QP %d: %w", q.num, transport.ErrClosed)
	}
	if rc := C.gosrp_cm_modify(id, q.qp, C.int(to), C.int(rdAtomic)); rc != 0 {
		return mapErrno(fmt.Sprintf("rdma_init_qp_attr+ibv_modify_qp QP %d -> %s", q.num, to), kindCreate, int(rc))
	}
	q.state.Store(uint32(to))
	return nil
}

// flushRecvs makes rxe flush receives posted while the QP is in ERR: its
// user-space receive queue has no doorbell, and the kernel flushes the
// receive queue only when something runs the QP's responder, which a
// transition to ERR does (rxe_qp_error).
func (q *QP) flushRecvs() {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if !q.closed {
		C.gosrp_modify_simple(q.qp, C.IBV_QPS_ERR, 0)
	}
}

// sawError records an error completion of the QP: an RC QP is in ERR from
// then on. On rxe, receives posted since the device moved it to ERR (when
// the provider still took it for RTS) are flushed now.
func (q *QP) sawError() {
	if transport.QPState(q.state.Swap(uint32(transport.QPErr))) != transport.QPErr && q.d.isRxe {
		q.flushRecvs()
	}
}

// toErr moves the QP to ERR if it still exists (connection teardown).
func (q *QP) toErr() {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if !q.closed {
		if C.gosrp_query_state(q.qp) == C.IBV_QPS_RESET {
			C.gosrp_modify_simple(q.qp, C.IBV_QPS_INIT, C.int(q.d.port))
		}
		if C.gosrp_modify_simple(q.qp, C.IBV_QPS_ERR, 0) == 0 {
			q.state.Store(uint32(transport.QPErr))
		}
	}
}

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
// order, silently if unsignaled). A failed or flushed send means it and
// everything after it will not execute: the provider's view of the windows
// they touched goes back to what it was before them.
func (q *QP) complete(send bool, seq uint32, st transport.Status) (uint64, bool) {
	q.ringMu.Lock()
	defer q.ringMu.Unlock()
	if send {
		if seq-q.stail >= q.shead-q.stail {
			return 0, false // not outstanding (QP reset, or a stale completion)
		}
		id := q.sring[seq&q.smask].id
		if st != transport.StatusSuccess {
			q.rollbackWindows(seq)
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

// rollbackWindows restores the windows changed by outstanding sends from
// slot from on, latest first so that the earliest state wins. Caller
// holds ringMu.
func (q *QP) rollbackWindows(from uint32) {
	q.undoWindows(from, q.shead)
}

// undoWindows restores the windows changed by slots [from, to). Caller
// holds ringMu.
func (q *QP) undoWindows(from, to uint32) {
	if from == to {
		return
	}
	locked := false
	for s := to; s != from; {
		s--
		e := &q.sring[s&q.smask]
		if e.w == nil {
			continue
		}
		if !locked {
			q.d.winMu.Lock()
			locked = true
		}
		e.w.winState = e.before
		e.w = nil
	}
	if locked {
		q.d.winMu.Unlock()
	}
}

// Close destroys the QP; outstanding completions are lost.
func (q *QP) Close() error {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if q.closed {
		return nil
	}
	if q.d.guardFreeInv {
		if n := q.windowsHeld(); n > 0 {
			return fmt.Errorf("ibverbs: destroy QP %d: %d type-2 windows still bound through it (rxe would wait for them, then warn): %w", q.num, n, transport.ErrBusy)
		}
	}
	if rc, err := C.ibv_destroy_qp(q.qp); rc != 0 {
		return mapErrno("ibv_destroy_qp", kindDestroy, errnoOfRC(rc, err))
	}
	q.closed = true
	q.dead.Store(true)
	q.qp = nil
	cFree(q.swr)
	C.free(unsafe.Pointer(q.swrsRaw))
	cFree(q.ssge)
	cFree(q.rids)
	cFree(q.rnsge)
	C.free(unsafe.Pointer(q.rwrsRaw))
	cFree(q.rsge)
	cFree(q.bad)
	q.swr, q.ssge, q.rids, q.rnsge, q.rsge, q.bad = nil, nil, nil, nil, nil, nil
	q.d.mu.Lock()
	delete(q.d.qps, q.h)
	q.d.mu.Unlock()
	return nil
}

// windowsHeld counts the windows that, as far as posts and polled
// completions tell, are bound through q. On rxe each holds a reference
// on q (rxe_do_bind_mw) that only an invalidation or the window's
// deallocation drops, and ibv_destroy_qp waits for it (~50 s in the test
// VM), then warns in __rxe_cleanup.
func (q *QP) windowsHeld() int {
	q.d.winMu.RLock()
	defer q.d.winMu.RUnlock()
	n := 0
	for _, w := range q.d.windows {
		if w.bound && w.bqp == q {
			n++
		}
	}
	return n
}

// invalidKey names no object on rxe: index 0 is never allocated, so a
// LOCAL_INV of it fails with LOC_QP_OP_ERR (rxe_invalidate_mr: no MR).
const invalidKey = 0

// trackInvalidate applies a LOCAL_INV (or, on a loopback connection, a
// SEND_WITH_INV whose key names a window of this device) in entry i (ring
// slot slot) to the provider's view of its windows.
//
// On rxe it rewrites the invalidation of a window that a strict device
// refuses to name invalidKey, so that it fails as on a strict device
// (LOCAL_INV: LOC_QP_OP_ERR; SEND_WITH_INV: REM_INV_REQ_ERR at the
// receiver) with the consumer's wr_id and the QP in ERR:
//   - a FREE window: rxe (Linux 6.1) dereferences the window's NULL QP in
//     rxe_do_invalidate_mw and panics the kernel;
//   - a window bound on another QP, or of another PD: rxe invalidates it.
func (q *QP) trackInvalidate(i int, slot uint32, k transport.Key, send bool) {
	d := q.d
	d.winMu.Lock()
	defer d.winMu.Unlock()
	w := d.windows[k.Index()]
	if w == nil || k != w.cur {
		// Not a window, or a key the device refuses on the key compare
		// before it looks at the state: harmless.
		return
	}
	refuse := !w.bound
	if !send && (w.pd != q.pd || (w.bqp != nil && w.bqp != q)) {
		refuse = true
	}
	if refuse {
		if d.guardFreeInv {
			q.swr[i].inv_rkey = invalidKey
		}
		return
	}
	q.sring[slot].w, q.sring[slot].before = w, w.winState
	w.bound = false
}

// postErr maps a post failure; EINVAL on a QP below minState is the
// strict ErrInvalidState.
func (q *QP) postErr(op string, rc int, minState transport.QPState) error {
	if rc == int(unix.EINVAL) {
		if st := q.State(); st < minState {
			return fmt.Errorf("ibverbs: %s on QP %d in %s: %w (%w)", op, q.num, st, transport.ErrInvalidState, unix.EINVAL)
		}
	}
	return mapErrno(op, kindPost, rc)
}
