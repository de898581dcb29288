package frmr

// The registration fence: on a device whose retries execute local
// operations again (Config.FenceRegistrations), every registration runs
// behind a fenced LOCAL_INV, so no retry can rewind over it.

import (
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// ErrNoFence is returned by Get when the registration fence is not in
// place: the Prologue was never posted on this QP, or the barrier's
// state became unknown (a partial post, an error completion). Tear the
// QP down; Recover replaces the barrier.
var ErrNoFence = errors.New("frmr: the registration fence is not in place; post the Prologue on a new QP")

// fence is the barrier object the fence invalidates and registers again
// in front of every registration: a window, or an FRMR, over a private
// page, with no remote access at all, so its keys grant nothing.
//
// Why it works (docs/registration.md#registration-repeated-by-a-retry):
// rxe's req_retry rewinds to the oldest request not yet completed and
// executes every local operation from there on again; a BIND_MW or
// REG_MR repeated over its VALID object fails and ends the connection.
// A fenced LOCAL_INV executes only once every WR before it has
// completed, and local operations complete as soon as they execute, so
// a registration right behind it has nothing before it a retry could
// rewind to. The fence must itself be valid for the LOCAL_INV to name
// (a LOCAL_INV of a FREE window oopses rxe), which is why it is
// registered again at once, and why its first registration is posted as
// the first WR of a new QP (Prologue).
type fence struct {
	arena *transport.Arena
	mr    transport.MR // the page's MR, windows bind over it
	mw    transport.MW
	fr    transport.FastRegMR
	key   transport.Key // the device's key once the posted WRs have run
	// bound: the last posted fence WR was its registration, so the
	// device holds it VALID under key.
	bound bool
	// broken: its state is unknown (an error or flush completion, a
	// partial post, a QP error); Recover replaces it.
	broken  bool
	pending int    // ledger entries naming it
	posts   uint32 // fence pairs built, for their wr_ids
}

// fenceOn reports whether registrations are fenced.
func (p *Pool) fenceOn() bool { return p.cfg.FenceRegistrations }

// newFence allocates the barrier on the pool's PD: the page and its MR
// once per PD, the window or FRMR each time it is replaced.
func (p *Pool) newFence() error {
	f := &p.fence
	if f.arena == nil {
		a, err := transport.NewArena(transport.PageSize, transport.ArenaOptions{})
		if err != nil {
			return fmt.Errorf("frmr: fence page: %w", err)
		}
		f.arena = a
	}
	if f.mr == nil && p.mech == MW {
		m, err := p.pd.RegMR(f.arena, 0, f.arena.Len(), transport.AccessLocalWrite|transport.AccessMWBind)
		if err != nil {
			return fmt.Errorf("frmr: register the fence page: %w", err)
		}
		f.mr = m
	}
	if p.mech == MW {
		w, err := p.pd.AllocMW()
		if err != nil {
			return fmt.Errorf("frmr: alloc the fence window: %w", err)
		}
		f.mw, f.key = w, w.Key()
	} else {
		m, err := p.pd.AllocFastRegMR(1)
		if err != nil {
			return fmt.Errorf("frmr: alloc the fence MR: %w", err)
		}
		if err := m.Map(f.arena, 0, f.arena.Len(), f.arena.Addr()); err != nil {
			m.Close()
			return fmt.Errorf("frmr: map the fence page: %w", err)
		}
		f.fr, f.key = m, m.Key()
	}
	f.bound, f.broken, f.pending = false, false, 0
	return nil
}

// closeFence deallocates the barrier; with pd, the page's MR too (the
// pool moves to another PD, or closes).
func (p *Pool) closeFence(pd bool) {
	f := &p.fence
	if f.mw != nil {
		f.mw.Close()
		f.mw = nil
	}
	if f.fr != nil {
		f.fr.Close()
		f.fr = nil
	}
	if pd && f.mr != nil {
		f.mr.Close()
		f.mr = nil
	}
	f.bound = false
}

// replaceFence deallocates a broken barrier no outstanding WR names and
// allocates a new one, which the next Prologue registers.
func (p *Pool) replaceFence() error {
	f := &p.fence
	if !p.fenceOn() || !f.broken || f.pending > 0 {
		return nil
	}
	p.closeFence(false)
	return p.newFence()
}

// registerFence is the barrier's registration, its key left for Admit.
func (p *Pool) registerFence(id uint64) transport.SendWR {
	f := &p.fence
	if p.mech == MW {
		return transport.SendWR{ID: id, Opcode: transport.OpBindMW,
			Bind: transport.BindWR{MW: f.mw, MR: f.mr, Addr: f.mr.Addr(), Length: uint64(f.mr.Len())}}
	}
	return transport.SendWR{ID: id, Opcode: transport.OpRegMR, Reg: transport.RegWR{MR: f.fr}}
}

// Prologue appends to chain what must be the first WRs posted on a new
// QP, before the login: the fence's first registration, which has
// nothing before it a retry could rewind to. It appends nothing when
// registrations are not fenced or the fence is in place.
func (p *Pool) Prologue(chain []transport.SendWR) []transport.SendWR {
	if !p.fenceOn() || p.fence.bound || p.fence.broken || p.closed {
		return chain
	}
	p.fence.posts++
	return append(chain, p.registerFence(makeID(kindFence, 1, p.fence.posts)))
}

// FenceLen is how many WRs AppendFence adds in front of a post's
// registrations: 2 when registrations are fenced, else 0.
func (p *Pool) FenceLen() int {
	if p.fenceOn() {
		return 2
	}
	return 0
}

// AppendFence appends the fence that must come right before the
// registrations of a post (Reg.WR, nothing else between): a fenced
// LOCAL_INV of the barrier and its registration again. The commands that
// carry their keys follow them, one each, in the same order. It appends
// nothing when registrations are not fenced.
func (p *Pool) AppendFence(chain []transport.SendWR) []transport.SendWR {
	if !p.fenceOn() {
		return chain
	}
	p.fence.posts++
	return append(chain,
		transport.SendWR{ID: makeID(kindFence, 0, p.fence.posts), Opcode: transport.OpLocalInv, Flags: transport.FlagFence},
		p.registerFence(makeID(kindFence, 1, p.fence.posts)))
}

// admitFence gives the fence WRs of chain their keys, in posting order
// from the device's key: the LOCAL_INV names the key the barrier holds,
// the registration the next one.
func (p *Pool) admitFence(chain []transport.SendWR) {
	k := p.fence.key
	for i := range chain {
		wr := &chain[i]
		kind, _, _, own := decodeID(wr.ID)
		if !own || kind != kindFence {
			continue
		}
		switch wr.Opcode {
		case transport.OpLocalInv:
			wr.InvalidateKey = k
		case transport.OpBindMW:
			k = k.Bump()
			wr.Bind.Key = k
		case transport.OpRegMR:
			k = k.Bump()
			wr.Reg.Key = k
		}
	}
}

// postedFence records a posted fence WR.
func (p *Pool) postedFence(wr *transport.SendWR) {
	f := &p.fence
	f.pending++
	switch wr.Opcode {
	case transport.OpLocalInv:
		f.bound = false
		p.st.Fences++
	case transport.OpBindMW:
		f.bound, f.key = true, wr.Bind.Key
	case transport.OpRegMR:
		f.bound, f.key = true, wr.Reg.Key
	}
}
