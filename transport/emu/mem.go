package emu

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

type objKind uint8

const (
	kindMR objKind = iota
	kindFRMR
	kindMW
)

func (k objKind) String() string {
	return [...]string{"mr", "frmr", "mw"}[k]
}

type objState uint8

const (
	stateFree objState = iota
	stateValid
)

func (s objState) String() string {
	if s == stateValid {
		return "VALID"
	}
	return "FREE"
}

// mapping is a translation: iova..iova+length onto arena bytes at off.
type mapping struct {
	arena  *transport.Arena
	off    int
	iova   uint64
	length uint64
}

// memObj is one memory region or window. Fields below "device state" are
// changed only by executing work requests or deregistration, under
// device.mem held exclusively.
type memObj struct {
	kind     objKind
	pd       *pd
	index    uint32
	maxPages int

	// device state
	state    objState
	key      transport.Key
	access   transport.Access
	m        mapping
	poisoned bool
	bound    int     // windows bound over this MR
	parent   *memObj // MR a window is bound over
	bindQP   uint32  // QP a type-2 window was bound through
	dead     bool
}

// errLocalOp is returned by memory operations; status is the completion
// status to report and reason goes to the log.
type opError struct {
	status transport.Status
	reason string
	// sink: a READ's sink is bad. Checked here before the request goes
	// out, but a real device finds it when the response arrives, in its
	// completer, and reports it even where it flushes the requester's
	// own failures (Quirks.LocalErrFlushed).
	sink bool
}

func (d *device) localOpErr(format string, args ...any) *opError {
	return &opError{status: d.p.quirks.LocalOpErrStatus, reason: fmt.Sprintf(format, args...)}
}

// install gives a new memory object its index and key on the PD's device.
func (pd *pd) install(o *memObj) error {
	if err := pd.use(); err != nil {
		return err
	}
	d := pd.dev
	d.mem.Lock()
	err := d.newObjLocked(o)
	d.mem.Unlock()
	if err != nil {
		pd.refs.Release()
	}
	return err
}

// ---- regular MRs ----

type mr struct {
	o    *memObj
	dev  *device
	addr uint64
}

func (pd *pd) RegMR(a *transport.Arena, off, length int, access transport.Access) (transport.MR, error) {
	if a == nil || length <= 0 {
		return nil, fmt.Errorf("emu: reg mr of %d bytes: %w", length, transport.ErrInvalidArgument)
	}
	if _, err := a.Slice(off, length); err != nil {
		return nil, fmt.Errorf("emu: reg mr: %w", err)
	}
	if !access.Valid() {
		return nil, fmt.Errorf("emu: reg mr with access %s: %w", access, transport.ErrInvalidArgument)
	}
	o := &memObj{kind: kindMR, pd: pd, state: stateValid, access: access,
		m: mapping{arena: a, off: off, iova: a.Addr() + uint64(off), length: uint64(length)}}
	if err := pd.install(o); err != nil {
		return nil, err
	}
	d := pd.dev
	return &mr{o: o, dev: d, addr: o.m.iova}, nil
}

func (m *mr) LKey() transport.Key      { return m.o.key }
func (m *mr) RKey() transport.Key      { return m.o.key }
func (m *mr) Addr() uint64             { return m.addr }
func (m *mr) Len() int                 { return int(m.o.m.length) }
func (m *mr) Access() transport.Access { return m.o.access }
func (m *mr) Arena() *transport.Arena  { return m.o.m.arena }

func (m *mr) Close() error {
	return m.dev.destroy(m.o, func() error {
		if n := m.o.bound; n > 0 {
			return fmt.Errorf("emu: dereg mr %s with %d windows bound: %w", m.o.key, n, transport.ErrBusy)
		}
		return nil
	})
}

// destroy frees o once (ibv_dereg_mr, ibv_dealloc_mw) and drops its hold
// on its PD; closing it again does nothing. busy, if set, may refuse
// under the device's lock.
func (d *device) destroy(o *memObj, busy func() error) error {
	d.mem.Lock()
	if o.dead {
		d.mem.Unlock()
		return nil
	}
	if busy != nil {
		if err := busy(); err != nil {
			d.mem.Unlock()
			return err
		}
	}
	d.killLocked(o)
	d.mem.Unlock()
	o.pd.refs.Release()
	return nil
}

// killLocked removes an object from the table; its index may be reused.
// REQUIRES: d.mem held exclusively.
func (d *device) killLocked(o *memObj) {
	o.dead = true
	o.state = stateFree
	if o.parent != nil {
		o.parent.bound--
		o.parent = nil
	}
	d.objs[o.index] = nil
	d.freeIdx = append(d.freeIdx, o.index)
}

// ---- fast-registration MRs ----

type frmr struct {
	o       *memObj
	dev     *device
	initKey transport.Key
	staged  mapping // the verbs-handle copy (ib_map_mr_sg)
	hasMap  bool
}

func (pd *pd) AllocFastRegMR(maxPages int) (transport.FastRegMR, error) {
	if maxPages <= 0 || maxPages > maxFastRegPages {
		return nil, fmt.Errorf("emu: alloc fast-reg mr of %d pages (max %d): %w", maxPages, maxFastRegPages, transport.ErrInvalidArgument)
	}
	o := &memObj{kind: kindFRMR, pd: pd, state: stateFree, maxPages: maxPages}
	if err := pd.install(o); err != nil {
		return nil, err
	}
	d := pd.dev
	return &frmr{o: o, dev: d, initKey: o.key}, nil
}

func (f *frmr) Key() transport.Key { return f.initKey }
func (f *frmr) MaxPages() int      { return f.o.maxPages }

func (f *frmr) Map(a *transport.Arena, off, length int, iova uint64) error {
	if a == nil || length <= 0 {
		return fmt.Errorf("emu: map %d bytes: %w", length, transport.ErrInvalidArgument)
	}
	if _, err := a.Slice(off, length); err != nil {
		return fmt.Errorf("emu: map: %w", err)
	}
	ps := transport.PageSize
	if iova%uint64(ps) != uint64(off%ps) {
		return fmt.Errorf("emu: map: iova %#x and arena offset %d differ within the page: %w", iova, off, transport.ErrInvalidArgument)
	}
	if iova+uint64(length) < iova {
		return fmt.Errorf("emu: map: iova %#x + %d wraps: %w", iova, length, transport.ErrInvalidArgument)
	}
	pages := (off%ps + length + ps - 1) / ps
	if pages > f.o.maxPages {
		return fmt.Errorf("emu: map %d bytes needs %d pages, mr holds %d: %w", length, pages, f.o.maxPages, transport.ErrInvalidArgument)
	}
	f.staged = mapping{arena: a, off: off, iova: iova, length: uint64(length)}
	f.hasMap = true
	return nil
}

func (f *frmr) Close() error { return f.dev.destroy(f.o, nil) }

// ---- type-2 memory windows ----

type mw struct {
	o       *memObj
	dev     *device
	initKey transport.Key
}

func (pd *pd) AllocMW() (transport.MW, error) {
	o := &memObj{kind: kindMW, pd: pd, state: stateFree}
	if err := pd.install(o); err != nil {
		return nil, err
	}
	d := pd.dev
	return &mw{o: o, dev: d, initKey: o.key}, nil
}

func (w *mw) Key() transport.Key { return w.initKey }

func (w *mw) Close() error { return w.dev.destroy(w.o, nil) }

// ---- memory operations executed by work requests ----

// execReg executes REG_MR (rxe_reg_fast_mr, siw_fastreg_mr): the MR must be
// FREE, the key's index must be the MR's, and the PD must match the QP's.
// REQUIRES: d.mem held exclusively.
func (d *device) execRegLocked(q *qp, o *memObj, key transport.Key, access transport.Access, m mapping) *opError {
	switch {
	case o == nil || o.dead:
		return d.localOpErr("REG_MR on a deregistered MR")
	case o.kind != kindFRMR:
		return d.localOpErr("REG_MR on a %s", o.kind)
	case o.pd != q.pd:
		return d.localOpErr("REG_MR: MR %s is on another PD", o.key)
	case o.poisoned:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("REG_MR on MR %s poisoned by a flushed memory operation", o.key)}
	case key.Index() != o.index:
		return d.localOpErr("REG_MR key %s does not match MR index %#x", key, o.index)
	case !access.Valid():
		return d.localOpErr("REG_MR with invalid access %s", access)
	case o.state != stateFree:
		d.p.counters.regOnValid.Add(1)
		return d.localOpErr("REG_MR on MR %s which is VALID with key %s (IBA: register only FREE MRs)", key, o.key)
	case m.arena == nil:
		return d.localOpErr("REG_MR without a mapped page list")
	}
	o.state = stateValid
	o.key = key
	o.access = access
	o.m = m
	return nil
}

// execBind executes BIND_MW for a type-2 window.
// REQUIRES: d.mem held exclusively.
func (d *device) execBindLocked(q *qp, w *memObj, key transport.Key, parent *memObj, addr, length uint64, access transport.Access) *opError {
	switch {
	case w == nil || w.dead:
		return &opError{status: transport.StatusMWBindErr, reason: "BIND_MW on a deallocated window"}
	case w.kind != kindMW:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW on a %s", w.kind)}
	case w.pd != q.pd:
		return &opError{status: transport.StatusMWBindErr, reason: "BIND_MW: window on another PD"}
	case w.poisoned:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW on window %s poisoned by a flushed memory operation", w.key)}
	case key.Index() != w.index:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW key %s does not match window index %#x", key, w.index)}
	case w.state != stateFree:
		d.p.counters.regOnValid.Add(1)
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW on window %s which is VALID with key %s", key, w.key)}
	case parent == nil || parent.dead || parent.kind != kindMR:
		return &opError{status: transport.StatusMWBindErr, reason: "BIND_MW over a missing or non-regular MR"}
	case parent.pd != q.pd:
		return &opError{status: transport.StatusMWBindErr, reason: "BIND_MW over an MR of another PD"}
	case parent.access&transport.AccessMWBind == 0:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW over MR %s registered without MW_BIND", parent.key)}
	case access&^(transport.AccessRemoteRead|transport.AccessRemoteWrite|transport.AccessRemoteAtomic) != 0:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW with non-remote access %s", access)}
	case access&(transport.AccessRemoteWrite|transport.AccessRemoteAtomic) != 0 && parent.access&transport.AccessLocalWrite == 0:
		return &opError{status: transport.StatusMWBindErr, reason: "BIND_MW granting remote write over an MR without LOCAL_WRITE"}
	case length == 0 || addr < parent.m.iova || addr+length > parent.m.iova+parent.m.length || addr+length < addr:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("BIND_MW range [%#x,+%d) outside MR", addr, length)}
	}
	w.state = stateValid
	w.key = key
	w.access = access
	w.m = mapping{arena: parent.m.arena, off: parent.m.off + int(addr-parent.m.iova), iova: addr, length: length}
	w.parent = parent
	w.bindQP = q.num
	parent.bound++
	return nil
}

// invalidateLocked executes LOCAL_INV (remote == false) or the invalidation
// of a received SEND_WITH_INV (remote == true) of key on QP q.
// REQUIRES: d.mem held exclusively.
func (d *device) invalidateLocked(q *qp, key transport.Key, remote bool) *opError {
	q2 := d.p.quirks
	fail := func(format string, args ...any) *opError {
		if remote {
			return &opError{status: transport.StatusRemInvReqErr, reason: fmt.Sprintf(format, args...)}
		}
		return d.localOpErr(format, args...)
	}
	o := d.objLocked(key)
	// A received SEND_WITH_INV finds a window by its key alone on such a
	// device (Quirks.RemoteInvalidateAnyQP; rxe_invalidate_mw).
	anywhere := remote && q2.RemoteInvalidateAnyQP && o != nil && o.kind == kindMW
	switch {
	case o == nil:
		return fail("invalidate %s: no such memory object", key)
	case o.kind == kindMR:
		return fail("invalidate %s: a regular MR cannot be invalidated", key)
	case o.pd != q.pd && !anywhere:
		return fail("invalidate %s: object on another PD", key)
	case o.poisoned && !remote:
		return &opError{status: transport.StatusMWBindErr, reason: fmt.Sprintf("LOCAL_INV on %s poisoned by a flushed memory operation", key)}
	case o.kind == kindMW && o.state == stateValid && o.bindQP != q.num && !anywhere:
		// A type-2 window belongs to the QP that bound it
		// (rdma-unit-test mw_test: cross-QP invalidate fails with the
		// local-op error; rxe through the ibverbs provider:
		// LOC_QP_OP_ERR).
		return fail("invalidate window %s through QP %d, bound through QP %d", key, q.num, o.bindQP)
	case o.key != key && !q2.InvalidateIndexOnly:
		d.p.counters.invKeyMismatch.Add(1)
		return fail("invalidate %s: device key is %s", key, o.key)
	case o.state == stateFree && !q2.InvalidateFreeOK:
		d.p.counters.invOnFree.Add(1)
		if anywhere {
			// A peer's, which no provider on this host can stop:
			// rxe_do_invalidate_mw puts the FREE window's NULL QP.
			d.oopsLocked(q, key, "a received SEND_WITH_INV (Quirks.RemoteInvalidateAnyQP)")
		}
		return fail("invalidate %s: already FREE", key)
	}
	if o.state == stateValid && o.parent != nil {
		o.parent.bound--
		o.parent = nil
	}
	o.state = stateFree
	return nil
}

// oopsLocked reports whether invalidating key, in a way the ibverbs
// provider cannot stop (a request replayed at ERR, a LOCAL_INV a retry
// repeats, a peer's SEND_WITH_INV), is what oopses rxe: key names a type-2 window that is FREE
// under that very key, and rxe_do_invalidate_mw puts the window's QP,
// NULL once FREE. It counts and logs the oops (what says what did it).
// REQUIRES: d.mem held.
func (d *device) oopsLocked(q *qp, key transport.Key, what string) bool {
	o := d.objLocked(key)
	if o == nil || o.kind != kindMW || o.state != stateFree || o.key != key {
		return false
	}
	d.p.counters.kernelOopses.Add(1)
	d.p.log.Error(what+" invalidates a FREE window: rxe's kernel oopses here", "qp", q.num, "key", key)
	return true
}

// repeatInvalidateLocked is what rxe does with a LOCAL_INV a retry makes
// it execute again (Quirks.RetryRepeatsLocalOps) when the object is
// already FREE under the same key: an MR stays FREE (rxe_invalidate_mr
// checks the key only), a window oopses the kernel (oopsLocked), which
// fails the operation. done is false for anything else, which is left to
// invalidateLocked. REQUIRES: d.mem held exclusively.
func (d *device) repeatInvalidateLocked(q *qp, key transport.Key) (done bool, err *opError) {
	if d.oopsLocked(q, key, "a LOCAL_INV repeated by a retry (Quirks.RetryRepeatsLocalOps)") {
		return true, d.localOpErr("LOCAL_INV of FREE window %s repeated by a retry: a kernel oops on rxe", key)
	}
	o := d.objLocked(key)
	return o != nil && o.kind != kindMW && o.state == stateFree && o.key == key && o.pd == q.pd, nil
}

// windowsHeldLocked counts the valid type-2 windows bound through QP num.
// With release, it invalidates them instead, as destroying the QP does on
// a device with Quirks.DestroyQPInvalidatesWindows. REQUIRES: d.mem held
// exclusively.
func (d *device) windowsHeldLocked(num uint32, release bool) int {
	n := 0
	for _, o := range d.objs {
		if o == nil || o.kind != kindMW || o.state != stateValid || o.bindQP != num {
			continue
		}
		n++
		if release {
			if o.parent != nil {
				o.parent.bound--
				o.parent = nil
			}
			o.state = stateFree
		}
	}
	return n
}

// checkRemote validates a peer's access of n bytes at (rkey, va) arriving
// on QP q and returns the bytes. REQUIRES: d.mem held.
func (d *device) checkRemoteLocked(q *qp, rkey transport.Key, va, n uint64, need transport.Access) ([]byte, string) {
	a, start, bad := d.remoteRangeLocked(q, rkey, va, n, need)
	if bad != "" {
		return nil, bad
	}
	return a.Bytes()[start : start+int(n) : start+int(n)], ""
}

// remoteRange is checkRemote returning the arena and offset of the bytes.
// REQUIRES: d.mem held.
func (d *device) remoteRangeLocked(q *qp, rkey transport.Key, va, n uint64, need transport.Access) (*transport.Arena, int, string) {
	o := d.objLocked(rkey)
	switch {
	case o == nil:
		return nil, 0, fmt.Sprintf("rkey %s: no such memory object", rkey)
	case o.state != stateValid:
		d.p.counters.accessAfterInvalidate.Add(1)
		return nil, 0, fmt.Sprintf("rkey %s: object is FREE (invalidated)", rkey)
	case o.key != rkey:
		d.p.counters.accessAfterInvalidate.Add(1)
		return nil, 0, fmt.Sprintf("rkey %s: device key is %s", rkey, o.key)
	case o.pd != q.pd:
		return nil, 0, fmt.Sprintf("rkey %s: object on another PD", rkey)
	case o.kind == kindMW && o.bindQP != q.num:
		return nil, 0, fmt.Sprintf("rkey %s: window bound to QP %d, access on QP %d", rkey, o.bindQP, q.num)
	case o.access&need != need:
		return nil, 0, fmt.Sprintf("rkey %s: access %s lacks %s", rkey, o.access, need)
	}
	m := o.m
	if o.kind == kindMW && o.parent != nil && d.p.quirks.WindowBoundsUnchecked {
		// Device bug (rxe check_rkey): a window's own range is not
		// checked, only the range of the MR it is bound over.
		m = o.parent.m
	}
	if va < m.iova || n > m.length || va-m.iova > m.length-n {
		return nil, 0, fmt.Sprintf("rkey %s: [%#x,+%d) outside [%#x,+%d)", rkey, va, n, m.iova, m.length)
	}
	return m.arena, m.off + int(va-m.iova), ""
}

// sgeErr is a refused local SGE: why, and whether its lkey failed to
// resolve to a usable MR (no such MR, a window, a wrong 8-bit key, a FREE
// object, another PD) rather than failing a bounds or LOCAL_WRITE check.
type sgeErr struct {
	reason string
	badKey bool
}

// status is the completion status of a send or receive WR refused for e:
// LOC_PROT_ERR, or Quirks.LocalKeyErrStatus if it is set and the lkey does
// not resolve (rxe: LOC_QP_OP_ERR). The sinks of an RDMA READ do not use
// it: rxe's completer reports LOC_PROT_ERR for them whatever the cause.
func (d *device) sgeStatus(e *sgeErr) transport.Status {
	if s := d.p.quirks.LocalKeyErrStatus; e.badKey && s != transport.StatusSuccess {
		return s
	}
	return transport.StatusLocProtErr
}

// checkLocal validates a local SGE and returns its bytes.
// REQUIRES: d.mem held.
func (d *device) checkLocalLocked(q *qp, s transport.SGE, write bool) ([]byte, *sgeErr) {
	a, start, bad := d.localRangeLocked(q, s, write)
	if bad != nil {
		return nil, bad
	}
	return a.Bytes()[start : start+int(s.Length) : start+int(s.Length)], nil
}

// localRange is checkLocal returning the arena and offset of the bytes.
// REQUIRES: d.mem held.
func (d *device) localRangeLocked(q *qp, s transport.SGE, write bool) (*transport.Arena, int, *sgeErr) {
	o := d.objLocked(s.LKey)
	switch {
	case o == nil:
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s: no such memory object", s.LKey), true}
	case o.kind == kindMW:
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s names a memory window", s.LKey), true}
	case o.state != stateValid || o.key != s.LKey:
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s: device state %s key %s", s.LKey, o.state, o.key), true}
	case o.pd != q.pd:
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s: MR on another PD", s.LKey), true}
	case write && o.access&transport.AccessLocalWrite == 0:
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s: sink without LOCAL_WRITE", s.LKey), false}
	case s.Addr < o.m.iova || uint64(s.Length) > o.m.length || s.Addr-o.m.iova > o.m.length-uint64(s.Length):
		return nil, 0, &sgeErr{fmt.Sprintf("lkey %s: [%#x,+%d) outside [%#x,+%d)", s.LKey, s.Addr, s.Length, o.m.iova, o.m.length), false}
	}
	return o.m.arena, o.m.off + int(s.Addr-o.m.iova), nil
}
