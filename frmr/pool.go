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
	// KeyHorizon is how many registrations of this pool back a
	// descriptor (key, iova) it advertised is guaranteed never to be
	// advertised again, so a peer presenting it is refused once its I/O
	// has returned: 2^32 with the FRMR iova tag, WindowQuarantine × 254
	// with windows (see "Stale descriptors" in the package doc), 255 for
	// untagged FRMRs.
	KeyHorizon uint64
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

// rotate replaces a FREE window that has used up its key variants with a
// fresh one. The old window is not deallocated at once: it stays in the
// quarantine, unbound (every key of its index refused), so the device
// cannot give its index to a new window whose variants might meet the
// keys a peer remembers. Only the oldest of WindowQuarantine rotated
// windows is closed. The window is FREE, so no WR names it.
func (p *Pool) rotate(s *slot) error {
	old := s.mw
	if err := p.alloc(s); err != nil {
		s.mw = old
		return err
	}
	p.retire(old)
	p.st.Rotations++
	return nil
}

// retire puts a FREE window the pool no longer uses into the quarantine
// and closes the oldest one there if it is full. A tainted window is not
// retired so: its state is unknown, and the recovery rule is to
// deallocate it at once (Recover); its index's variants are carried
// over instead (see alloc).
func (p *Pool) retire(w transport.MW) {
	if len(p.quarantine) == p.cfg.WindowQuarantine {
		// Out of quarantine: its keys are WindowQuarantine rotations
		// old, so a window reborn at its index may use every variant
		// again, starting after its last.
		q := p.quarantine[0]
		p.remember(q.Key().Index(), q.Key(), 0)
		q.Close()
		p.quarantine = append(p.quarantine[:0], p.quarantine[1:]...)
	}
	p.quarantine = append(p.quarantine, w)
}

// maxWindowHistory bounds the per-index history; a device that hands out
// indices cyclically fills it, and forgetting then only shortens the
// horizon to the quarantine's.
const maxWindowHistory = 1 << 16

// remember records where a window's variants stopped (MW only).
func (p *Pool) remember(index uint32, key transport.Key, binds int) {
	if p.mech != MW {
		return
	}
	if len(p.windows) >= maxWindowHistory {
		clear(p.windows)
	}
	p.windows[index] = retired{index, key, binds}
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

// Admit checks that chain fits on the send queue (keeping one slot for a
// drain marker) and sets FlagSignaled where needed: on the SEND that follows
// a registration (its completion gates recycling,
// docs/registration.md#when-a-buffer-goes-back) and so that no run of
// unsignaled WRs reaches SignalEvery. Call it right before PostSend, then
// Posted.
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
	run := p.unsigRun
	afterReg := false
	for i := range chain {
		wr := &chain[i]
		k, _, _, own := decodeID(wr.ID)
		isReg := own && k == kindReg
		if !isReg && afterReg {
			wr.Flags |= transport.FlagSignaled
		}
		if isReg {
			afterReg = true
		} else {
			afterReg = false
		}
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

// Room is how many WRs Admit would take now: the send queue's depth less
// what is outstanding and the one slot kept for a drain marker. A caller
// that batches several chains into one PostSend checks it as it stages.
func (p *Pool) Room() int { return p.cfg.SQDepth - 1 - p.ln }

// Posted records the outcome of PostSend(chain): n WRs were accepted. WRs
// from chain[n] on were never posted and are never waited for; a
// registration or invalidation among them, or a registration whose SEND
// was not posted, taints its MR.
func (p *Pool) Posted(chain []transport.SendWR, n int) {
	var regStart = -1
	for i := range chain {
		wr := &chain[i]
		k, si, gen, own := decodeID(wr.ID)
		if own && (int(si) >= len(p.slots) || p.slots[si].gen != gen) {
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
		if own {
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
				if regStart < 0 {
					regStart = i
				}
				if s.state == RegPosted && s.waitIdx < 0 {
					s.waitIdx = int32(len(p.wait))
					p.wait = append(p.wait, si)
				}
			case kindInv:
				s.pending++
				s.since = p.tick
			}
		} else if regStart >= 0 {
			// The SEND carrying the keys of chain[regStart:i].
			for j := regStart; j < i; j++ {
				if k2, sj, g2, ok := decodeID(chain[j].ID); ok && k2 == kindReg && int(sj) < len(p.slots) && p.slots[sj].gen == g2 {
					p.slots[sj].sendSeq = e.seq
				}
			}
			regStart = -1
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
	// A posted registration whose SEND never went out: its key is VALID
	// on the device but nobody will ever invalidate it remotely.
	if regStart >= 0 {
		for j := regStart; j < n; j++ {
			if k, sj, g, ok := decodeID(chain[j].ID); ok && k == kindReg && int(sj) < len(p.slots) && p.slots[sj].gen == g {
				p.taint(sj)
			}
		}
	}
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

// OnQPError taints every MR not proven FREE. Get fails until the WRs still
// outstanding have been drained (their completions passed in) or Reset is
// called, and Recover has run.
func (p *Pool) OnQPError() {
	if !p.qpErr {
		p.st.QPErrors++
	}
	p.qpErr = true
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
	return p.Recover()
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
