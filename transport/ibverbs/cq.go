//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/internal/spin"
)

// pollBatch is how many completions one ibv_poll_cq call moves.
const pollBatch = 64

// CQ is a completion queue with its own completion channel.
type CQ struct {
	d     *Device
	h     uintptr
	cq    *C.struct_ibv_cq
	ch    *C.struct_ibv_comp_channel
	depth int

	mu     sync.Mutex // Poll, Wait's arming and the stash
	life   sync.RWMutex
	closed bool
	raw    *C.struct_ibv_wc    // C scratch for ibv_poll_cq
	out    []C.struct_gosrp_wc // view of a C array
	stash  [pollBatch]transport.WC
	stashN int // completions in stash[stashI:stashN]
	stashI int

	lastQP       *QP    // QP of the last completion (most come from one)
	lastRawFlags uint32 // wc_flags of the last completion as the library gave them (tests)

	wakeFD  int // eventfd: context cancellation, Close, overrun
	overrun atomic.Bool

	busyHits, arms, sleeps atomic.Uint64 // WaitStats

	// waits is the recent waits' average, for busy_poll=adaptive; under
	// waitMu (Wait may be called from several goroutines).
	waitMu sync.Mutex
	waits  spin.Average
}

var _ transport.CQ = (*CQ)(nil)

// CreateCQ creates a CQ with at least depth entries and a completion
// channel.
func (d *Device) CreateCQ(depth int) (transport.CQ, error) {
	if depth <= 0 || (d.attr.MaxCQE > 0 && depth > d.attr.MaxCQE) {
		return nil, fmt.Errorf("ibverbs: CQ depth %d (device max %d): %w", depth, d.attr.MaxCQE, transport.ErrInvalidArgument)
	}
	if err := d.hold(); err != nil {
		return nil, err
	}
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		d.refs.Release()
		return nil, mapErrno("ibv_create_comp_channel", kindCreate, errnoOf(err))
	}
	if rc := C.gosrp_set_nonblock(ch.fd); rc != 0 {
		C.ibv_destroy_comp_channel(ch)
		d.refs.Release()
		return nil, mapErrno("fcntl completion channel", kindCreate, int(rc))
	}
	h := d.newHandle()
	cq, err := C.gosrp_create_cq(d.ctx, C.int(depth), C.uintptr_t(h), ch)
	if cq == nil {
		C.ibv_destroy_comp_channel(ch)
		d.refs.Release()
		return nil, mapErrno("ibv_create_cq", kindCreate, errnoOf(err))
	}
	wfd, e := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if e != nil {
		C.ibv_destroy_cq(cq)
		C.ibv_destroy_comp_channel(ch)
		d.refs.Release()
		return nil, fmt.Errorf("ibverbs: eventfd: %w", e)
	}
	c := &CQ{d: d, h: h, cq: cq, ch: ch, depth: int(cq.cqe), wakeFD: wfd}
	c.raw = (*C.struct_ibv_wc)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))))
	outp := (*C.struct_gosrp_wc)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(C.struct_gosrp_wc{}))))
	c.out = unsafe.Slice(outp, pollBatch)
	d.mu.Lock()
	d.cqs[h] = c
	d.mu.Unlock()
	return c, nil
}

// Depth is the number of entries the device gave the CQ (at least the
// requested depth).
func (c *CQ) Depth() int { return c.depth }

func (c *CQ) markOverrun() {
	c.overrun.Store(true)
	c.wake()
}

func (c *CQ) wake() {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	_, _ = unix.Write(c.wakeFD, one)
}

// Poll moves up to len(wcs) completions into wcs without allocating.
func (c *CQ) Poll(wcs []transport.WC) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errCQClosed
	}
	if c.overrun.Load() {
		return 0, errCQOverrun
	}
	n := 0
	for n < len(wcs) && c.stashI < c.stashN {
		wcs[n] = c.stash[c.stashI]
		n++
		c.stashI++
	}
	for n < len(wcs) {
		k := min(len(wcs)-n, pollBatch)
		got, err := c.poll(wcs[n : n+k])
		if err != nil {
			return n, err
		}
		n += got
		if got < k {
			break
		}
	}
	return n, nil
}

// poll runs ibv_poll_cq once for up to len(dst) entries. Caller holds mu.
func (c *CQ) poll(dst []transport.WC) (int, error) {
	got := int(C.gosrp_poll_cq(c.cq, c.raw, &c.out[0], C.int(len(dst)), c.d.kernelWCFlags))
	if got < 0 {
		return 0, errCQPoll
	}
	j := 0
	for i := 0; i < got; i++ {
		w := &dst[j]
		convertWC(&c.out[i], w)
		c.lastRawFlags = uint32(c.out[i].raw_flags)
		// wr_id is the QP's slot handle: find the QP and the consumer's ID.
		q := c.qpFor(uintptr(w.ID >> 33))
		if q == nil {
			continue // the QP is gone: its completions are lost
		}
		id, ok := q.complete(w.ID&wrSendBit != 0, uint32(w.ID), w.Status)
		if !ok {
			continue
		}
		if w.Status != transport.StatusSuccess {
			q.sawError()
		}
		w.ID = id
		if c.d.guardFreeInv && w.Flags&transport.WCWithInv != 0 && w.Status == transport.StatusSuccess {
			c.d.remoteInvalidated(w.InvalidatedKey)
		}
		j++
	}
	return j, nil
}

// qpFor returns the live QP with handle h. Caller holds mu.
func (c *CQ) qpFor(h uintptr) *QP {
	if q := c.lastQP; q != nil && q.h == h && !q.dead.Load() {
		return q
	}
	c.d.mu.Lock()
	q := c.d.qps[h]
	c.d.mu.Unlock()
	c.lastQP = q
	return q
}

var (
	errCQClosed  = fmt.Errorf("ibverbs: CQ: %w", transport.ErrClosed)
	errCQOverrun = fmt.Errorf("ibverbs: CQ: %w", transport.ErrCQOverrun)
	errCQPoll    = fmt.Errorf("ibverbs: ibv_poll_cq failed: %w", transport.ErrCQOverrun)
)

func convertWC(o *C.struct_gosrp_wc, w *transport.WC) {
	w.ID = uint64(o.wr_id)
	w.Status = transport.Status(o.status)
	switch o.opcode {
	case C.IBV_WC_SEND:
		w.Opcode = transport.WCSend
	case C.IBV_WC_RDMA_WRITE:
		w.Opcode = transport.WCRDMAWrite
	case C.IBV_WC_RDMA_READ:
		w.Opcode = transport.WCRDMARead
	case C.IBV_WC_COMP_SWAP:
		w.Opcode = transport.WCCompSwap
	case C.IBV_WC_FETCH_ADD:
		w.Opcode = transport.WCFetchAdd
	case C.IBV_WC_BIND_MW:
		w.Opcode = transport.WCBindMW
	case C.IBV_WC_LOCAL_INV:
		w.Opcode = transport.WCLocalInv
	case C.IBV_WC_RECV:
		w.Opcode = transport.WCRecv
	case C.IBV_WC_RECV_RDMA_WITH_IMM:
		w.Opcode = transport.WCRecvRDMAWithImm
	default:
		w.Opcode = transport.WCOpcode(0xff)
	}
	w.Flags = 0
	if o.wc_flags&C.IBV_WC_WITH_IMM != 0 {
		w.Flags |= transport.WCWithImm
	}
	if o.wc_flags&C.IBV_WC_WITH_INV != 0 {
		w.Flags |= transport.WCWithInv
	}
	w.ByteLen = uint32(o.byte_len)
	w.Imm = uint32(o.imm)
	w.InvalidatedKey = transport.Key(o.inv_rkey)
	w.QPNum = uint32(o.qp_num)
	w.VendorErr = uint32(o.vendor_err)
}

// Wait returns once the CQ may hold a completion. It first polls the CQ
// for up to the provider's busy_poll (pollBusy): completions found there
// are kept for the next Poll and nothing is armed. Only a CQ that stayed
// empty that long is armed (ibv_req_notify_cq), checked once more for a
// completion that raced the arming, and slept on in poll(2) over the
// completion channel and an eventfd that context cancellation, Close and
// overrun write. It starts no goroutine that outlives it
// (context.AfterFunc is stopped on return).
func (c *CQ) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.life.RLock()
	defer c.life.RUnlock()
	hit, start, err := c.pollBusy(ctx)
	if hit || err != nil {
		if hit && err == nil {
			c.waited(start)
		}
		return err
	}
	if start.IsZero() && c.d.p.adaptive {
		start = time.Now()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errCQClosed
	}
	if c.stashI < c.stashN || c.overrun.Load() {
		c.mu.Unlock()
		return nil
	}
	if rc := C.gosrp_req_notify_cq(c.cq); rc != 0 {
		c.mu.Unlock()
		return mapErrno("ibv_req_notify_cq", kindCreate, int(rc))
	}
	c.arms.Add(1)
	// A completion added before the arming raises no event: look for one.
	got, err := c.poll(c.stash[:])
	c.stashI, c.stashN = 0, got
	c.mu.Unlock()
	if err != nil || got > 0 {
		if got > 0 {
			c.waited(start)
		}
		return err
	}
	c.sleeps.Add(1)
	stop := context.AfterFunc(ctx, c.wake)
	defer stop()
	fds := []unix.PollFd{{Fd: int32(c.ch.fd), Events: unix.POLLIN}, {Fd: int32(c.wakeFD), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("ibverbs: poll completion channel: %w", err)
		}
		if fds[0].Revents != 0 {
			for C.gosrp_get_cq_event(c.ch) == 0 {
			}
			c.waited(start)
			return nil
		}
		if fds[1].Revents != 0 {
			var buf [8]byte
			_, _ = unix.Read(c.wakeFD, buf[:])
			if err := ctx.Err(); err != nil {
				return err
			}
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return errCQClosed
			}
			return nil // overrun, or a stale wake-up: the caller polls
		}
	}
}

// pollBusy polls the CQ into the stash until it finds a completion, the
// busy poll's limit passes, or ctx ends; it reports whether the caller
// has something to poll (or an error), and when it began polling (zero
// if its first look found something, or it did not poll). A poll is no
// system call on rxe or on hardware, an arming and a sleep are three
// (package doc, Waiting).
func (c *CQ) pollBusy(ctx context.Context) (bool, time.Time, error) {
	limit := c.busyLimit()
	var start time.Time
	if limit <= 0 {
		return false, start, nil
	}
	for i := 0; ; i++ {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return false, start, errCQClosed
		}
		if c.stashI < c.stashN || c.overrun.Load() {
			c.mu.Unlock()
			return true, start, nil
		}
		got, err := c.poll(c.stash[:])
		c.stashI, c.stashN = 0, got
		c.mu.Unlock()
		if err != nil || got > 0 {
			c.busyHits.Add(1)
			return true, start, err
		}
		if err := ctx.Err(); err != nil {
			return false, start, err
		}
		if i == 0 {
			start = time.Now()
		} else if time.Since(start) >= limit {
			return false, start, nil
		}
		// This process's other goroutines first (they post the work
		// whose completions this waits for), then other threads of this
		// CPU: when the peer that will produce the completion runs on
		// the same CPU (both ends on one host, or a shared core),
		// spinning without sched_yield(2) would hold the CPU it needs
		// until the scheduler's slice ends. On an idle CPU it returns at
		// once.
		runtime.Gosched()
		_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// busyLimit is how long this Wait polls: the provider's busy_poll, or
// with busy_poll=adaptive twice the CQ's recent waits within
// [busy_poll, AdaptiveBusyPollMax] (transport/internal/spin).
func (c *CQ) busyLimit() time.Duration {
	p := c.d.p
	if !p.adaptive {
		return p.busyPoll
	}
	c.waitMu.Lock()
	avg := c.waits.Nanos()
	c.waitMu.Unlock()
	return time.Duration(spin.Budget(avg, int64(p.busyPoll), int64(AdaptiveBusyPollMax)))
}

// waited records, for busy_poll=adaptive, a wait that began at start
// (zero: it found a completion at its first look) and ended with a
// completion now.
func (c *CQ) waited(start time.Time) {
	if !c.d.p.adaptive {
		return
	}
	var d int64
	if !start.IsZero() {
		d = int64(time.Since(start))
	}
	c.waitMu.Lock()
	c.waits.Observe(d)
	c.waitMu.Unlock()
}

// WaitStats counts what CQ.Wait did, for tests and measurement: BusyHits
// waits ended by a completion that the busy poll found, Arms
// ibv_req_notify_cq calls, Sleeps waits that went to sleep in poll(2).
type WaitStats struct{ BusyHits, Arms, Sleeps uint64 }

// WaitStats returns the CQ's counts so far.
func (c *CQ) WaitStats() WaitStats {
	return WaitStats{BusyHits: c.busyHits.Load(), Arms: c.arms.Load(), Sleeps: c.sleeps.Load()}
}

// Close destroys the CQ (ErrBusy while a QP uses it) and wakes waiters.
func (c *CQ) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if rc, err := C.ibv_destroy_cq(c.cq); rc != 0 {
		c.mu.Unlock()
		return mapErrno("ibv_destroy_cq", kindDestroy, errnoOfRC(rc, err))
	}
	c.closed = true
	c.mu.Unlock()
	c.wake()
	c.life.Lock() // waiters have left poll(2)
	C.ibv_destroy_comp_channel(c.ch)
	unix.Close(c.wakeFD)
	C.free(unsafe.Pointer(c.raw))
	C.free(unsafe.Pointer(&c.out[0]))
	c.out = nil
	c.life.Unlock()
	c.d.mu.Lock()
	delete(c.d.cqs, c.h)
	c.d.mu.Unlock()
	c.d.refs.Release()
	return nil
}
