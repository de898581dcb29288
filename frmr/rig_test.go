package frmr

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// The rig: an initiator (the pool's QP) and a scripted target on one
// software NIC, connected over the loop wire.

const (
	qd       = 8
	maxPages = 4
	iuSize   = 64
	// sqDepth is both QPs' MaxSendWR and the pool's SQDepth, so send-queue
	// accounting (send-queue overflow) is checked against the device's real
	// send-queue limit: a WR beyond it fails PostSend with ErrQueueFull,
	// which post reports.
	sqDepth = 32
	rqDepth = 2 * qd
	recvBit = 1 << 56
	sendBit = 2 << 56
	readBit = 3 << 56
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type side struct {
	pd    transport.PD
	cq    transport.CQ
	qp    transport.QP
	conn  transport.Conn
	arena *transport.Arena
	mr    transport.MR // LOCAL_WRITE|MW_BIND, never remote
}

type ioState uint8

const (
	ioIdle ioState = iota
	ioPosted
	ioWaitDone
)

type ioReq struct {
	state    ioState
	reg      Reg
	reqID    uint64
	dir      Direction
	off, n   int
	pattern  byte
	respOK   bool
	failed   bool
	strayHit bool
	sentinel byte
}

type rig struct {
	t       testing.TB
	seed    int64
	rng     *rand.Rand
	prov    *emu.Provider
	mech    Mechanism
	lis     transport.Listener
	ini     side
	tgt     side
	pool    *Pool
	ios     [qd]ioReq
	wcs     []transport.WC
	nextReq uint64
	sendID  uint64
	area    int

	// target-side script knobs (faults)
	bogusNext   bool // bogus remote invalidation
	fenceless   bool // invalidate behind a read: READ and SEND_WITH_INV in one chain
	deferSends  bool // receive before send completion
	deferred    []transport.WC
	postFail    bool // partial post injected
	retiredKeys [8]struct {
		key  transport.Key
		iova uint64
	}
	retiredN int

	// completions lost in a flush: nextCQ, if set, is the initiator CQ depth
	// of the next connection (deliberately below CQDepth); lossy >= 0 makes
	// the initiator's CQ rxe-like: of the flush completions only the next
	// lossy are delivered, the rest are lost (CQ full during a flush).
	nextCQ    int
	lossy     int
	lostCQEs  int
	overrunOK bool // completions lost in a flush, CQ overrun injected on this connection
	// failed registration: the REG/BIND expected to fail, and its request.
	regFailID     uint64 // the last one
	regFailSlot   int
	regFailGen    uint32
	regFailIDs    map[uint64]*regFailRec
	regFailReqs   map[uint64]bool
	regFailSeen   int
	regFailArm    int // 1 + variant of the next I/O's broken REG
	regFailInj    int
	regFailStatus transport.Status
	spareFR       transport.FastRegMR // on the target's PD
	spareMW       transport.MW
	injRegOnValid int
	// wrong-key invalidation: LOCAL_INVs posted with a wrong key.
	wrongInvNext bool
	wrongInvIDs  map[uint64]bool
	wrongInv     int
	bogusSent    int
	// posts before RTS: the initiator QP was reset to INIT and the rig keeps
	// posting without looking at its state; reconnect it (same QP) after the
	// first post if preRTSReconnect.
	preRTS, preRTSReconnect, preRTSPosted bool
	preRTSN                               int
	// stray with a wrapped key: (iova, request) a retired rkey was last
	// advertised with.
	keyHist       map[transport.Key]uint64
	wrappedStrays int
	ticks         int64

	broken bool
	// bogusConn: the target sent a wrong SEND_WITH_INV on this
	// connection; a LINV racing it may then legitimately hit a FREE MR
	// (MW_BIND_ERR caused by the peer, not by reuse).
	bogusConn bool
	done      int
	failedIO  int
	recovers  int
	strays    int
	bogus     int
	mwBind    int
	mwBindWhy string
}

func newRig(t testing.TB, profile string, mech Mechanism, seed int64, iovaTag bool) *rig {
	t.Helper()
	p, err := emu.New(emu.Config{Profile: profile, Seed: seed, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, seed: seed, rng: rand.New(rand.NewPCG(uint64(seed), 7)), prov: p, mech: mech, wcs: make([]transport.WC, 64),
		lossy: -1, keyHist: map[transport.Key]uint64{},
		regFailIDs: map[uint64]*regFailRec{}, regFailReqs: map[uint64]bool{}, wrongInvIDs: map[uint64]bool{}}
	r.area = maxPages * transport.PageSize
	d, _ := p.OpenDevice("")
	for _, s := range []*side{&r.ini, &r.tgt} {
		if s.pd, err = d.AllocPD(); err != nil {
			t.Fatal(err)
		}
		if s.arena, err = transport.NewArena(qd*r.area+2*rqDepth*iuSize+4096, transport.ArenaOptions{}); err != nil {
			t.Fatal(err)
		}
		if s.mr, err = s.pd.RegMR(s.arena, 0, s.arena.Len(), transport.AccessLocalWrite|transport.AccessMWBind); err != nil {
			t.Fatal(err)
		}
	}
	// Close the NIC (stopping every QP) before unmapping the arenas.
	t.Cleanup(func() {
		p.Close()
		r.ini.arena.Close()
		r.tgt.arena.Close()
	})
	// Fenced where the initiator fences: on a device whose retries
	// repeat local operations (rxe).
	q := d.Attr().Quirks
	r.pool, err = New(Config{PD: r.ini.pd, Caps: d.Attr().Caps, Mechanism: mech, Size: qd + 4, MaxPages: maxPages,
		BaseMR: r.ini.mr, SQDepth: sqDepth, SignalEvery: 8, IOVATag: iovaTag, DeadlineTicks: 300,
		FenceInvalidate: q.RetryRepeatsLocalOps, FenceRegistrations: q.RetryRepeatsLocalOps})
	if err != nil {
		t.Fatal(err)
	}
	if r.lis, err = p.Listen(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	r.connect()
	return r
}

func (r *rig) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("seed %d profile %s mech %s: %s", r.seed, r.prov.Profile().Name, r.pool.Mechanism(), fmt.Sprintf(format, args...))
}

func (r *rig) iuAddr(s *side, i int) uint64 { return s.arena.Addr() + uint64(qd*r.area+i*iuSize) }

func (r *rig) connect() { r.connectQP(false) }

// connectQP connects a new target QP to a new initiator QP, or to the
// existing one (reuseIni: in RESET or INIT, receives already posted).
func (r *rig) connectQP(reuseIni bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, _ := r.prov.OpenDevice("")
	var err error
	sides := []*side{&r.ini, &r.tgt}
	if reuseIni {
		sides = sides[1:]
	}
	for _, s := range sides {
		depth := CQDepth(sqDepth, rqDepth)
		if s == &r.ini && r.nextCQ > 0 {
			depth, r.nextCQ = r.nextCQ, 0
		}
		if s.cq, err = d.CreateCQ(depth); err != nil {
			r.fatalf("cq: %v", err)
		}
		if depth < CQDepth(sqDepth, rqDepth) {
			defer func() { r.overrunOK = true }() // completions lost in a flush: undersized on purpose
		}
		if s.qp, err = s.pd.CreateQP(transport.QPConfig{SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: sqDepth, MaxRecvWR: rqDepth, MaxSendSGE: 2, MaxRecvSGE: 1}); err != nil {
			r.fatalf("qp: %v", err)
		}
	}
	errc := make(chan error, 1)
	go func() {
		req, err := r.lis.Accept(ctx)
		if err == nil {
			r.tgt.conn, err = req.Accept(ctx, r.tgt.qp, nil)
		}
		errc <- err
	}()
	ep, err := r.prov.Resolve(ctx, r.lis.Addr())
	if err != nil {
		r.fatalf("resolve: %v", err)
	}
	if r.ini.conn, err = ep.Connect(ctx, r.ini.qp, nil); err != nil {
		r.fatalf("connect: %v", err)
	}
	if err := <-errc; err != nil {
		r.fatalf("accept: %v", err)
	}
	for _, s := range sides {
		for i := 0; i < rqDepth; i++ {
			r.postRecv(s, i)
		}
	}
	r.broken = false
	r.bogusConn = false
	r.preRTS, r.preRTSReconnect, r.preRTSPosted = false, false, false
	// The fence's first bind is the new QP's first WR (Pool.Prologue).
	if pro := r.pool.Prologue(nil); len(pro) > 0 && r.ini.qp.State() == transport.QPRTS {
		if n, err := r.post(pro); n != len(pro) {
			r.fatalf("post the prologue: %v", err)
		}
	}
	if !reuseIni {
		r.lossy = -1
		r.overrunOK = false
	}
}

// pollCQ polls one side's CQ. A dead CQ is a fault only if one was injected
// (completions lost in a flush, CQ overrun): otherwise the pool sized it
// wrong (CQ sizing). The initiator's CQ loses flush completions while lossy
// is armed (completions lost in a flush).
func (r *rig) pollCQ(s *side) (int, error) {
	n, err := s.cq.Poll(r.wcs)
	if err != nil {
		if errors.Is(err, transport.ErrCQOverrun) && !r.overrunOK {
			r.fatalf("CQ sizing: CQ of depth %d overran without injection", s.cq.Depth())
		}
		return 0, err
	}
	if s != &r.ini || r.lossy < 0 {
		return n, nil
	}
	k := 0
	for _, wc := range r.wcs[:n] {
		if wc.Status == transport.StatusWRFlushErr {
			if r.lossy == 0 {
				r.lostCQEs++
				continue
			}
			r.lossy--
		}
		r.wcs[k] = wc
		k++
	}
	return k, nil
}

func (r *rig) postRecv(s *side, i int) {
	wr := []transport.RecvWR{{ID: recvBit | uint64(i), SGL: []transport.SGE{{Addr: r.iuAddr(s, i), Length: iuSize, LKey: s.mr.LKey()}}}}
	if _, err := s.qp.PostRecv(wr); err != nil && s.qp.State() == transport.QPRTS {
		r.fatalf("post recv: %v", err)
	}
}

func (r *rig) bufOff(tag int) int { return tag * r.area }

// post sends chain through the pool's admission and accounting.
func (r *rig) post(chain []transport.SendWR) (int, error) {
	if err := r.pool.Admit(chain); err != nil {
		return 0, err
	}
	n, err := r.ini.qp.PostSend(chain)
	r.pool.Posted(chain, n)
	if r.preRTS && n > 0 {
		r.preRTSPosted = true // accepted by a QP in INIT: dropped (ib) or kept
	}
	if err != nil && !r.postFail && r.ini.qp.State() == transport.QPRTS {
		r.fatalf("post send failed without injection (send-queue accounting; send-queue overflow): %v", err)
	}
	if err != nil {
		r.postFail = false
		r.broken = true
	}
	return n, err
}

// start begins an I/O on tag if possible.
func (r *rig) start(tag int) {
	x := &r.ios[tag]
	ps := transport.PageSize
	off := r.rng.IntN(ps)
	n := 1 + r.rng.IntN(maxPages*ps-off)
	dir := Direction(r.rng.IntN(2))
	base := r.bufOff(tag)
	buf := r.ini.arena.Bytes()[base : base+r.area]
	// The application owned this memory since the last I/O: nothing may
	// have changed it (a stray that reached app memory, seed 002).
	for i, b := range buf {
		if b != x.sentinel {
			r.fatalf("app-owned memory of tag %d changed at +%d: %#x, want %#x (stray write reached application memory)", tag, i, b, x.sentinel)
		}
	}
	r.nextReq++
	reg, err := r.pool.Get(Segment{Arena: r.ini.arena, Off: base + off, Len: n}, dir)
	if errors.Is(err, ErrExhausted) {
		return
	}
	if errors.Is(err, ErrQPError) || errors.Is(err, ErrNoFence) {
		r.broken = true // the pool saw a QP error (or a lost completion), or its fence broke
		return
	}
	if err != nil {
		r.fatalf("get: %v", err)
	}
	pat := byte(r.rng.Uint32()) | 1
	if dir == PeerReads {
		for i := range buf[off : off+n] {
			buf[off+i] = pat + byte(i)
		}
	}
	*x = ioReq{state: ioPosted, reg: reg, reqID: r.nextReq, dir: dir, off: off, n: n, pattern: pat, sentinel: x.sentinel}
	iu := r.ini.arena.Bytes()[qd*r.area+(rqDepth+tag)*iuSize:]
	binary.LittleEndian.PutUint32(iu[0:], uint32(tag))
	iu[4] = byte(dir)
	iu[5] = pat
	binary.LittleEndian.PutUint64(iu[8:], r.nextReq)
	binary.LittleEndian.PutUint64(iu[16:], reg.IOVA())
	binary.LittleEndian.PutUint32(iu[24:], uint32(reg.RKey()))
	binary.LittleEndian.PutUint32(iu[28:], uint32(n))
	r.sendID++
	chain := append(r.pool.AppendFence(nil), reg.WR(), transport.SendWR{ID: sendBit | r.sendID, Opcode: transport.OpSend,
		SGL: []transport.SGE{{Addr: r.iuAddr(&r.ini, rqDepth+tag), Length: 32, LKey: r.ini.mr.LKey()}}})
	if r.regFailArm != 0 {
		chain = r.breakReg(chain, reg)
	}
	n2, err := r.post(chain)
	if errors.Is(err, ErrSQFull) {
		r.pool.Cancel(reg)
		x.state = ioIdle
		return
	}
	if n2 < len(chain) {
		x.failed = true
		x.state = ioWaitDone
	}
}

// onIniWC handles one initiator completion.
func (r *rig) onIniWC(wc transport.WC) {
	if wc.ID>>56 != 1 {
		r.onIniSendWC(&wc)
		return
	}
	if wc.Status != transport.StatusSuccess {
		r.broken = true
		return
	}
	slot := int(wc.ID & 0xffffff)
	iu := r.ini.arena.Bytes()[qd*r.area+slot*iuSize:]
	tag := int(binary.LittleEndian.Uint32(iu))
	reqID := binary.LittleEndian.Uint64(iu[8:])
	r.postRecv(&r.ini, slot)
	if tag >= qd || r.ios[tag].state != ioPosted || r.ios[tag].reqID != reqID {
		r.fatalf("response for unknown request tag %d req %d", tag, reqID)
	}
	x := &r.ios[tag]
	x.respOK = iu[6] == 0
	x.state = ioWaitDone
	if wc.Flags&transport.WCWithInv != 0 {
		if err := r.pool.OnRemoteInvalidate(x.reg, wc.InvalidatedKey); err != nil {
			r.bogus++
			x.failed = true
			r.broken = true // protocol error: reset the connection
		}
		return
	}
	inv, err := r.pool.Invalidate(x.reg)
	if err != nil {
		// Only an MR already tainted by a QP error in this same batch.
		if !r.broken {
			r.fatalf("invalidate: %v", err)
		}
		x.failed = true
		return
	}
	// Invalidate the device key (wrong-key invalidation): the response proves
	// the REG executed, so the device holds the key the LOCAL_INV must name.
	if info, ok := r.prov.MRInfo(inv.InvalidateKey.Index()); !ok || info.Key != inv.InvalidateKey {
		r.fatalf("invalidate the device key: LOCAL_INV names %s, device holds %+v (ok=%v)", inv.InvalidateKey, info, ok)
	}
	if r.wrongInvNext {
		// wrong-key invalidation: simulate a pool bug, a LOCAL_INV naming a
		// wrong key.
		r.wrongInvNext = false
		r.wrongInv++
		inv.InvalidateKey = inv.InvalidateKey.Bump()
		r.wrongInvIDs[inv.ID] = true
	}
	if n, _ := r.post([]transport.SendWR{inv}); n == 0 {
		x.failed = true
	}
}

// onTgtWC is the scripted target.
func (r *rig) onTgtWC(wc transport.WC) {
	if wc.ID == emu.StrayWRID {
		return
	}
	if wc.Status != transport.StatusSuccess {
		r.broken = true
		return
	}
	switch {
	case wc.ID>>56 == 1:
		slot := int(wc.ID & 0xffffff)
		iu := r.tgt.arena.Bytes()[qd*r.area+slot*iuSize:]
		tag := int(binary.LittleEndian.Uint32(iu))
		if req := binary.LittleEndian.Uint64(iu[8:]); r.regFailReqs[req] {
			r.fatalf("failed registration: the target received request %d, whose REG failed: the SEND behind a failed REG must be flushed", req)
		}
		dir := Direction(iu[4])
		pat := iu[5]
		iova := binary.LittleEndian.Uint64(iu[16:])
		rkey := transport.Key(binary.LittleEndian.Uint32(iu[24:]))
		n := int(binary.LittleEndian.Uint32(iu[28:]))
		// Keep the command for the response.
		resp := r.tgt.arena.Bytes()[qd*r.area+(rqDepth+tag)*iuSize:]
		copy(resp[:32], iu[:32])
		resp[6] = 0
		r.postRecv(&r.tgt, slot)
		data := r.tgt.arena.Bytes()[tag*r.area : tag*r.area+n]
		sge := []transport.SGE{{Addr: r.tgt.arena.Addr() + uint64(tag*r.area), Length: uint32(n), LKey: r.tgt.mr.LKey()}}
		if dir == PeerWrites {
			for i := range data {
				data[i] = pat + byte(i)
			}
			w := transport.SendWR{ID: sendBit | uint64(tag), Opcode: transport.OpRDMAWrite, SGL: sge, RemoteAddr: iova, RKey: rkey}
			r.respond(tag, rkey, w)
			return
		}
		rd := transport.SendWR{ID: readBit | uint64(tag), Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled, SGL: sge, RemoteAddr: iova, RKey: rkey}
		if r.fenceless {
			// invalidate behind a read: SEND_WITH_INV chained behind the READ
			// of the same MR.
			r.fenceless = false
			rd.ID = sendBit | 2<<20 | uint64(tag)
			r.respond(tag, rkey, rd)
			return
		}
		binary.LittleEndian.PutUint32(resp[32:], uint32(rkey))
		r.tgtPost([]transport.SendWR{rd})
	case wc.ID>>56 == 3:
		tag := int(wc.ID & 0xffffff)
		resp := r.tgt.arena.Bytes()[qd*r.area+(rqDepth+tag)*iuSize:]
		pat := resp[5]
		n := int(binary.LittleEndian.Uint32(resp[28:]))
		data := r.tgt.arena.Bytes()[tag*r.area : tag*r.area+n]
		for i, b := range data {
			if b != pat+byte(i) && !r.ios[tag].strayHit {
				r.fatalf("target read tag %d +%d: %#x want %#x", tag, i, b, pat+byte(i))
			}
		}
		r.respond(tag, transport.Key(binary.LittleEndian.Uint32(resp[32:])))
	}
}

// respond posts the target's response (after the given data WRs), as
// SEND_WITH_INV or plain SEND at random.
func (r *rig) respond(tag int, rkey transport.Key, before ...transport.SendWR) {
	resp := transport.SendWR{ID: sendBit | 1<<20 | uint64(tag), Opcode: transport.OpSend, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: r.iuAddr(&r.tgt, rqDepth+tag), Length: 32, LKey: r.tgt.mr.LKey()}}}
	if r.rng.IntN(2) == 0 {
		resp.Opcode = transport.OpSendWithInv
		resp.InvalidateKey = rkey
		if r.bogusNext {
			// bogus remote invalidation: name the wrong key (another
			// request's or a bumped one).
			r.bogusNext = false
			r.bogusConn = true
			r.bogusSent++
			resp.InvalidateKey = rkey.Bump()
			for i := range r.ios {
				if x := &r.ios[i]; x.state == ioPosted && x.reg.RKey() != rkey {
					resp.InvalidateKey = x.reg.RKey()
				}
			}
		}
	}
	r.tgtPost(append(before, resp))
}

// tgtPost posts on the target's QP, whose MaxSendWR is sqDepth too: a full
// send queue in RTS is a rig bug, not a fault.
func (r *rig) tgtPost(chain []transport.SendWR) {
	if _, err := r.tgt.qp.PostSend(chain); err != nil {
		if errors.Is(err, transport.ErrQueueFull) && r.tgt.qp.State() == transport.QPRTS {
			r.fatalf("target send queue full: %v", err)
		}
		r.broken = true
	}
}

// poll drains both CQs once; it reports whether anything happened.
func (r *rig) poll() bool {
	any := false
	for _, s := range []*side{&r.ini, &r.tgt} {
		if s == &r.tgt && r.preRTS {
			continue // destroyed with the old connection
		}
		n, err := r.pollCQ(s)
		if err != nil {
			r.broken = true
			continue
		}
		any = any || n > 0
		for _, wc := range r.wcs[:n] {
			if s == &r.tgt {
				r.onTgtWC(wc)
				continue
			}
			if r.deferSends && wc.ID>>56 != 1 || len(r.deferred) > 0 && wc.ID>>56 != 1 {
				r.deferred = append(r.deferred, wc) // receive before send completion: receive overtakes send completion
				continue
			}
			r.onIniWC(wc)
		}
	}
	if !r.deferSends && len(r.deferred) > 0 {
		d := r.deferred
		r.deferred = nil
		for _, wc := range d {
			r.onIniWC(wc)
		}
		any = true
	}
	return any
}

// recoverIOs runs the pool's Recover, fails every I/O still posted and
// retires them all; every tag must then be idle. when says at what point
// of the test, for the failure message.
func (r *rig) recoverIOs(when string) {
	if err := r.pool.Recover(); err != nil {
		r.fatalf("recover %s: %v", when, err)
	}
	for i := range r.ios {
		if r.ios[i].state == ioPosted {
			r.ios[i].failed = true
			r.ios[i].state = ioWaitDone
		}
	}
	r.retire()
	for i := range r.ios {
		if r.ios[i].state != ioIdle {
			r.fatalf("tag %d not returned %s (state %d)", i, when, r.ios[i].state)
		}
	}
}

// retire hands buffers back when the pool says so, checking buffer return.
func (r *rig) retire() {
	for tag := range r.ios {
		x := &r.ios[tag]
		if x.state == ioIdle || !r.pool.Done(x.reg) {
			continue
		}
		// buffer return: no rkey reaching the buffer is VALID on the device.
		k := x.reg.RKey()
		if info, ok := r.prov.MRInfo(k.Index()); ok && info.State == "VALID" && info.Key == k {
			r.fatalf("buffer return: tag %d returned while rkey %s is VALID on the device", tag, k)
		}
		base := r.bufOff(tag)
		buf := r.ini.arena.Bytes()[base : base+r.area]
		if x.state == ioWaitDone && x.respOK && !x.failed && !x.strayHit && x.dir == PeerWrites {
			for i := range x.n {
				if buf[x.off+i] != x.pattern+byte(i) {
					r.fatalf("tag %d data-in +%d: %#x want %#x", tag, i, buf[x.off+i], x.pattern+byte(i))
				}
			}
		}
		if x.state == ioWaitDone && !x.failed {
			r.done++
		} else {
			r.failedIO++
		}
		r.keyHist[k] = x.reg.IOVA()
		rk := &r.retiredKeys[r.retiredN%len(r.retiredKeys)]
		rk.key, rk.iova = k, x.reg.IOVA()
		r.retiredN++
		// The application reuses its memory: fill it with a new sentinel.
		x.sentinel++
		for i := range buf {
			buf[i] = x.sentinel
		}
		x.state = ioIdle
	}
}

// busySlots is the pool's slots that are not FREE, by slot number.
func (r *rig) busySlots() map[int]SlotInfo {
	busy := map[int]SlotInfo{}
	r.pool.Slots(func(s SlotInfo) {
		if s.State != Free {
			busy[s.Slot] = s
		}
	})
	return busy
}

// check verifies the invariants after a step.
func (r *rig) check() {
	if err := r.pool.Check(); err != nil {
		r.fatalf("%v", err)
	}
	st := r.pool.Stats()
	if st.Free+st.InUse+st.Tainted+st.Retiring != st.Size {
		r.fatalf("conservation: %+v", st)
	}
	free := map[uint32]bool{}
	r.pool.Slots(func(s SlotInfo) {
		if s.State != Free {
			return
		}
		free[s.Index] = true
		// one live generation: a FREE slot's MR is FREE on the device, not
		// poisoned.
		info, ok := r.prov.MRInfo(s.Index)
		if !ok || info.State != "FREE" || info.Poisoned {
			r.fatalf("one live generation: FREE slot %d index %#x device %+v ok=%v", s.Slot, s.Index, info, ok)
		}
	})
	// free-list gating: no outstanding WR names a FREE MR.
	for _, o := range r.prov.Outstanding() {
		if o.QPNum != r.ini.qp.Num() || (o.Opcode != transport.OpRegMR && o.Opcode != transport.OpBindMW && o.Opcode != transport.OpLocalInv) {
			continue
		}
		for _, idx := range o.Objects {
			if free[idx] {
				r.fatalf("free-list gating: FREE MR index %#x named by outstanding %s %#x", idx, o.Opcode, o.ID)
			}
		}
	}
	// unique live keys: unretired rkeys are distinct.
	for i := range r.ios {
		for j := i + 1; j < len(r.ios); j++ {
			if r.ios[i].state != ioIdle && r.ios[j].state != ioIdle && r.ios[i].reg.RKey() == r.ios[j].reg.RKey() {
				r.fatalf("unique live keys: tags %d and %d share rkey %s", i, j, r.ios[i].reg.RKey())
			}
		}
	}
	c := r.prov.Counters()
	if c.RegOnValid > uint64(r.injRegOnValid) {
		r.fatalf("one live generation: %d REG/BIND on a VALID object, %d injected (failed registration)", c.RegOnValid, r.injRegOnValid)
	}
	// Invalidate the device key (wrong-key invalidation): every key mismatch
	// is one the rig injected (a wrong LOCAL_INV, or the SEND_WITH_INV of a
	// bogus remote invalidation).
	if c.InvKeyMismatch > uint64(r.wrongInv+r.bogusSent) {
		r.fatalf("invalidate the device key (wrong-key invalidation): %d invalidations named a key the device does not hold, %d injected", c.InvKeyMismatch, r.wrongInv+r.bogusSent)
	}
	if r.mwBind != 0 {
		r.fatalf("taint on error (poisoned after a flush): %d MW_BIND_ERR completions reached the initiator, last %s", r.mwBind, r.mwBindWhy)
	}
}

// recover tears the connection down and builds a new one (taint on error,
// connection loss, partial posts, bounded waits, drained teardown).
func (r *rig) recover() {
	r.recovers++
	r.pool.OnQPError()
	r.deferSends = false
	for _, wc := range r.deferred {
		r.onIniWC(wc)
	}
	r.deferred = nil
	r.ini.qp.Modify(transport.QPErr)
	r.tgt.qp.Modify(transport.QPErr)
	m := []transport.SendWR{r.pool.DrainMarker()}
	if r.pool.Admit(m) == nil {
		n, _ := r.ini.qp.PostSend(m)
		r.pool.Posted(m, n)
	}
	// The drain is bounded by the pool's deadline (bounded waits), so lost
	// flush completions (completions lost in a flush) cannot hang it; the
	// wall clock is a backstop only.
	deadline := time.Now().Add(5 * time.Second)
	for !r.pool.Drained() && time.Now().Before(deadline) {
		n, err := r.pollCQ(&r.ini)
		if err != nil {
			break
		}
		for _, wc := range r.wcs[:n] {
			if wc.ID>>56 != 1 {
				r.onIniSendWC(&wc)
			}
		}
		if n == 0 {
			if err := r.pool.Tick(); errors.Is(err, ErrDeadline) {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	for _, s := range []*side{&r.ini, &r.tgt} {
		s.qp.Close()
		s.cq.Close()
	}
	if !r.pool.Drained() {
		r.pool.Reset() // bounded waits, drained teardown: completions lost with the destroyed QP
	}
	r.recoverIOs("after recovery")
	r.check()
	r.clearInjected()
	r.connect()
}

// stray issues an RDMA WRITE from the target with (key, va) and returns
// its status.
func (r *rig) stray(key transport.Key, va uint64, n int) transport.Status {
	r.strays++
	data := make([]byte, n)
	for i := range data {
		data[i] = 0xEE
	}
	st, err := r.prov.InjectStray(r.tgt.qp, transport.OpRDMAWrite, key, va, data)
	if err != nil {
		r.broken = true
		return transport.StatusGeneralErr
	}
	if st != transport.StatusSuccess {
		r.broken = true
	}
	return st
}

// idle waits up to a millisecond for a completion and ticks the pool.
func (r *rig) idle() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	r.ini.cq.Wait(ctx)
	cancel()
	r.ticks++
	if err := r.pool.Tick(); err != nil {
		r.broken = true // bounded waits: deadline (or a lost completion) → teardown
	}
}

// step runs one iteration: start I/Os, poll, retire, tick, check.
func (r *rig) step() {
	for tag := range r.ios {
		if r.ios[tag].state == ioIdle && !r.broken && r.rng.IntN(3) == 0 {
			r.start(tag)
		}
	}
	if !r.poll() {
		r.idle()
	}
	if r.pool.Err() != nil {
		r.broken = true // a QP error or a lost completion seen by the pool
	}
	r.retire()
	if r.preRTS {
		// posts before RTS: the rig does not look at the QP state; only the
		// pool's deadline or lost-completion check can end this.
		if r.preRTSReconnect && r.preRTSPosted && !r.broken {
			if r.ini.qp.State() != transport.QPInit {
				r.broken = true
			} else {
				r.connectQP(true)
			}
		}
	} else {
		if st := r.ini.qp.State(); st != transport.QPRTS {
			r.broken = true
		}
		if r.tgt.qp.State() != transport.QPRTS {
			r.broken = true
		}
	}
	r.check()
	if r.broken {
		r.recover()
	}
}
