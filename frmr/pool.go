package frmr

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/gosrp/gosrp/transport"
)

// Mechanism is the fast-registration mechanism a pool uses.
type Mechanism uint8

// Mechanisms.
const (
	// Auto picks FRMR when the device has CapFastRegMR, else MW.
	Auto Mechanism = iota
	// FRMR: fast-registration MRs registered by REG_MR.
	FRMR
	// MW: type-2 memory windows bound by BIND_MW over Config.BaseMR.
	MW
)

func (m Mechanism) String() string {
	if names := [...]string{"auto", "frmr", "mw"}; int(m) < len(names) {
		return names[m]
	}
	return fmt.Sprintf("Mechanism(%d)", uint8(m))
}

// Direction says which way the peer moves data through a registration.
type Direction uint8

// Directions.
const (
	// PeerWrites: the peer RDMA-WRITEs into us (data-in, a read from
	// storage). Access REMOTE_WRITE|LOCAL_WRITE.
	PeerWrites Direction = iota
	// PeerReads: the peer RDMA-READs from us (data-out). Access
	// REMOTE_READ only.
	PeerReads
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

// Config configures a pool.
type Config struct {
	// PD is the protection domain of the QP the pool serves.
	PD transport.PD
	// Caps are the device's capabilities, used when Mechanism is Auto.
	Caps      transport.Capability
	Mechanism Mechanism
	// Size is the number of MRs (windows).
	Size int
	// MaxPages bounds one registration (FRMR only; default 16).
	MaxPages int
	// BaseMR is the arena MR windows are bound over (MW only); it must be
	// registered with MW_BIND and LOCAL_WRITE.
	BaseMR transport.MR
	// SQDepth is the QP's MaxSendWR. The pool keeps one slot for a drain
	// marker.
	SQDepth int
	// SignalEvery bounds runs of unsignaled WRs (default SQDepth/4, at
	// least 1).
	SignalEvery int
	// IOVATag makes every FRMR registration advertise an iova of its own:
	// the pool's registration count above the bits an I/O needs (see
	// "Stale descriptors" in the package doc), so a stale (rkey, iova)
	// fails the device's bounds check even when the 8-bit key has
	// wrapped. It ignores the buffer's address apart from its page
	// offset. Windows cannot choose their address; they rotate instead.
	IOVATag bool
	// IOVABase is added to the registration count the iova tag is made
	// of. Pools on one PD (the channels of a session) pass bases far
	// apart so that their tags never meet, whichever MR index the device
	// hands to whom.
	IOVABase uint64
	// WindowQuarantine is how many retired windows the pool keeps
	// allocated (and unbound) after rotating them, so the device cannot
	// hand their index out again while a peer may remember its keys
	// (MW only; default 4×Size). Each buys 254 registrations of key
	// horizon (Stats.KeyHorizon; "Stale descriptors" in the package
	// doc).
	WindowQuarantine int
	// DeadlineTicks is how many Ticks a signaled WR may stay uncompleted
	// (default 50).
	DeadlineTicks int
}

// CQDepth is the CQ size a QP with the given queue depths needs so that a
// full flush plus a drain marker never overruns it
// (docs/registration.md#cq-sizing).
func CQDepth(sqDepth, rqDepth int) int { return sqDepth + rqDepth + 1 }

// Segment is a buffer inside a registered arena.
type Segment struct {
	Arena *transport.Arena
	Off   int
	Len   int
	// Base, if set, is the MR a window is bound over instead of
	// Config.BaseMR (MW only). On a device that does not check window
	// bounds (transport.Quirks.WindowBoundsUnchecked) a window's key
	// reaches all of the MR under it, so a caller that must keep I/O
	// buffers apart binds each over an MR of its own.
	Base transport.MR
}

// maxBinds is how many registrations one window takes before it is
// rotated: its 8-bit key variant would next repeat one a peer was given
// (the avoid rule may skip one variant, hence one less than 255).
const maxBinds = 254

// Reg is one registration handed out by Get: a value handle, valid until
// Done reports true.
type Reg struct {
	slot   uint32
	gen    uint32
	rkey   transport.Key
	iova   uint64
	length int
	wr     transport.SendWR
}

// RKey is the key to advertise.
func (r *Reg) RKey() transport.Key { return r.rkey }

// IOVA is the address to advertise.
func (r *Reg) IOVA() uint64 { return r.iova }

// Len is the registered length.
func (r *Reg) Len() int { return r.length }

// Slot is the pool slot of the registration.
func (r *Reg) Slot() int { return int(r.slot) }

// WR is the REG_MR or BIND_MW work request to chain in front of the SEND
// that advertises the key.
func (r *Reg) WR() transport.SendWR { return r.wr }

// wr_id layout: tag(8) | kind(4) | slot(20) | gen(32).
const (
	idTag       = 0xF7
	kindCaller  = 0
	kindReg     = 1
	kindInv     = 2
	kindMarker  = 3
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
	return transport.SendWR{ID: makeID(kindInv, r.slot, r.gen), Opcode: transport.OpLocalInv,
		Flags: transport.FlagSignaled, InvalidateKey: s.devKey}, nil
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
	return nil
}
