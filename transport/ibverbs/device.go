//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/internal/asyncq"
	"github.com/gosrp/gosrp/transport/internal/refs"
)

// rxeVendorID is the vendor_id the kernel's soft-RoCE driver reports.
const rxeVendorID = 0xffffff

// mellanoxVendorID is the vendor_id of Mellanox/NVIDIA HCAs.
const mellanoxVendorID = 0x02c9

// Device is an opened RDMA device (an ibv_context) with its async-event
// goroutine.
type Device struct {
	p    *Provider
	name string
	ctx  *C.struct_ibv_context
	attr transport.DeviceAttr
	port int

	maxRdAtom     int // max_qp_rd_atom: RDMA READs we may serve
	maxInitRdAtom int // max_qp_init_rd_atom: RDMA READs we may issue

	refs refs.Count // live PDs and CQs

	mu    sync.Mutex
	cqs   map[uintptr]*CQ
	qps   map[uintptr]*QP
	nextH uintptr

	mrs handleTable // MR handle -> *ibv_mr
	mws handleTable // MW handle -> *ibv_mw

	// guardFreeInv: the device oopses when a type-2 window that is FREE
	// is invalidated (rxe, see the package doc); windows are then tracked
	// by index so that such a LOCAL_INV is turned into one that fails.
	guardFreeInv bool
	// kernelWCFlags: the provider library reports the kernel's wc_flags
	// numbering (rxe): IB_WC_WITH_INVALIDATE is bit 2, not IBV_WC_WITH_INV.
	kernelWCFlags C.int
	isRxe         bool
	// ackTimeout is the local ACK timeout its QPs enter RTS with (IBA's
	// exponent: 4.096 µs × 2^n); 0 keeps rdma_cm's (Provider's
	// ack_timeout option, RxeAckTimeout).
	ackTimeout int
	winMu      sync.RWMutex
	windows    map[uint32]*MW // key index -> window
	// doubted counts the unsure windows (qp_mw.go), so that completions
	// look for a window to confirm only while there is one.
	doubted atomic.Int64

	events *asyncq.Queue // counts the events dropped because nobody read them
	stopFD int           // eventfd that stops the async goroutine
	done   chan struct{}
}

var _ transport.Device = (*Device)(nil)

func openDevice(p *Provider, dv *C.struct_ibv_device, name string) (*Device, error) {
	ctx, err := C.ibv_open_device(dv)
	if ctx == nil {
		return nil, mapErrno("ibv_open_device "+name, kindCreate, errnoOf(err))
	}
	d := &Device{p: p, name: name, ctx: ctx, port: 1,
		cqs: map[uintptr]*CQ{}, qps: map[uintptr]*QP{}, windows: map[uint32]*MW{},
		events: asyncq.New(256), done: make(chan struct{})}
	if err := d.query(); err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	if rc := C.gosrp_set_nonblock(ctx.async_fd); rc != 0 {
		C.ibv_close_device(ctx)
		return nil, mapErrno("fcntl async fd", kindCreate, int(rc))
	}
	fd, err := newStopFD()
	if err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	d.stopFD = fd
	go d.asyncLoop()
	return d, nil
}

func (d *Device) query() error {
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(d.ctx, &a); rc != 0 {
		return mapErrno("ibv_query_device", kindCreate, int(rc))
	}
	var pa C.struct_ibv_port_attr
	if rc := C.gosrp_query_port(d.ctx, C.int(d.port), &pa); rc != 0 {
		return mapErrno("ibv_query_port", kindCreate, int(rc))
	}
	flags := uint64(a.device_cap_flags)
	var caps transport.Capability
	if flags&C.IBV_DEVICE_MEM_WINDOW_TYPE_2B != 0 {
		caps |= transport.CapMemWindow2
	}
	if flags&C.IBV_DEVICE_MEM_MGT_EXTENSIONS != 0 {
		caps |= transport.CapLocalInv | transport.CapSendWithInv
	}
	// Any Linux verbs device registers hugetlbfs-backed memory.
	caps |= transport.CapHugePages
	vendor := uint32(a.vendor_id)
	d.guardFreeInv = vendor == rxeVendorID && os.Getenv("GOSRP_IBVERBS_UNGUARDED") == ""
	if vendor == rxeVendorID {
		d.kernelWCFlags = 1
		d.isRxe = true
		d.ackTimeout = RxeAckTimeout
	}
	if d.p.ackTimeout > 0 {
		d.ackTimeout = d.p.ackTimeout
	}
	d.maxRdAtom = int(a.max_qp_rd_atom)
	d.maxInitRdAtom = int(a.max_qp_init_rd_atom)
	d.attr = transport.DeviceAttr{
		Name:            d.name,
		Vendor:          fmt.Sprintf("%#06x:%d", vendor, uint32(a.vendor_part_id)),
		FWVer:           C.GoString(&a.fw_ver[0]),
		Caps:            caps,
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxMW:           int(a.max_mw),
		MaxPD:           int(a.max_pd),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxFastRegPages: 0, // no REG_MR in user space; windows have no page list
		MaxInline:       int(C.gosrp_probe_inline(d.ctx)),
		PageSizeCap:     uint64(a.page_size_cap),
		PortMTU:         mtuBytes(int(pa.active_mtu)),
		Quirks:          quirksFor(vendor, uint32(a.vendor_part_id)),
	}
	return nil
}

func mtuBytes(m int) int {
	if m >= 1 && m <= 5 {
		return 128 << m
	}
	return 0
}

// quirksFor returns the departures from strict verbs of a device: rxe as
// measured in the VM (see the package doc), Mellanox as documented in
// docs/verbs.md#device-differences, and the strict reading for everything else.
func quirksFor(vendor, part uint32) transport.Quirks {
	switch vendor {
	case rxeVendorID:
		return transport.Quirks{
			LocalOpErrStatus: transport.StatusLocQPOpErr,
			// Invalidating a FREE type-2 window oopses rxe; the provider
			// turns that LOCAL_INV into one that fails (QP.trackWindows).
			InvalidateFreeOK: false,
			// rxe refuses (EINVAL) sends in RESET/INIT/RTR after queueing
			// them; the provider refuses them first: ErrInvalidState.
			DropPostsBeforeRTS:    false,
			NoQPErrorEvents:       true,
			LocalKeyErrStatus:     transport.StatusLocQPOpErr,
			RecvLenErrStatus:      transport.StatusLocQPOpErr,
			WindowBoundsUnchecked: true,
			// rxe_pool.c: xa_alloc_cyclic over the pool's index range.
			CyclicIndices: true,
			// Measured on 6.1 (reported) and 6.12 (flushed); the change
			// is "RDMA/rxe: Fix multiple rxe_qp_error calls", v6.10.
			LocalErrFlushed: kernelAtLeast(kernelRelease(), 6, 10),
			ReplayOnErr:     rxeReplaysOnErr(kernelRelease()),
			// req_retry and rxe_requester, on every release read here;
			// seen as MW_BIND_ERR after a retry on 6.1 in the VM.
			RetryRepeatsLocalOps: true,
			// rxe_invalidate_mw looks the key up in the device's pool
			// and checks neither QP nor PD; measured on 6.1
			// (FastReg/MW/SendWithInvValidOther{QP,PD}).
			RemoteInvalidateAnyQP: true,
		}
	case mellanoxVendorID:
		q := transport.Quirks{
			LocalOpErrStatus:    transport.StatusMWBindErr,
			DropPostsBeforeRTS:  true,
			InvalidateIndexOnly: true,
		}
		switch part {
		case 25408, 25418, 25428, 25448, 26418, 26428, 26438, 26448, 26458, 26468, 26478, 26488,
			4099, 4100, 4103, 4104: // ConnectX-1/2/3 (mlx4)
			q.PoisonOnFlush = true
		}
		return q
	}
	return transport.Quirks{LocalOpErrStatus: transport.StatusMWBindErr}
}

// Attr returns the attributes read at open.
func (d *Device) Attr() transport.DeviceAttr { return d.attr }

// Name is the device name, e.g. "rxe0".
func (d *Device) Name() string { return d.name }

func (d *Device) hold() error {
	if !d.refs.Hold() {
		return fmt.Errorf("ibverbs: device %s: %w", d.name, transport.ErrClosed)
	}
	return nil
}

func (d *Device) newHandle() uintptr {
	d.mu.Lock()
	d.nextH++
	h := d.nextH
	d.mu.Unlock()
	return h
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (transport.PD, error) {
	if err := d.hold(); err != nil {
		return nil, err
	}
	pd, err := C.ibv_alloc_pd(d.ctx)
	if pd == nil {
		d.refs.Release()
		return nil, mapErrno("ibv_alloc_pd", kindCreate, errnoOf(err))
	}
	return &PD{d: d, pd: pd}, nil
}

// NextEvent returns the next asynchronous event.
func (d *Device) NextEvent(ctx context.Context) (transport.AsyncEvent, error) {
	return d.events.Next(ctx, d.done, "ibverbs: device "+d.name)
}

// asyncLoop reads ibv_get_async_event until the device closes, acking each
// event at once (ibv_destroy_qp/cq wait for outstanding acks).
func (d *Device) asyncLoop() {
	var ev C.struct_gosrp_async
	readEvents(int(d.ctx.async_fd), d.stopFD, d.done, func() {
		for C.gosrp_get_async_event(d.ctx, &ev) == 0 {
			d.deliver(&ev)
		}
	})
}

func (d *Device) deliver(ev *C.struct_gosrp_async) {
	var out transport.AsyncEvent
	switch ev._type {
	case C.IBV_EVENT_QP_FATAL:
		out.Type = transport.EventQPFatal
	case C.IBV_EVENT_QP_REQ_ERR:
		out.Type = transport.EventQPReqErr
	case C.IBV_EVENT_QP_ACCESS_ERR:
		out.Type = transport.EventQPAccessErr
	case C.IBV_EVENT_CQ_ERR:
		out.Type = transport.EventCQErr
	case C.IBV_EVENT_SQ_DRAINED:
		out.Type = transport.EventSQDrained
	case C.IBV_EVENT_COMM_EST:
		out.Type = transport.EventCommEst
	case C.IBV_EVENT_DEVICE_FATAL:
		out.Type = transport.EventDeviceFatal
	default:
		return // port, GID, path migration and SRQ events are not in the contract
	}
	out.QPNum = uint32(ev.qp_num)
	out.Reason = C.GoString(C.ibv_event_type_str(uint32(ev._type)))
	if out.Type == transport.EventCQErr {
		d.mu.Lock()
		cq := d.cqs[uintptr(ev.cq_handle)]
		var victims []*QP
		if cq != nil {
			for _, qp := range d.qps {
				if qp.scq == cq || qp.rcq == cq {
					victims = append(victims, qp)
				}
			}
		}
		d.mu.Unlock()
		if cq != nil {
			cq.markOverrun()
			out.CQ = cq
			// The contract: after an overrun every QP on the CQ is in ERR.
			for _, qp := range victims {
				_ = qp.Modify(transport.QPErr)
			}
		}
	}
	d.events.Post(out)
}

// Close closes the device once every PD and CQ on it is gone (ErrBusy
// otherwise).
func (d *Device) Close() error {
	switch n, closed := d.refs.Close(); {
	case n > 0:
		return fmt.Errorf("ibverbs: close device %s with %d PDs/CQs alive: %w", d.name, n, transport.ErrBusy)
	case !closed:
		return nil
	}
	d.p.forgetDevice(d)
	return d.teardown(0)
}

// forceClose closes the device whatever is still on it (the provider's
// Close). Objects the consumer leaked keep the kernel context alive until
// the process exits.
func (d *Device) forceClose() error {
	busy, closed := d.refs.Shut()
	if !closed {
		return nil
	}
	return d.teardown(busy)
}

// teardown stops the async goroutine and closes the context unless busy
// objects still use it.
func (d *Device) teardown(busy int) error {
	stopEvents(d.stopFD, d.done)
	if busy > 0 {
		// ibv_close_device with live objects is undefined; leave the context.
		return nil
	}
	if rc, err := C.ibv_close_device(d.ctx); rc != 0 {
		return mapErrno("ibv_close_device", kindDestroy, errnoOfRC(rc, err))
	}
	return nil
}

// errnoOf extracts the errno cgo returns as the second result.
func errnoOf(err error) int {
	if e, ok := err.(unix.Errno); ok {
		return int(e)
	}
	return int(unix.EINVAL)
}

// errnoOfRC turns a verbs return code (an errno, or -1 with errno set by
// some providers) into an errno.
func errnoOfRC(rc C.int, err error) int {
	if rc > 0 {
		return int(rc)
	}
	return errnoOf(err)
}

// remoteInvalidated records a receive completion with IBV_WC_WITH_INV.
func (d *Device) remoteInvalidated(k transport.Key) {
	d.winMu.Lock()
	if w := d.windows[k.Index()]; w != nil && w.cur == k {
		w.bound = false
	}
	d.winMu.Unlock()
}
