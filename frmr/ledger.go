package frmr

// The send-queue ledger: admitting chains, recording posts, and settling
// completions in order, which is how the pool learns what the device did.

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// Admit checks that chain fits on the send queue (keeping one slot for a
// drain marker) and sets FlagSignaled where needed: on each caller WR
// that carries a registration's key (its completion gates recycling,
// docs/registration.md#when-a-buffer-goes-back; see carriers) and so that
// no run of unsignaled WRs reaches SignalEvery. Call it right before
// PostSend, then Posted.
func (p *Pool) Admit(chain []transport.SendWR) error {
	if p.closed {
		return ErrClosed
	}
	room := p.cfg.SQDepth - 1 - p.ln
	if len(chain) == 1 {
		if k, _, _, ok := decodeID(chain[0].ID); ok && k == kindMarker {
			room++
		}
	}
	if len(chain) > room {
		return ErrSQFull
	}
	if p.fenceOn() {
		p.admitFence(chain)
	}
	carriers(chain, func(_, c int) {
		if c >= 0 {
			chain[c].Flags |= transport.FlagSignaled
		}
	})
	run := p.unsigRun
	for i := range chain {
		wr := &chain[i]
		if wr.Flags&transport.FlagSignaled == 0 && run+1 >= p.cfg.SignalEvery {
			wr.Flags |= transport.FlagSignaled
		}
		if wr.Flags&transport.FlagSignaled != 0 {
			run = 0
		} else {
			run++
		}
	}
	return nil
}

// Room is how many WRs Admit would take now: the send queue's depth less
// what is outstanding and the one slot kept for a drain marker. A caller
// that batches several chains into one PostSend checks it as it stages.
func (p *Pool) Room() int { return p.cfg.SQDepth - 1 - p.ln }

// isReg reports whether wr is the registration of a current Get.
func (p *Pool) isReg(wr *transport.SendWR) (slot uint32, ok bool) {
	k, si, gen, own := decodeID(wr.ID)
	return si, own && k == kindReg && int(si) < len(p.slots) && p.slots[si].gen == gen
}

// carriers calls f with the index of each registration in chain and of
// the caller's WR that carries its key to the peer, or -1 if none does. A
// run of registrations is carried by the caller's WRs after it, one each
// in order, when at least as many follow before the next registration
// (the fenced layout: fence, REG, REG, SEND, SEND); otherwise the first
// caller's WR after the run carries them all (REG, SEND; or several
// registrations of one command).
func carriers(chain []transport.SendWR, f func(reg, carrier int)) {
	for i := 0; i < len(chain); {
		if k, _, _, own := decodeID(chain[i].ID); !own || k != kindReg {
			i++
			continue
		}
		start := i
		for i < len(chain) {
			if k, _, _, own := decodeID(chain[i].ID); !own || k != kindReg {
				break
			}
			i++
		}
		regs := i - start
		// The caller's WRs up to the next registration (pool WRs among
		// them, a fence or a LOCAL_INV, carry nothing).
		var callers, first = 0, -1
		j := i
		for ; j < len(chain); j++ {
			k, _, _, own := decodeID(chain[j].ID)
			if own && k == kindReg {
				break
			}
			if !own {
				if first < 0 {
					first = j
				}
				callers++
			}
		}
		if callers >= regs {
			c := i
			for r := start; r < i; r++ {
				for {
					if _, _, _, own := decodeID(chain[c].ID); !own {
						break
					}
					c++
				}
				f(r, c)
				c++
			}
			continue
		}
		for r := start; r < i; r++ {
			f(r, first)
		}
	}
}

// Posted records the outcome of PostSend(chain): n WRs were accepted. WRs
// from chain[n] on were never posted and are never waited for; a
// registration or invalidation among them, or a registration whose
// carrying WR (see carriers) was not posted, taints its MR.
func (p *Pool) Posted(chain []transport.SendWR, n int) {
	seq0 := p.seq      // the seq of chain[0], if posted
	fenceOpen := false // a fence LOCAL_INV posted, its registration not yet
	for i := range chain {
		wr := &chain[i]
		k, si, gen, own := decodeID(wr.ID)
		fence := own && k == kindFence // names the barrier, not a slot
		if own && !fence && (int(si) >= len(p.slots) || p.slots[si].gen != gen) {
			own = false
		}
		if i >= n {
			if own && (k == kindReg || k == kindInv) {
				p.taint(si)
			}
			continue
		}
		e := entry{id: wr.ID, seq: p.seq, posted: p.tick, signaled: wr.Flags&transport.FlagSignaled != 0, kind: kindCaller}
		p.seq++
		switch {
		case fence:
			e.kind = kindFence
			p.postedFence(wr)
			fenceOpen = wr.Opcode == transport.OpLocalInv
		case own:
			e.kind, e.slot, e.gen = uint8(k), si, gen
			s := &p.slots[si]
			switch k {
			case kindReg:
				s.pending++
				s.posted = true
				s.devKey = wr.Reg.Key
				if p.mech == MW {
					s.devKey = wr.Bind.Key
				}
				s.since = p.tick
				if s.state == RegPosted && s.waitIdx < 0 {
					s.waitIdx = int32(len(p.wait))
					p.wait = append(p.wait, si)
				}
			case kindInv:
				s.pending++
				s.since = p.tick
			}
		}
		if e.signaled {
			p.unsigRun = 0
		} else {
			p.unsigRun++
		}
		p.push(e)
	}
	if n < len(chain) {
		p.st.PostFailures++
	}
	if fenceOpen {
		// The barrier was invalidated and not registered again: the
		// next fence would invalidate a FREE window.
		p.fence.broken = true
	}
	carriers(chain, func(r, c int) {
		si, ok := p.isReg(&chain[r])
		if !ok || r >= n {
			return // tainted above
		}
		if c < 0 || c >= n {
			// A posted registration whose key never went out: it is
			// VALID on the device, and nobody will invalidate it
			// remotely.
			p.taint(si)
			return
		}
		p.slots[si].sendSeq = seq0 + uint64(c)
	})
}

func (p *Pool) push(e entry) {
	if p.ln == len(p.ledger) {
		// More posted than the SQ holds: the caller bypassed Admit. Grow
		// rather than lose track (Check reports it).
		n := make([]entry, 2*len(p.ledger))
		for i := 0; i < p.ln; i++ {
			n[i] = p.ledger[(p.lhead+i)%len(p.ledger)]
		}
		p.ledger, p.lhead = n, 0
	}
	p.ledger[(p.lhead+p.ln)%len(p.ledger)] = e
	p.ln++
}

// DrainMarker returns a signaled WR to post after moving the QP to ERR;
// when its (flush) completion has been passed to OnSendCompletion, every
// earlier WR has completed (ib_drain_sq).
func (p *Pool) DrainMarker() transport.SendWR {
	return transport.SendWR{ID: makeID(kindMarker, 0, uint32(p.seq)), Opcode: transport.OpSend, Flags: transport.FlagSignaled}
}

// Drained reports whether no posted WR is outstanding.
func (p *Pool) Drained() bool { return p.ln == 0 }

// OnSendCompletion consumes a completion from the QP's send queue (every
// one, the caller's and the pool's, in the order polled). Only ID and
// Status are read. It reports whether the completion belonged to a WR
// the pool tracks. A SUCCESS completion proves the unsignaled WRs before
// it; if a signaled WR before it has had no completion, that completion
// was lost or the WR was dropped, and the pool taints what those WRs name
// and enters the error state (Err reports ErrLostCompletion).
func (p *Pool) OnSendCompletion(wc *transport.WC) bool {
	id, ok := wc.ID, wc.Status == transport.StatusSuccess
	j := -1
	for i := 0; i < p.ln; i++ {
		if p.ledger[(p.lhead+i)%len(p.ledger)].id == id {
			j = i
			break
		}
	}
	if j < 0 {
		return false
	}
	// A signaled WR before this one whose completion never came: a conforming
	// device reports every signaled WR, in order
	// (docs/verbs.md#send-queue-ordering-and-fences,
	// docs/verbs.md#completions), so either the completion was lost
	// (docs/registration.md#lost-completion,
	// docs/registration.md#completions-lost-in-a-flush) or the WR never
	// reached the device (docs/registration.md#posts-before-rts: a post
	// before RTS that a device dropped silently). This completion then proves
	// nothing about the skipped WRs, and inferring their success would free
	// an MR whose LOCAL_INV never executed
	// (docs/registration.md#proof-of-invalidation) or take a never-executed
	// REG for VALID. Treat the popped WRs as unknown outcomes
	// (docs/registration.md#taint-on-error) and escalate to teardown
	// (docs/registration.md#bounded-waits).
	if ok {
		for i := 0; i < j; i++ {
			if e := &p.ledger[(p.lhead+i)%len(p.ledger)]; e.signaled {
				ok = false
				p.lost = true
				p.st.LostCompletions++
				if p.cause == nil {
					p.cause = fmt.Errorf("signaled %s wr_id %#x (%d of %d outstanding) had no completion before wr_id %#x", kindName(e.kind), e.id, i+1, p.ln, id)
				}
				break
			}
		}
	}
	if !ok && p.cause == nil {
		p.cause = fmt.Errorf("wr_id %#x completed %s", id, wc.Status)
	}
	var last uint64
	for i := 0; i <= j; i++ {
		e := &p.ledger[p.lhead]
		p.lhead = (p.lhead + 1) % len(p.ledger)
		p.ln--
		last = e.seq
		p.settle(e, ok)
	}
	if p.ln == 0 {
		p.unsigRun = 0
	}
	if !ok {
		// An error completion means the QP is in ERR (or, after a
		// skipped completion, must be treated as if it were).
		p.OnQPError()
		return true
	}
	// Every WR up to seq last completed successfully: SENDs that carried
	// keys are done.
	for k := 0; k < len(p.wait); {
		si := p.wait[k]
		s := &p.slots[si]
		if s.sendSeq != 0 && s.sendSeq <= last || s.state != RegPosted {
			p.unwait(si)
			if s.state == RegPosted && s.sendSeq != 0 && s.sendSeq <= last {
				s.sendDone = true
				if s.remInv {
					p.st.RemoteInvalidations++
					p.toFree(si)
				} else {
					s.state = Valid
				}
			}
			continue
		}
		k++
	}
	return true
}

// settle applies the outcome of one popped ledger entry.
func (p *Pool) settle(e *entry, ok bool) {
	if e.kind == kindCaller || e.kind == kindMarker {
		return
	}
	if e.kind == kindFence {
		p.fence.pending--
		if !ok {
			p.fence.broken = true
		}
		return
	}
	s := &p.slots[e.slot]
	if s.gen != e.gen {
		return
	}
	s.pending--
	if !ok {
		p.taint(e.slot)
		return
	}
	if e.kind == kindInv && s.state == InvPosted {
		p.st.LocalInvalidationsOK++
		p.toFree(e.slot)
	}
}

func (p *Pool) unwait(si uint32) {
	s := &p.slots[si]
	if s.waitIdx < 0 {
		return
	}
	k := s.waitIdx
	last := p.wait[len(p.wait)-1]
	p.wait[k] = last
	p.slots[last].waitIdx = k
	p.wait = p.wait[:len(p.wait)-1]
	s.waitIdx = -1
}
