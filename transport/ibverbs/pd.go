//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/gosrp/gosrp/transport"
)

// PD is a protection domain.
type PD struct {
	d      *Device
	pd     *C.struct_ibv_pd
	mu     sync.Mutex
	closed bool
}

var _ transport.PD = (*PD)(nil)

// accessToIBV maps transport.Access to IBV_ACCESS_* bit by bit.
func accessToIBV(a transport.Access) C.int {
	var f C.int
	if a&transport.AccessLocalWrite != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if a&transport.AccessRemoteWrite != 0 {
		f |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if a&transport.AccessRemoteRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&transport.AccessRemoteAtomic != 0 {
		f |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	if a&transport.AccessMWBind != 0 {
		f |= C.IBV_ACCESS_MW_BIND
	}
	return f
}

func (pd *PD) check() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return fmt.Errorf("ibverbs: PD: %w", transport.ErrClosed)
	}
	return nil
}

// RegMR registers [off, off+length) of arena a (ibv_reg_mr).
func (pd *PD) RegMR(a *transport.Arena, off, length int, access transport.Access) (transport.MR, error) {
	if err := pd.check(); err != nil {
		return nil, err
	}
	if !access.Valid() {
		return nil, fmt.Errorf("ibverbs: ibv_reg_mr access %s: %w", access, transport.ErrInvalidArgument)
	}
	if a == nil || length <= 0 {
		return nil, fmt.Errorf("ibverbs: ibv_reg_mr of %d bytes: %w", length, transport.ErrInvalidArgument)
	}
	if _, err := a.Slice(off, length); err != nil {
		return nil, err
	}
	addr := a.Addr() + uint64(off)
	mr, err := C.gosrp_reg_mr(pd.pd, C.uint64_t(addr), C.uint64_t(length), accessToIBV(access))
	if mr == nil {
		return nil, mapErrno("ibv_reg_mr", kindCreate, errnoOf(err))
	}
	h := pd.d.mrs.add(unsafe.Pointer(mr))
	return &MR{pd: pd, h: h, lkey: transport.Key(mr.lkey), rkey: transport.Key(mr.rkey),
		addr: addr, length: length, access: access, arena: a}, nil
}

// AllocFastRegMR is unsupported: user-space verbs have no REG_MR work
// request (IB_WR_REG_MR is kernel-only). Use AllocMW.
func (pd *PD) AllocFastRegMR(maxPages int) (transport.FastRegMR, error) {
	return nil, fmt.Errorf("ibverbs: fast-registration MRs (IB_WR_REG_MR) are kernel-only; use type-2 memory windows: %w", transport.ErrUnsupported)
}

// AllocMW allocates a type-2 memory window.
func (pd *PD) AllocMW() (transport.MW, error) {
	if err := pd.check(); err != nil {
		return nil, err
	}
	if !pd.d.attr.Caps.Has(transport.CapMemWindow2) {
		return nil, fmt.Errorf("ibverbs: %s lacks IBV_DEVICE_MEM_WINDOW_TYPE_2B: %w", pd.d.name, transport.ErrUnsupported)
	}
	mw, err := C.gosrp_alloc_mw(pd.pd)
	if mw == nil {
		return nil, mapErrno("ibv_alloc_mw", kindCreate, errnoOf(err))
	}
	h := pd.d.mws.add(unsafe.Pointer(mw))
	w := &MW{pd: pd, h: h, key: transport.Key(mw.rkey)}
	w.cur = w.key
	pd.d.winMu.Lock()
	pd.d.windows[w.key.Index()] = w
	pd.d.winMu.Unlock()
	return w, nil
}

// CreateQP creates an RC QP in RESET.
func (pd *PD) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	if err := pd.check(); err != nil {
		return nil, err
	}
	return newQP(pd, cfg)
}

// Close deallocates the PD (ErrBusy while MRs, windows or QPs use it).
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if rc, err := C.ibv_dealloc_pd(pd.pd); rc != 0 {
		return mapErrno("ibv_dealloc_pd", kindDestroy, errnoOfRC(rc, err))
	}
	pd.closed = true
	pd.d.refs.Release()
	return nil
}

// MR is a registered memory region.
type MR struct {
	pd     *PD
	h      uint64
	lkey   transport.Key
	rkey   transport.Key
	addr   uint64
	length int
	access transport.Access
	arena  *transport.Arena
}

var _ transport.MR = (*MR)(nil)

func (m *MR) LKey() transport.Key { return m.lkey }

func (m *MR) RKey() transport.Key { return m.rkey }

func (m *MR) Addr() uint64 { return m.addr }

func (m *MR) Len() int { return m.length }

func (m *MR) Access() transport.Access { return m.access }

func (m *MR) Arena() *transport.Arena { return m.arena }

func (m *MR) ptr() (*C.struct_ibv_mr, error) { return lookupMR(m.pd.d, m.h) }

func lookupMR(d *Device, h uint64) (*C.struct_ibv_mr, error) {
	p := d.mrs.get(h)
	if p == nil {
		return nil, fmt.Errorf("ibverbs: MR: %w", transport.ErrClosed)
	}
	return (*C.struct_ibv_mr)(p), nil
}

// Close deregisters the region (ErrBusy while windows are bound over it).
func (m *MR) Close() error {
	d := m.pd.d
	p := d.mrs.hold(m.h)
	if p == nil {
		return nil
	}
	if rc, err := C.ibv_dereg_mr((*C.struct_ibv_mr)(p)); rc != 0 {
		d.mrs.unhold(m.h)
		return mapErrno("ibv_dereg_mr", kindDestroy, errnoOfRC(rc, err))
	}
	d.mrs.remove(m.h)
	return nil
}

// MW is a type-2 memory window.
type MW struct {
	pd  *PD
	h   uint64
	key transport.Key
	// bound is the provider's post-order view of the window: set when a
	// BIND_MW naming it is accepted, cleared when a LOCAL_INV naming it is
	// accepted or a receive completion reports its remote invalidation.
	// cur is the key the device holds for it as far as posts tell.
	// Guarded by the device's winMu.
	winState
	// doubts counts the times the window was made unsure (doubtWindows),
	// so that only a BIND_MW posted since confirms it. Guarded by winMu.
	doubts uint32
}

var _ transport.MW = (*MW)(nil)

// Key is the rkey the window was allocated with.
func (w *MW) Key() transport.Key { return w.key }

// Close deallocates the window whatever its state.
func (w *MW) Close() error {
	d := w.pd.d
	p := d.mws.hold(w.h)
	if p == nil {
		return nil
	}
	if rc, err := C.gosrp_dealloc_mw((*C.struct_ibv_mw)(p)); rc != 0 {
		d.mws.unhold(w.h)
		return mapErrno("ibv_dealloc_mw", kindDestroy, errnoOfRC(rc, err))
	}
	d.mws.remove(w.h)
	d.winMu.Lock()
	if d.windows[w.key.Index()] == w {
		delete(d.windows, w.key.Index())
	}
	if w.unsure {
		w.unsure = false
		d.doubted.Add(-1)
	}
	d.winMu.Unlock()
	return nil
}
