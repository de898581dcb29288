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
	// closing: Close is in ibv_destroy_qp, outside stateMu; the state
	// calls leave the QP alone as if it were closed.
	closing bool
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
	// bind: the request is a BIND_MW of w, posted when w had been
	// doubted doubts times (windowsConfirmed).
	bind   bool
	doubts uint32
}

// winState is the provider's view of a window.
type winState struct {
	bound bool
	cur   transport.Key
	bqp   *QP // the QP that bound it
	// unsure: a request that changed the window failed or was flushed,
	// or its QP was reset, so the device may hold it in any state and
	// under any of its keys (doubtWindows).
	unsure bool
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
	if q.closed || q.closing {
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
	if q.closed || q.closing {
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
		// RESET discards outstanding work without completions, some of
		// which may have executed.
		q.ringMu.Lock()
		q.doubtWindows(q.stail, q.shead)
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
	if q.closed || q.closing {
		return fmt.Errorf("ibverbs: QP %d: %w", q.num, transport.ErrClosed)
	}
	if rc := C.gosrp_cm_modify(id, q.qp, C.int(to), C.int(rdAtomic), C.int(q.d.ackTimeout)); rc != 0 {
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
	if !q.closed && !q.closing {
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
	if !q.closed && !q.closing {
		if C.gosrp_query_state(q.qp) == C.IBV_QPS_RESET {
			C.gosrp_modify_simple(q.qp, C.IBV_QPS_INIT, C.int(q.d.port))
		}
		if C.gosrp_modify_simple(q.qp, C.IBV_QPS_ERR, 0) == 0 {
			q.state.Store(uint32(transport.QPErr))
		}
	}
}

// Close destroys the QP; outstanding completions are lost.
//
// ibv_destroy_qp runs without stateMu: on rxe it can wait for the
// kernel to let go of the QP (rxe_cleanup waits out RXE_POOL_TIMEOUT,
// then warns "cleanup failed"), for minutes when the device is busy, and
// the connection manager's event loop takes stateMu to move a QP whose
// connection ended to ERR (toErr). Held across the destroy, it stopped
// every other connection's events behind one slow QP. The QP is marked
// closing instead: the state calls treat it as closed from then on, and
// the posts wait, on sendMu and recvMu, for the destroy to end.
func (q *QP) Close() error {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	q.stateMu.Lock()
	if q.closed {
		q.stateMu.Unlock()
		return nil
	}
	if q.d.guardFreeInv {
		if n := q.windowsHeld(); n > 0 {
			q.stateMu.Unlock()
			return fmt.Errorf("ibverbs: destroy QP %d: %d type-2 windows still bound through it (rxe would wait for them, then warn): %w", q.num, n, transport.ErrBusy)
		}
	}
	q.closing = true
	q.stateMu.Unlock()
	if testHookDestroyQP != nil {
		testHookDestroyQP()
	}
	rc, err := C.ibv_destroy_qp(q.qp)
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	q.closing = false
	if rc != 0 {
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

// testHookDestroyQP, when a test sets it, runs in Close just before
// ibv_destroy_qp, outside stateMu: a test holds it to stand for a
// destroy the kernel takes minutes over.
var testHookDestroyQP func()

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
