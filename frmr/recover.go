package frmr

// Failure handling: taint on a QP error, forget what will never complete,
// replace what cannot be vouched for, and the deadline tick.

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// OnQPError taints every MR not proven FREE. Get fails until the WRs still
// outstanding have been drained (their completions passed in) or Reset is
// called, and Recover has run.
func (p *Pool) OnQPError() {
	if !p.qpErr {
		p.st.QPErrors++
	}
	p.qpErr = true
	if p.fenceOn() {
		p.fence.broken = true // flushed, or bound through a QP now in ERR
	}
	for i := range p.slots {
		if st := p.slots[i].state; st != Free && st != Tainted {
			p.taint(uint32(i))
		}
	}
}

// Reset forgets every outstanding WR: the QP was destroyed or reset, or
// it is in ERR and will be destroyed without its completions being
// polled, so none of them will come. Implies OnQPError.
func (p *Pool) Reset() {
	p.OnQPError()
	for p.ln > 0 {
		e := &p.ledger[p.lhead]
		p.lhead = (p.lhead + 1) % len(p.ledger)
		p.ln--
		if e.kind == kindReg || e.kind == kindInv {
			if s := &p.slots[e.slot]; s.gen == e.gen {
				s.pending--
			}
		}
		if e.kind == kindFence {
			p.fence.pending--
		}
	}
	p.lhead, p.unsigRun = 0, 0
}

// Recover deregisters every TAINTED MR that no outstanding WR names and
// replaces it with a freshly allocated one. After a QP error it returns
// ErrNotDrained until the send queue is drained or Reset; on success the
// pool leaves the error state. The caller connects a new QP before
// posting again.
func (p *Pool) Recover() error {
	if p.closed {
		return ErrClosed
	}
	for i := range p.slots {
		s := &p.slots[i]
		if s.state != Tainted || s.pending > 0 {
			continue
		}
		old := *s
		// Allocate first so the device cannot hand the same index back.
		if err := p.alloc(s); err != nil {
			*s = old
			return err
		}
		p.remember(old.index, old.devKey, old.binds)
		if len(p.retiredLog) < cap(p.retiredLog) {
			p.retiredLog = append(p.retiredLog, retired{old.index, old.devKey, old.binds})
		} else {
			p.retiredLog[p.retiredPos] = retired{old.index, old.devKey, old.binds}
			p.retiredPos = (p.retiredPos + 1) % len(p.retiredLog)
		}
		old.dealloc()
		s.gen++
		p.st.Replacements++
		p.toFree(uint32(i))
	}
	if err := p.replaceFence(); err != nil {
		return err
	}
	if p.qpErr {
		if p.ln > 0 {
			return ErrNotDrained
		}
		p.qpErr, p.lost, p.cause = false, false, nil
	}
	return nil
}

// Err reports whether the pool needs the QP torn down: ErrLostCompletion
// after a skipped completion, ErrQPError after any other QP error, nil
// otherwise. It clears when Recover succeeds.
func (p *Pool) Err() error {
	var err error
	switch {
	case p.lost:
		err = ErrLostCompletion
	case p.qpErr:
		err = ErrQPError
	default:
		return nil
	}
	if p.cause != nil {
		return fmt.Errorf("%w: %w", err, p.cause)
	}
	return err
}

// RecoverOn moves the pool to a new PD (a new connection on another PD):
// every MR is replaced. For windows, base is the new arena MR.
func (p *Pool) RecoverOn(pd transport.PD, base transport.MR) error {
	p.Reset()
	for i := range p.slots {
		p.taint(uint32(i))
	}
	p.pd = pd
	if base != nil {
		p.base = base
	}
	if p.fenceOn() {
		p.closeFence(true) // its page's MR is on the old PD
		if err := p.newFence(); err != nil {
			return err
		}
	}
	return p.Recover()
}

// Waiting reports whether Tick has anything to time: a signaled WR
// outstanding, an MR waiting for its LOCAL_INV, or a skipped completion
// still to report. A caller may stop ticking a pool that waits for
// nothing (an idle connection) and tick it again once it does: a
// deadline counts the Ticks since its WR was posted, so the Ticks a quiet
// pool was not given shorten no deadline.
func (p *Pool) Waiting() bool {
	if p.lost {
		return true
	}
	for i := 0; i < p.ln; i++ {
		if p.ledger[(p.lhead+i)%len(p.ledger)].signaled {
			return true
		}
	}
	for i := range p.slots {
		if p.slots[i].state == InvPosted {
			return true
		}
	}
	return false
}

// Tick advances the pool's clock. If a signaled WR the pool tracks has been
// outstanding for DeadlineTicks, or an MR has waited that long for its
// invalidation, the waiting MRs are tainted and ErrDeadline is returned:
// tear the QP down (OnQPError, drain with a bound, Reset). After a skipped
// completion (see OnSendCompletion) it returns ErrLostCompletion until
// Recover.
func (p *Pool) Tick() error {
	p.tick++
	dl := int64(p.cfg.DeadlineTicks)
	var late error // which wait ran past the deadline, for the log
	for i := 0; i < p.ln; i++ {
		e := &p.ledger[(p.lhead+i)%len(p.ledger)]
		if e.signaled {
			if p.tick-e.posted > dl {
				late = fmt.Errorf("signaled %s wr_id %#x (%d of %d outstanding) posted %d ticks ago", kindName(e.kind), e.id, i+1, p.ln, p.tick-e.posted)
			}
			break
		}
	}
	for i := range p.slots {
		s := &p.slots[i]
		if late == nil && s.state == InvPosted && p.tick-s.since > dl {
			late = fmt.Errorf("slot %d (key %s) has waited %d ticks for its LOCAL_INV", i, s.devKey, p.tick-s.since)
		}
	}
	if late == nil {
		if p.lost {
			return ErrLostCompletion
		}
		return nil
	}
	p.st.Deadlines++
	p.OnQPError()
	if p.cause == nil {
		p.cause = late
	}
	return fmt.Errorf("%w: %w", ErrDeadline, late)
}
