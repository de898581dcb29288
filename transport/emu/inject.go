package emu

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// MRInfo is the device's view of a memory object, for tests.
type MRInfo struct {
	Kind     string // "mr", "frmr", "mw"
	State    string // "FREE", "VALID"
	Key      transport.Key
	Access   transport.Access
	IOVA     uint64
	Len      uint64
	Poisoned bool
}

// MRInfo returns the device state of the memory object with the given
// index, or false if none exists.
func (p *Provider) MRInfo(index uint32) (MRInfo, bool) {
	d := p.dev
	d.mem.RLock()
	defer d.mem.RUnlock()
	o := d.objLocked(transport.MakeKey(index, 0))
	if o == nil {
		return MRInfo{}, false
	}
	return MRInfo{Kind: o.kind.String(), State: o.state.String(), Key: o.key, Access: o.access,
		IOVA: o.m.iova, Len: o.m.length, Poisoned: o.poisoned}, true
}

// OutstandingWR is a posted send WR that has not completed.
type OutstandingWR struct {
	QPNum  uint32
	ID     uint64
	Opcode transport.Opcode
	// Objects are the memory-object indexes the WR names: REG_MR's MR,
	// BIND_MW's window, LOCAL_INV's and SEND_WITH_INV's key, SGE lkeys.
	Objects []uint32
}

// Outstanding lists the posted, uncompleted send WRs of every QP.
func (p *Provider) Outstanding() []OutstandingWR {
	d := p.dev
	d.qpMu.Lock()
	qps := slices.Collect(maps.Values(d.qps))
	d.qpMu.Unlock()
	var out []OutstandingWR
	for _, q := range qps {
		q.mu.Lock()
		for i := q.sqDone; i < q.sqTail; i++ {
			w := q.slot(i)
			o := OutstandingWR{QPNum: q.num, ID: w.wr.ID, Opcode: w.wr.Opcode}
			switch w.wr.Opcode {
			case transport.OpRegMR:
				o.Objects = append(o.Objects, w.wr.Reg.MR.(*frmr).o.index)
			case transport.OpBindMW:
				o.Objects = append(o.Objects, w.wr.Bind.MW.(*mw).o.index)
			case transport.OpLocalInv, transport.OpSendWithInv:
				o.Objects = append(o.Objects, w.wr.InvalidateKey.Index())
			}
			for _, s := range w.wr.SGL {
				o.Objects = append(o.Objects, s.LKey.Index())
			}
			out = append(out, o)
		}
		q.mu.Unlock()
	}
	return out
}

// Counters are event counts a test can assert on.
type Counters struct {
	RegOnValid            uint64 // REG_MR/BIND_MW on a VALID object
	InvKeyMismatch        uint64 // invalidations naming a key the device does not hold
	InvOnFree             uint64 // invalidations of a FREE object refused
	AccessAfterInvalidate uint64 // remote accesses through a stale or invalidated key
	RemoteAccessErrors    uint64
	Flushed               uint64
	DroppedCQEs           uint64
	CorruptedCQEs         uint64
	Duplicates            uint64
	LinkCuts              uint64
	InjectedQPErrors      uint64
	PostFailures          uint64
	BadFrames             uint64
	ProbesServed          uint64 // Probe accesses the device served
	// AcceptErrors counts temporary accept(2) failures of a tcp or shm
	// listener (out of descriptors, say), each retried after a backoff.
	AcceptErrors uint64
	// KernelOopses counts what would have killed an rxe host: a
	// SEND_WITH_INV replayed at ERR invalidating a FREE window
	// (Quirks.ReplayOnErr, replay.go), or a LOCAL_INV a retry repeated
	// doing the same (Quirks.RetryRepeatsLocalOps, mem.go).
	KernelOopses uint64
	// Replays counts the receives completed with a copy of a SEND
	// replayed at ERR (Quirks.ReplayOnErr, replay.go).
	Replays uint64
	// RepeatedLocalOps counts local operations a retry executed again
	// (Quirks.RetryRepeatsLocalOps, requester.go).
	RepeatedLocalOps uint64
	// Retries counts the requester's rewinds (go-back-N after a timeout
	// or an RNR NAK), rxe's completer_retry_err and rcvd_rnr_err.
	Retries uint64
	// ExposedLocalOps counts local operations that executed while a
	// request before them on their send queue waited for its ACK: a
	// retry of that request would execute them again on a device with
	// Quirks.RetryRepeatsLocalOps (requester.go). It needs no retry to
	// happen, so a test can require none where retries are rare.
	ExposedLocalOps uint64
}

// Counters returns the NIC's counts so far.
func (p *Provider) Counters() Counters {
	c := &p.counters
	return Counters{
		RegOnValid: c.regOnValid.Load(), InvKeyMismatch: c.invKeyMismatch.Load(), InvOnFree: c.invOnFree.Load(),
		AccessAfterInvalidate: c.accessAfterInvalidate.Load(), RemoteAccessErrors: c.remoteAccessErrors.Load(),
		Flushed: c.flushed.Load(), DroppedCQEs: c.droppedCQEs.Load(), CorruptedCQEs: c.corruptedCQEs.Load(),
		Duplicates: c.duplicates.Load(), LinkCuts: c.linkCuts.Load(), InjectedQPErrors: c.injectedQPErrors.Load(),
		PostFailures: c.postFailures.Load(), BadFrames: c.badFrms.Load(), AcceptErrors: c.acceptErrors.Load(),
		ProbesServed: c.probesServed.Load(), KernelOopses: c.kernelOopses.Load(), Replays: c.replays.Load(),
		RepeatedLocalOps: c.repeatedLocalOps.Load(), Retries: c.retries.Load(), ExposedLocalOps: c.exposedLocalOps.Load(),
	}
}

func (p *Provider) injectQP(x transport.QP, f func(*qp)) error {
	q, err := asQP(p.dev, x)
	if err != nil {
		return err
	}
	q.mu.Lock()
	f(q)
	q.unlock()
	q.kick()
	return nil
}

// InjectQPError moves qp to ERR just before its afterWRs-th next send WR
// starts (0: the next one).
func (p *Provider) InjectQPError(x transport.QP, afterWRs int) error {
	return p.injectQP(x, func(q *qp) { q.errAfter = afterWRs })
}

// InjectPostFailure makes the next PostSend on qp accept wrs[:atWR] and
// fail wrs[atWR] with ErrQueueFull, as ENOMEM from ibv_post_send would.
func (p *Provider) InjectPostFailure(x transport.QP, atWR int) error {
	return p.injectQP(x, func(q *qp) { q.postFail = atWR })
}

// InjectDropCQE loses the nth next send completion of qp (0: the next).
func (p *Provider) InjectDropCQE(x transport.QP, nth int) error {
	return p.injectQP(x, func(q *qp) { q.dropCQE = nth })
}

// InjectCQEStatus makes the nth next successful send completion of qp
// report s instead; the QP then goes to ERR as for a real error.
func (p *Provider) InjectCQEStatus(x transport.QP, nth int, s transport.Status) error {
	return p.injectQP(x, func(q *qp) { q.statusCQE, q.statusSet = nth, s })
}

// InjectDuplicate delivers the nth next request qp transmits twice.
func (p *Provider) InjectDuplicate(x transport.QP, nth int) error {
	return p.injectQP(x, func(q *qp) { q.dupNext = nth })
}

// InjectWithholdAcks makes the responder of qp carry out the next n SENDs
// and RDMA WRITEs it receives without acknowledging them, as lost ACKs or
// a peer whose NIC withholds them would: the peer's requester times out
// and retries, and the duplicates it sends are acknowledged. A READ's
// response is never withheld.
func (p *Provider) InjectWithholdAcks(x transport.QP, n int) error {
	return p.injectQP(x, func(q *qp) { q.withhold = n })
}

// CutLink cuts the wire under qp's connection: both QPs go to ERR and both
// Conns end.
func (p *Provider) CutLink(x transport.QP) error {
	q, err := asQP(p.dev, x)
	if err != nil {
		return err
	}
	q.mu.Lock()
	l := q.link
	q.mu.Unlock()
	if l == nil {
		return fmt.Errorf("emu: cut link of qp %d: not connected: %w", q.num, transport.ErrInvalidState)
	}
	p.counters.linkCuts.Add(1)
	l.disconnect(fmt.Errorf("emu: injected link cut: %w: %w", errLinkLost, transport.ErrDisconnected))
	return nil
}

// InjectCQOverrun overruns cq now: a CQ_ERR event, every attached QP to
// ERR, and Poll returns ErrCQOverrun from then on.
func (p *Provider) InjectCQOverrun(x transport.CQ) error {
	c, ok := x.(*cq)
	if !ok || c.dev != p.dev {
		return fmt.Errorf("emu: CQ is not this NIC's: %w", transport.ErrInvalidArgument)
	}
	c.mu.Lock()
	if c.overrun || c.closed {
		c.mu.Unlock()
		return nil
	}
	for _, q := range c.overrunLocked() {
		q.fatal(transport.EventQPFatal, "completion queue overrun (injected)")
	}
	c.raiseOverrun()
	return nil
}

// StrayWRID is the wr_id of the hidden work request InjectStray posts.
const StrayWRID = ^uint64(0) - 0x5754

// InjectStray makes qp issue an RDMA WRITE of data (or an RDMA READ of
// len(data) bytes into data) at (rkey, va) on its peer, as a buggy or
// malicious peer would, and returns the status it completed with. The
// request goes through qp's send queue like any other, so a failure moves
// qp (the issuer) to ERR with REM_ACCESS_ERR and its completion, with ID
// StrayWRID, is also delivered to qp's send CQ.
func (p *Provider) InjectStray(x transport.QP, op transport.Opcode, rkey transport.Key, va uint64, data []byte) (transport.Status, error) {
	q, err := asQP(p.dev, x)
	if err != nil {
		return 0, err
	}
	if op != transport.OpRDMAWrite && op != transport.OpRDMARead {
		return 0, fmt.Errorf("emu: stray %s: only RDMA_WRITE and RDMA_READ: %w", op, transport.ErrInvalidArgument)
	}
	n := max(len(data), 1)
	a, err := transport.NewArena(n, transport.ArenaOptions{})
	if err != nil {
		return 0, err
	}
	defer a.Close()
	m, err := q.pd.RegMR(a, 0, n, transport.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	copy(a.Bytes(), data)
	done := make(chan transport.Status, 1)
	wr := transport.SendWR{ID: StrayWRID, Opcode: op, Flags: transport.FlagSignaled, RemoteAddr: va, RKey: rkey,
		SGL: []transport.SGE{{Addr: m.Addr(), Length: uint32(len(data)), LKey: m.LKey()}}}
	q.mu.Lock()
	switch {
	case q.state != transport.QPRTS:
		st := q.state
		q.mu.Unlock()
		return 0, fmt.Errorf("emu: stray from qp %d in %s: %w", q.num, st, transport.ErrInvalidState)
	case q.stray != nil:
		q.mu.Unlock()
		return 0, fmt.Errorf("emu: stray from qp %d: one already in flight: %w", q.num, transport.ErrBusy)
	}
	q.stray = done
	err = q.postOneLocked(&wr, 0)
	if err != nil {
		q.stray = nil
	}
	q.unlock()
	if err != nil {
		return 0, err
	}
	q.kick()
	// Every posted WR completes or flushes; a QP destroyed meanwhile never
	// reports, so the wait is bounded.
	select {
	case st := <-done:
		if op == transport.OpRDMARead {
			copy(data, a.Bytes())
		}
		return st, nil
	case <-time.After(10 * time.Second):
		q.mu.Lock()
		if q.stray == done {
			q.stray = nil
		}
		q.mu.Unlock()
		return 0, fmt.Errorf("emu: stray from qp %d: no completion: %w", q.num, context.DeadlineExceeded)
	}
}
