package frmr

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/gosrp/gosrp/transport"
)

// State is the pool's view of one MR.
type State uint8

// States (see the package doc).
const (
	Free State = iota
	RegPosted
	Valid
	InvPosted
	Tainted
)

func (s State) String() string {
	if names := [...]string{"FREE", "REG_POSTED", "VALID", "INV_POSTED", "TAINTED"}; int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Errors.
var (
	ErrExhausted         = errors.New("frmr: no free MR")
	ErrSQFull            = errors.New("frmr: send queue has no room for the chain")
	ErrQPError           = errors.New("frmr: QP in error; drain or Reset, then Recover")
	ErrNotDrained        = errors.New("frmr: WRs still outstanding; drain or Reset first")
	ErrBogusInvalidate   = errors.New("frmr: remote invalidation of a key not registered for the request")
	ErrDeadline          = errors.New("frmr: completion missing past the deadline; tear the QP down")
	ErrLostCompletion    = errors.New("frmr: a signaled WR's completion was skipped (lost completion or dropped post); tear the QP down")
	ErrStaleReg          = errors.New("frmr: registration handle is stale or in the wrong state")
	ErrSegment           = errors.New("frmr: segment not usable for registration")
	ErrClosed            = errors.New("frmr: pool closed")
	errInvariantViolated = errors.New("frmr: invariant violated")
)

// wr_id layout: tag(8) | kind(4) | slot(20) | gen(32).
const (
	idTag       = 0xF7
	kindCaller  = 0
	kindReg     = 1
	kindInv     = 2
	kindMarker  = 3
	kindFence   = 4
	maxSlots    = 1 << 20
	idKindShift = 52
	idSlotShift = 32
)

// kindName names a ledger entry's kind for errors.
func kindName(k uint8) string {
	switch k {
	case kindReg:
		return "REG_MR/BIND_MW"
	case kindInv:
		return "LOCAL_INV"
	case kindMarker:
		return "drain marker"
	case kindFence:
		return "registration fence"
	}
	return "caller's WR"
}

func makeID(kind uint64, slot, gen uint32) uint64 {
	return idTag<<56 | kind<<idKindShift | uint64(slot)<<idSlotShift | uint64(gen)
}

func decodeID(id uint64) (kind uint64, slot, gen uint32, ok bool) {
	if id>>56 != idTag {
		return 0, 0, 0, false
	}
	return id >> idKindShift & 0xf, uint32(id>>idSlotShift) & (maxSlots - 1), uint32(id), true
}

type slot struct {
	state    State
	mr       transport.FastRegMR
	mw       transport.MW
	index    uint32
	devKey   transport.Key // key the device holds, or will once the posted REG executes
	avoid    transport.Key // a retired key of the same index, never reissued
	hasAvoid bool
	gen      uint32
	binds    int   // registrations since the window was allocated (MW)
	pending  int32 // ledger entries naming this slot
	posted   bool  // the REG/BIND is on the send queue
	sendSeq  uint64
	sendDone bool
	remInv   bool
	waitIdx  int32
	since    int64
	dir      Direction
}

type entry struct {
	id       uint64
	seq      uint64
	posted   int64 // tick
	signaled bool
	kind     uint8
	slot     uint32
	gen      uint32
}

type retired struct {
	index uint32
	key   transport.Key
	binds int // bindings the window had made (MW)
}

// Pool is a fast-registration pool for one QP. See the package doc.
type Pool struct {
	cfg   Config
	mech  Mechanism
	pd    transport.PD
	base  transport.MR
	slots []slot
	free  []uint32 // index stack
	wait  []uint32 // REG_POSTED slots whose SEND is not yet proven done

	nFree, nInUse, nTainted int

	ledger     []entry // ring, capacity SQDepth
	lhead, ln  int
	seq        uint64
	unsigRun   int
	tick       int64
	qpErr      bool
	lost       bool  // a skipped signaled completion was seen; cleared by Recover
	cause      error // what first put the pool in the error state, for the log
	closed     bool
	retiredLog []retired
	retiredPos int
	// windows is, per window index the pool has held, where its variants
	// stopped (MW): a window reborn at that index goes on from there.
	windows    map[uint32]retired
	regCount   uint64         // registrations ever made: the iova tag
	tagShift   uint           // bits of an FRMR iova below the tag
	quarantine []transport.MW // rotated windows, oldest first
	fence      fence          // Config.FenceRegistrations (fence.go)

	st Stats
}

// New allocates the pool's MRs.
func New(cfg Config) (*Pool, error) {
	if cfg.PD == nil || cfg.Size <= 0 || cfg.Size >= maxSlots || cfg.SQDepth < 3 {
		return nil, fmt.Errorf("frmr: config needs a PD, 0 < Size < %d and SQDepth >= 3: %w", maxSlots, transport.ErrInvalidArgument)
	}
	mech := cfg.Mechanism
	if mech == Auto {
		mech = MW
		if cfg.Caps.Has(transport.CapFastRegMR) {
			mech = FRMR
		}
	}
	if mech == MW && cfg.BaseMR == nil {
		return nil, fmt.Errorf("frmr: memory windows need Config.BaseMR: %w", transport.ErrInvalidArgument)
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = 16
	}
	if cfg.SignalEvery <= 0 {
		cfg.SignalEvery = max(cfg.SQDepth/4, 1)
	}
	cfg.SignalEvery = min(cfg.SignalEvery, cfg.SQDepth-2)
	if cfg.DeadlineTicks <= 0 {
		cfg.DeadlineTicks = 50
	}
	if cfg.WindowQuarantine <= 0 {
		cfg.WindowQuarantine = 4 * cfg.Size
	}
	p := &Pool{
		cfg: cfg, mech: mech, pd: cfg.PD, base: cfg.BaseMR,
		slots:      make([]slot, cfg.Size),
		free:       make([]uint32, 0, cfg.Size),
		wait:       make([]uint32, 0, cfg.Size),
		ledger:     make([]entry, cfg.SQDepth),
		retiredLog: make([]retired, 0, 2*cfg.Size),
		windows:    map[uint32]retired{},
		seq:        1, // 0 means "no carrying SEND yet"
	}
	p.st.Size = cfg.Size
	// An I/O of MaxPages pages starting anywhere in its first page fits
	// below the tag, so the ranges of two registrations never overlap.
	p.tagShift = uint(bits.Len64(uint64((cfg.MaxPages+1)*transport.PageSize - 1)))
	for i := range p.slots {
		s := &p.slots[i]
		s.waitIdx = -1
		if err := p.alloc(s); err != nil {
			p.Close()
			return nil, err
		}
		s.state = Free
		p.free = append(p.free, uint32(i))
		p.nFree++
	}
	if p.fenceOn() {
		if err := p.newFence(); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// Mechanism is the mechanism in use.
func (p *Pool) Mechanism() Mechanism { return p.mech }

func (p *Pool) alloc(s *slot) error {
	var k transport.Key
	if p.mech == FRMR {
		m, err := p.pd.AllocFastRegMR(p.cfg.MaxPages)
		if err != nil {
			return fmt.Errorf("frmr: alloc fast-reg MR: %w", err)
		}
		s.mr, k = m, m.Key()
	} else {
		w, err := p.pd.AllocMW()
		if err != nil {
			return fmt.Errorf("frmr: alloc MW: %w", err)
		}
		s.mw, k = w, w.Key()
	}
	s.index = k.Index()
	s.devKey = k
	s.binds = 0
	s.hasAvoid = false
	if p.mech == MW {
		// A window's bind chooses its key, so a new window at an index
		// the pool has held goes on where the last one there stopped and
		// rotates before the lives since its last quarantine together
		// use up the variants: no remembered key comes back with the
		// device's random initial variant.
		if r, ok := p.windows[s.index]; ok {
			s.devKey, s.binds = r.key, r.binds
		}
		return nil
	}
	for _, r := range p.retiredLog {
		if r.index == s.index {
			s.avoid, s.hasAvoid = r.key, true
		}
	}
	return nil
}

func (s *slot) dealloc() {
	if s.mr != nil {
		s.mr.Close()
		s.mr = nil
	}
	if s.mw != nil {
		s.mw.Close()
		s.mw = nil
	}
}

// Get takes a FREE MR, bumps its key and stages a registration of seg
// with the access dir needs. The returned Reg's WR must be chained in front
// of the SEND that advertises the key; no wait is needed.
func (p *Pool) Get(seg Segment, dir Direction) (Reg, error) {
	if p.closed {
		return Reg{}, ErrClosed
	}
	if p.qpErr {
		if p.cause != nil {
			return Reg{}, fmt.Errorf("%w: %w", ErrQPError, p.cause)
		}
		return Reg{}, ErrQPError
	}
	if p.nTainted > 0 {
		if err := p.Recover(); err != nil && !errors.Is(err, ErrNotDrained) {
			return Reg{}, err
		}
	}
	if seg.Arena == nil || seg.Len <= 0 || seg.Off < 0 || seg.Off+seg.Len > seg.Arena.Len() {
		return Reg{}, ErrSegment
	}
	if p.fenceOn() && (!p.fence.bound || p.fence.broken) {
		return Reg{}, ErrNoFence
	}
	if len(p.free) == 0 {
		return Reg{}, ErrExhausted
	}
	i := p.free[len(p.free)-1]
	s := &p.slots[i]
	if p.mech == MW && s.binds >= maxBinds {
		if err := p.rotate(s); err != nil {
			return Reg{}, err
		}
	}
	key := s.devKey.Bump()
	if s.hasAvoid && key == s.avoid {
		key = key.Bump()
	}
	addr := seg.Arena.Addr() + uint64(seg.Off)
	r := Reg{slot: i, gen: s.gen + 1, rkey: key, length: seg.Len}
	if p.mech == FRMR {
		iova := addr
		if p.cfg.IOVATag {
			if seg.Len > p.cfg.MaxPages*transport.PageSize {
				return Reg{}, ErrSegment
			}
			iova = (p.cfg.IOVABase+p.regCount)<<p.tagShift | addr&uint64(transport.PageSize-1)
		}
		if err := s.mr.Map(seg.Arena, seg.Off, seg.Len, iova); err != nil {
			return Reg{}, fmt.Errorf("%w: %w", ErrSegment, err)
		}
		acc := transport.AccessRemoteRead
		if dir == PeerWrites {
			acc = transport.AccessRemoteWrite | transport.AccessLocalWrite
		}
		r.iova = iova
		r.wr = transport.SendWR{ID: makeID(kindReg, i, r.gen), Opcode: transport.OpRegMR,
			Reg: transport.RegWR{MR: s.mr, Key: key, Access: acc}}
	} else {
		b := p.base
		if seg.Base != nil {
			b = seg.Base
		}
		if b.Arena() != seg.Arena || addr < b.Addr() || addr+uint64(seg.Len) > b.Addr()+uint64(b.Len()) {
			return Reg{}, ErrSegment
		}
		acc := transport.AccessRemoteRead
		if dir == PeerWrites {
			acc = transport.AccessRemoteWrite
		}
		r.iova = addr
		r.wr = transport.SendWR{ID: makeID(kindReg, i, r.gen), Opcode: transport.OpBindMW,
			Bind: transport.BindWR{MW: s.mw, Key: key, MR: b, Addr: addr, Length: uint64(seg.Len), Access: acc}}
	}
	p.regCount++
	s.binds++
	p.free = p.free[:len(p.free)-1]
	p.nFree--
	p.nInUse++
	s.gen = r.gen
	s.state = RegPosted
	s.posted, s.sendDone, s.remInv = false, false, false
	s.sendSeq = 0
	s.dir = dir
	s.since = p.tick
	p.st.Registrations++
	return r, nil
}

// Cancel returns a registration whose WR was never posted: the device
// never saw it, so the MR is FREE as before.
func (p *Pool) Cancel(r Reg) error {
	s, ok := p.cur(r)
	if !ok || s.state != RegPosted || s.posted {
		return ErrStaleReg
	}
	p.toFree(r.slot)
	return nil
}

func (p *Pool) cur(r Reg) (*slot, bool) {
	if int(r.slot) >= len(p.slots) {
		return nil, false
	}
	s := &p.slots[r.slot]
	return s, s.gen == r.gen
}

func (p *Pool) toFree(si uint32) {
	s := &p.slots[si]
	p.unwait(si)
	switch s.state {
	case Free:
		return
	case Tainted:
		p.nTainted--
	default:
		p.nInUse--
	}
	s.state = Free
	s.posted, s.remInv, s.sendDone = false, false, false
	p.free = append(p.free, si)
	p.nFree++
}

func (p *Pool) taint(si uint32) {
	s := &p.slots[si]
	switch s.state {
	case Tainted:
		return
	case Free:
		// A FREE slot is on the free list; take it off.
		for k, f := range p.free {
			if f == si {
				p.free = append(p.free[:k], p.free[k+1:]...)
				break
			}
		}
		p.nFree--
	default:
		p.nInUse--
	}
	p.unwait(si)
	s.state = Tainted
	p.nTainted++
	p.st.Taints++
}

// OnRemoteInvalidate records that the response for r arrived in a receive
// completion with WITH_INV naming key (read only from a SUCCESS
// completion). If key is r's device key the MR becomes FREE once the SEND
// that carried it has completed. Any other key is a protocol error: r's MR
// and any in-use MR of key's index are tainted and ErrBogusInvalidate is
// returned; the caller should reset the connection.
func (p *Pool) OnRemoteInvalidate(r Reg, key transport.Key) error {
	s, cur := p.cur(r)
	if cur && key == r.rkey && key == s.devKey && s.posted && (s.state == RegPosted || s.state == Valid) && !s.remInv {
		s.remInv = true
		if s.sendDone {
			p.st.RemoteInvalidations++
			p.toFree(r.slot)
		}
		return nil
	}
	// The slot's state says which rule refused it: a bogus key, or a
	// right key for a registration the pool no longer holds valid (the
	// slot tainted or replaced meanwhile).
	st := "replaced"
	if cur {
		st = fmt.Sprintf("%s, device key %s, posted %v, already invalidated %v", s.state, s.devKey, s.posted, s.remInv)
	}
	p.st.BogusInvalidations++
	if cur {
		p.taint(r.slot)
	}
	for i := range p.slots {
		if x := &p.slots[i]; x.index == key.Index() && x.state != Free {
			p.taint(uint32(i))
		}
	}
	return fmt.Errorf("%w: %s (registered %s; slot %d %s)", ErrBogusInvalidate, key, r.rkey, r.slot, st)
}

// Invalidate returns the signaled LOCAL_INV naming r's device key; post
// it (through Admit/Posted). The MR becomes FREE when it completes
// SUCCESS.
func (p *Pool) Invalidate(r Reg) (transport.SendWR, error) {
	s, cur := p.cur(r)
	if !cur || !s.posted || s.remInv || (s.state != RegPosted && s.state != Valid) {
		return transport.SendWR{}, ErrStaleReg
	}
	p.unwait(r.slot)
	s.state = InvPosted
	s.since = p.tick
	p.st.LocalInvalidations++
	flags := transport.FlagSignaled
	if p.cfg.FenceInvalidate {
		flags |= transport.FlagFence
	}
	return transport.SendWR{ID: makeID(kindInv, r.slot, r.gen), Opcode: transport.OpLocalInv,
		Flags: flags, InvalidateKey: s.devKey}, nil
}

// Done reports whether r's buffer may be handed back to the application:
// its MR is proven FREE, or was deregistered.
func (p *Pool) Done(r Reg) bool {
	s, cur := p.cur(r)
	return !cur || s.state == Free
}

// Close deregisters every MR and window. Call it once no WR of the pool's
// can execute any more (the QP idle, or in ERR and drained or Reset) and
// before the QP is destroyed: a window bound through the QP may hold it
// (transport.Quirks.DestroyQPInvalidatesWindows).
func (p *Pool) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	for i := range p.slots {
		p.slots[i].dealloc()
	}
	for _, w := range p.quarantine {
		w.Close()
	}
	p.quarantine = nil
	p.closeFence(true)
	if p.fence.arena != nil {
		p.fence.arena.Close()
		p.fence.arena = nil
	}
	return nil
}
