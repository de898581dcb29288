package frmr

// What the pool shows of itself: counters, the key horizon, a walk over
// its slots, and the invariant check.

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// keyHorizon computes Stats.KeyHorizon.
func (p *Pool) keyHorizon() uint64 {
	switch {
	case p.mech == MW:
		// A retired window's index can come back (at once, on a device
		// that hands back the index freed last) only when the window
		// leaves the quarantine, WindowQuarantine rotations later, each
		// after maxBinds bindings.
		return uint64(p.cfg.WindowQuarantine) * maxBinds
	case p.cfg.IOVATag:
		// Tags count registrations from IOVABase; the initiator spaces
		// its channels' bases 2^32 apart, and a lone pool has at least
		// that many below the top of the iova space.
		return min(uint64(1)<<32, (^uint64(0))>>p.tagShift)
	}
	return 255
}

// Stats are the pool's counters and gauges.
type Stats struct {
	Size, Free, InUse, Tainted, Retiring int
	// Outstanding is the number of send-queue slots the pool accounts as
	// used (posted WRs whose slot has not been reclaimed).
	Outstanding int

	Registrations        uint64
	LocalInvalidations   uint64 // LOCAL_INVs issued
	LocalInvalidationsOK uint64 // ... proven successful
	RemoteInvalidations  uint64 // accepted SEND_WITH_INV invalidations
	BogusInvalidations   uint64
	Taints               uint64
	Replacements         uint64
	Rotations            uint64 // windows rotated before their key wrapped
	Deadlines            uint64
	LostCompletions      uint64 // signaled WRs whose completion was skipped
	PostFailures         uint64
	QPErrors             uint64
	Fences               uint64 // fenced LOCAL_INVs posted in front of registrations (Config.FenceRegistrations)
	// KeyHorizon is how many registrations of this pool back a
	// descriptor (key, iova) it advertised is guaranteed never to be
	// advertised again, so a peer presenting it is refused once its I/O
	// has returned: 2^32 with the FRMR iova tag, WindowQuarantine × 254
	// with windows (see "Stale descriptors" in the package doc), 255 for
	// untagged FRMRs.
	KeyHorizon uint64
}

// Stats returns counters and gauges.
func (p *Pool) Stats() Stats {
	st := p.st
	st.KeyHorizon = p.keyHorizon()
	st.Free, st.InUse, st.Outstanding = p.nFree, p.nInUse, p.ln
	st.Tainted, st.Retiring = 0, 0
	for i := range p.slots {
		if s := &p.slots[i]; s.state == Tainted {
			if s.pending > 0 {
				st.Retiring++
			} else {
				st.Tainted++
			}
		}
	}
	return st
}

// SlotInfo is the pool's view of one slot, for tests and diagnostics.
type SlotInfo struct {
	Slot    int
	State   State
	Index   uint32
	DevKey  transport.Key
	Gen     uint32
	Pending int
	Posted  bool
}

// Slots calls f for every slot.
func (p *Pool) Slots(f func(SlotInfo)) {
	for i := range p.slots {
		s := &p.slots[i]
		f(SlotInfo{Slot: i, State: s.state, Index: s.index, DevKey: s.devKey, Gen: s.gen, Pending: int(s.pending), Posted: s.posted})
	}
}

// Check verifies the pool's internal invariants (accounting, free list,
// ledger) and returns the first violation.
func (p *Pool) Check() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: %s", errInvariantViolated, fmt.Sprintf(f, a...))
	}
	var nf, nu, nt int
	for i := range p.slots {
		switch p.slots[i].state {
		case Free:
			nf++
		case Tainted:
			nt++
		default:
			nu++
		}
	}
	if nf != p.nFree || nu != p.nInUse || nt != p.nTainted {
		return bad("conservation: counted free/in-use/tainted %d/%d/%d, accounted %d/%d/%d", nf, nu, nt, p.nFree, p.nInUse, p.nTainted)
	}
	if nf+nu+nt != len(p.slots) {
		return bad("conservation: %d+%d+%d != size %d", nf, nu, nt, len(p.slots))
	}
	if len(p.free) != nf {
		return bad("free list holds %d, %d slots FREE", len(p.free), nf)
	}
	seen := make([]bool, len(p.slots))
	for _, si := range p.free {
		s := &p.slots[si]
		if seen[si] {
			return bad("slot %d twice on the free list", si)
		}
		seen[si] = true
		if s.state != Free {
			return bad("free-list gating: slot %d on the free list in state %s", si, s.state)
		}
	}
	pend := make([]int32, len(p.slots))
	run, maxRun := 0, 0
	for i := 0; i < p.ln; i++ {
		e := &p.ledger[(p.lhead+i)%len(p.ledger)]
		if (e.kind == kindReg || e.kind == kindInv) && p.slots[e.slot].gen == e.gen {
			pend[e.slot]++
		}
		if e.signaled {
			run = 0
		} else {
			run++
			maxRun = max(maxRun, run)
		}
	}
	for i := range p.slots {
		s := &p.slots[i]
		if pend[i] != s.pending {
			return bad("slot %d: %d ledger entries, pending %d", i, pend[i], s.pending)
		}
		if s.state == Free && s.pending != 0 {
			return bad("free-list gating: FREE slot %d named by %d outstanding WRs", i, s.pending)
		}
	}
	if p.ln > p.cfg.SQDepth {
		return bad("send-queue accounting: %d WRs outstanding, SQ holds %d", p.ln, p.cfg.SQDepth)
	}
	if maxRun >= p.cfg.SignalEvery {
		return bad("send-queue accounting: run of %d unsignaled WRs (SignalEvery %d)", maxRun, p.cfg.SignalEvery)
	}
	for k, si := range p.wait {
		if p.slots[si].waitIdx != int32(k) {
			return bad("wait list index of slot %d", si)
		}
	}
	return nil
}
