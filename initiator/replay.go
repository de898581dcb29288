package initiator

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// This file is the write verifier: what the session does when a login
// finds another target instance than the one before (see the package
// doc, "Target restarts").

// durability is a volume's account of the writes the target may still
// lose; Session.dmu guards it.
type durability struct {
	// acked numbers the writes acknowledged that only a flush makes
	// durable (and FUA writes the replay ring holds); flushed is the
	// highest number a successful flush covered. acked > flushed: dirty.
	acked, flushed uint64
	// unrepl is the highest number of a write the ring could not keep (it
	// was abandoned while the ring was full): replay cannot restore it.
	unrepl uint64
	// lossGen counts losses; flushSeen and fuaSeen are the loss last
	// reported to a Flush and to a FUA write (Linux's errseq).
	lossGen, flushSeen, fuaSeen uint64
	live                        int   // entries in the replay ring
	parked                      queue // acknowledged, waiting for room in the ring
	ovf                         Request
	ovfBusy                     bool // ovf is queued or in flight
	// gone: a write acknowledged since the open or the last loss is no
	// longer replayable (a flush released it from the ring, or the ring
	// never held it), which a restart loses on a CapVolatile volume.
	gone bool
	// lossCause is the target's own report of the last loss
	// (reportedLoss), which lostErr wraps; nil for a loss the session
	// found itself.
	lossCause error
}

// VolumeStats are a volume's durability counters.
type VolumeStats struct {
	// Dirty: writes were acknowledged since the last successful flush.
	Dirty bool
	// WriteCacheLost counts the losses of acknowledged, unflushed writes
	// this volume suffered (target restarts with no way to replay them);
	// each is reported as ErrWriteCacheLost.
	WriteCacheLost uint64
	// Replayable is how many of its writes the replay buffer holds.
	Replayable int
}

// Stats returns the volume's durability counters.
func (v *Volume) Stats() VolumeStats {
	s := v.s
	s.dmu.Lock()
	defer s.dmu.Unlock()
	d := &v.dur
	return VolumeStats{Dirty: d.acked > d.flushed, WriteCacheLost: d.lossGen, Replayable: d.live}
}

// verifier is the session's side of the write verifier.
type verifier struct {
	dmu      sync.Mutex
	instSet  bool   // a login has told us the target's instance
	instance uint64 // the instance of the last login (0: an older target)
	instGen  uint64 // instance changes so far; channels stamp their connection with it
	ring     *replayRing
	ringMem  *transport.Arena
	scratch  []byte // a write whose copy wraps around the ring end, made whole to replay
	round    *replayRound
	// held stops every channel from dispatching anything but replay
	// writes while a round runs, so nothing the application queued, and
	// nothing re-issued from the lost connection, overtakes them; OPENs
	// and pings, which change no data, pass (popNext).
	held atomic.Bool
}

// replayRound re-issues the ring's entries, one at a time and in order,
// through one channel.
type replayRound struct {
	c    *channel
	req  *Request
	next uint64 // ring index of the entry replaying or to replay
	end  uint64
	// parked are copies of the writes that waited for room in the full
	// ring at the instance change, replayed after its entries, each
	// volume's in the order they were acknowledged (writes to two
	// volumes never meet); xi indexes the one replaying.
	parked []parkedCopy
	xi     int
}

// parkedCopy is a write waiting for room in the ring, taken for replay.
// Its writer still waits and its buffer is still the request's, but a
// failed flush hands the request back before the round ends
// (overflowDone): the copy keeps the data.
type parkedCopy struct {
	vol    *Volume
	op     Op
	off    int64
	length int64
	data   []byte
	seq    uint64
}

func (s *Session) initReplay() error {
	n := s.cfg.ReplayBuffer
	if n <= 0 {
		return nil
	}
	mem, err := transport.NewArena(n, transport.ArenaOptions{})
	if err != nil {
		return fmt.Errorf("initiator: replay buffer of %d bytes: %w", n, err)
	}
	s.ringMem = mem
	s.ring = newReplayRing(mem.Bytes()[:n], n/minEntry+16)
	s.scratch = make([]byte, s.cfg.MaxTransfer)
	return nil
}

// minEntry sizes the ring's entry table: writes smaller than this on
// average fill the table before the bytes, which only brings the next
// flush forward.
const minEntry = 4096

func (s *Session) lostErr(v *Volume) error {
	if c := v.dur.lossCause; c != nil {
		return fmt.Errorf("initiator: volume %q on %s: the target reported it lost writes it had acknowledged, on a flush the session made for room: %w", v.name, s.cfg.Addr, c)
	}
	if v.caps&wire.CapVolatile != 0 {
		return fmt.Errorf("initiator: volume %q on %s: the target restarted, and it kept the volume in memory: %w", v.name, s.cfg.Addr, ErrVolumeLost)
	}
	return fmt.Errorf("initiator: volume %q on %s: the target restarted and lost writes it had acknowledged since the last flush: %w", v.name, s.cfg.Addr, ErrWriteCacheLost)
}

// noteInstance is every login's check of the target's instance. The first
// login learns it; a later one that finds another means writes the target
// acknowledged and did not flush may be gone: volumes whose every such
// write the ring holds get a replay round, the others a loss.
func (s *Session) noteInstance(c *channel, inst uint64) {
	vols := s.openVolumes()
	var rel queue
	s.dmu.Lock()
	if !s.instSet || inst == s.instance {
		s.instSet, s.instance = true, inst
		c.instGen = s.instGen
		s.dmu.Unlock()
		return
	}
	old := s.instance
	s.instance = inst
	s.instGen++
	c.instGen = s.instGen
	s.stats.instanceChanges.Add(1)
	for _, v := range vols {
		d := &v.dur
		if v.caps&wire.CapVolatile != 0 && d.gone {
			// The target kept the volume in memory: the restart lost
			// all of it, what was flushed too, which replaying the
			// unflushed writes would hide. If the ring holds every
			// write of the session, the replay brings them all back.
			s.lossLocked(v, &rel)
			d.gone = false
			continue
		}
		if d.acked <= d.flushed && d.parked.n == 0 {
			continue
		}
		if s.ring == nil || d.unrepl > d.flushed {
			s.lossLocked(v, &rel)
		}
	}
	next := s.startRoundLocked(c, parkedCopiesLocked(vols))
	s.dmu.Unlock()
	c.log.Warn("target restarted: its instance changed", "old", fmt.Sprintf("%#x", old), "new", fmt.Sprintf("%#x", inst), "replaying", next != nil)
	deliverAll(&rel)
	s.runReplay(c, next)
}

// reportedLoss records the loss a target reported itself, failing flush
// r with err (ErrWriteCacheLost): T10 SRP's SYNCHRONIZE CACHE answered
// WRITE ERROR, which srpd sends once per I_T nexus after a restart,
// to whichever flush comes first. That may be the session's own flush
// for room in the replay ring, which nobody sees fail: then an import
// outgrowing the ring went on, its last Flush succeeded, and srpc said
// "flushed" and exited 0 over the lost writes. Now the volume's next
// Flush and FUA write report it, unless r is a Flush of the caller's,
// which has just reported it.
func (s *Session) reportedLoss(r *Request, err error) {
	v := r.vol
	d := &v.dur
	var rel queue
	s.dmu.Lock()
	s.lossLocked(v, &rel)
	d.lossCause = err
	if !r.self {
		d.flushSeen = d.lossGen
	}
	s.dmu.Unlock()
	deliverAll(&rel)
}

// lossLocked records that v's unflushed writes are lost: they are
// accounted for (no flush will ever cover them) and the next Flush and
// FUA write report it. Writes parked for room in the ring move to rel.
func (s *Session) lossLocked(v *Volume, rel *queue) {
	s.dropWritesLocked(v, rel)
	s.cfg.Logger.Error("initiator: acknowledged writes lost by the target; the next flush fails", "volume", v.name, "target", s.cfg.Addr)
}

// dropWritesLocked is lossLocked without its log (volumeReplaced's).
func (s *Session) dropWritesLocked(v *Volume, rel *queue) {
	d := &v.dur
	d.lossGen++
	d.lossCause, d.flushed, d.unrepl = nil, d.acked, 0
	if s.ring != nil {
		d.live -= s.ring.drop(v)
	}
	s.stats.writeCacheLost.Add(1)
	for r := d.parked.pop(); r != nil; r = d.parked.pop() {
		rel.push(r)
	}
}

func deliverAll(q *queue) {
	for r := q.pop(); r != nil; r = q.pop() {
		r.deliver(r.Err)
	}
}

// afterIO is channel.complete's hook for every block request before it is
// delivered: it keeps the durability account and may replace err (with
// ErrWriteCacheLost) or take the request over (parked reports true: it
// waits for room in the ring and is delivered later).
func (s *Session) afterIO(c *channel, r *Request, bounce int, err error) (error, bool) {
	if err != nil && r.Op == OpFlush && !r.replay && r.scsi == nil && errors.Is(err, ErrWriteCacheLost) {
		s.reportedLoss(r, err)
		return err, false
	}
	if err != nil || r.replay || r.scsi != nil {
		// A SCSI command the session sends itself writes no blocks
		// (SET TARGET PORT GROUPS's data-out is a parameter list).
		return err, false
	}
	switch r.Op {
	case OpFlush:
		return s.flushDone(c, r), false
	case OpWrite, OpDiscard, OpWriteZeroes:
		return s.writeDone(c, r, bounce)
	}
	return nil, false
}

func (s *Session) writeDone(c *channel, r *Request, bounce int) (error, bool) {
	v := r.vol
	d := &v.dur
	var err error
	s.dmu.Lock()
	stale := c.instGen != s.instGen
	if s.ring == nil {
		d.gone = true
	}
	if r.FUA {
		if d.lossGen != d.fuaSeen {
			d.fuaSeen = d.lossGen
			err = s.lostErr(v)
		}
		// Durable as it is, but a replay of older writes under it would
		// undo it: the ring keeps it when it holds any of the volume's.
		if s.ring == nil || d.live == 0 || stale {
			d.gone = true
			s.dmu.Unlock()
			return err, false
		}
	}
	d.acked++
	seq := d.acked
	if stale {
		// Acknowledged by an instance another channel has already seen
		// replaced: whether it survived is unknown.
		var rel queue
		s.lossLocked(v, &rel)
		s.dmu.Unlock()
		deliverAll(&rel)
		return err, false
	}
	// Behind a parked write of the volume it parks too, though another
	// volume's flush made room: a replay puts the ring's entries back
	// before the parked ones, so each volume's must be older.
	if s.ring == nil || d.parked.n == 0 && s.ring.push(v, r, s.writeData(r, bounce), seq) {
		if s.ring != nil {
			d.live++
		}
		s.dmu.Unlock()
		return err, false
	}
	// The ring is full: the writer waits while the session flushes (NFS's
	// COMMIT under too many unstable writes); nothing is dropped.
	parked := r.claim()
	if parked {
		r.seq, r.Err = seq, err
		d.parked.push(r)
	} else {
		d.unrepl = seq // abandoned: nobody waits, and its buffer is not ours
	}
	kick := s.kickLocked(v)
	s.dmu.Unlock()
	s.overflowFlush(kick)
	return err, parked
}

// writeData is the data a write sent: the bounce buffer if it went
// through one (the caller may have abandoned its own), else its buffer.
func (s *Session) writeData(r *Request, bounce int) []byte {
	if r.Op != OpWrite {
		return nil
	}
	if _, zc := s.segmentFor(r.Buf); zc {
		return r.Buf
	}
	return s.data.Bytes()[bounce : bounce+len(r.Buf)]
}

// flushDone settles a flush the target answered Good.
func (s *Session) flushDone(c *channel, r *Request) error {
	v := r.vol
	d := &v.dur
	var err error
	var rel queue
	s.dmu.Lock()
	// A flush answered by a replaced instance made its writes durable
	// there, but what that store kept is not ours to vouch for.
	if c.instGen == s.instGen {
		d.gone = d.gone || r.seq > 0
		d.flushed = max(d.flushed, r.seq)
		if s.ring != nil {
			d.live -= s.ring.trim(v, r.seq)
			s.releaseLocked(v, r.seq, &rel)
		}
	}
	// The first flush answered after a loss reports it (errseq), and so
	// does every flush issued before a flush had reported it: what it
	// covers may be among the lost, so it must not succeed, however many
	// were in flight.
	if !r.self && (d.lossGen != d.flushSeen || r.lossGen != noLoss && r.lossGen != d.lossGen) {
		d.flushSeen = d.lossGen
		err = s.lostErr(v)
	}
	s.dmu.Unlock()
	deliverAll(&rel)
	return err
}

// releaseLocked moves the parked writes a flush covered (acknowledged
// before it was issued), or that now fit in the ring, to rel.
func (s *Session) releaseLocked(v *Volume, upTo uint64, rel *queue) {
	d := &v.dur
	full := false
	for n := d.parked.n; n > 0; n-- {
		r := d.parked.pop()
		switch {
		case r.seq <= upTo:
		case !full && s.ring.push(v, r, r.Buf, r.seq):
			d.live++
		default:
			// In order: once one does not fit, a smaller one behind
			// it (a DISCARD's entry holds no data) must not go first.
			full = true
			d.parked.push(r)
			continue
		}
		rel.push(r)
	}
}

// kickLocked picks the volumes to flush for room in the ring: v, and the
// volume whose entry holds the ring's oldest bytes.
func (s *Session) kickLocked(v *Volume) [2]*Volume {
	var k [2]*Volume
	if !v.dur.ovfBusy {
		v.dur.ovfBusy = true
		k[0] = v
	}
	if h := s.ring.oldest(); h != nil && !h.dur.ovfBusy {
		h.dur.ovfBusy = true
		k[1] = h
	}
	return k
}

// overflowFlush issues the session's own flush of each volume given.
func (s *Session) overflowFlush(vs [2]*Volume) {
	for _, v := range vs {
		if v == nil {
			continue
		}
		f := &v.dur.ovf
		s.dmu.Lock()
		f.seq = v.dur.acked
		s.dmu.Unlock()
		f.Op, f.vol, f.self, f.Buf, f.Offset, f.Length, f.FUA, f.Err = OpFlush, v, true, nil, 0, 0, false, nil
		f.state.Store(reqPending)
		s.stats.replayFlushes.Add(1)
		if err := s.pick().submit(f); err != nil {
			f.state.Store(reqClaimed)
			f.Err = err
			s.overflowDone(f)
		}
	}
}

// overflowDone is the session's flush coming back. Success has released
// what it covered (flushDone); on failure the parked writes go back to
// their writers as the successes they were, without a copy: a restart
// before the next flush is then a loss.
func (s *Session) overflowDone(f *Request) {
	v := f.vol
	d := &v.dur
	var rel queue
	var kick [2]*Volume
	s.dmu.Lock()
	d.ovfBusy = false
	if f.Err != nil {
		for r := d.parked.pop(); r != nil; r = d.parked.pop() {
			d.unrepl = max(d.unrepl, r.seq)
			rel.push(r)
		}
	} else if d.parked.n > 0 {
		kick = s.kickLocked(v)
	}
	s.dmu.Unlock()
	if f.Err != nil {
		s.cfg.Logger.Warn("initiator: flush for room in the replay buffer failed", "volume", v.name, "err", f.Err)
	}
	deliverAll(&rel)
	s.overflowFlush(kick)
}

// noLoss stamps a flush that covers no unflushed write and no loss
// unreported: no loss can touch it.
const noLoss = ^uint64(0)

// markFlush stamps a flush with the writes it covers: those acknowledged
// before it was issued, and with the losses a flush had reported by then.
func (v *Volume) markFlush(r *Request) {
	r.replay, r.self = false, false
	if r.Op != OpFlush {
		return
	}
	v.s.dmu.Lock()
	d := &v.dur
	r.seq = d.acked
	r.lossGen = d.flushSeen
	if d.acked <= d.flushed && d.flushSeen == d.lossGen {
		r.lossGen = noLoss
	}
	v.s.dmu.Unlock()
}

// forget drops a closing volume's copies: nobody can flush it any more.
func (v *Volume) forget() {
	s := v.s
	s.dmu.Lock()
	if s.ring != nil {
		v.dur.live -= s.ring.drop(v)
	}
	s.dmu.Unlock()
}

// startRoundLocked begins replaying the ring through c, abandoning a
// round a previous instance change left unfinished (its entries are
// replayed again, from the start, in order). It returns the first replay
// write, or nil if there is nothing to replay.
func (s *Session) startRoundLocked(c *channel, parked []parkedCopy) *Request {
	if s.round != nil {
		s.round.req.abandon()
		s.round = nil
	}
	if s.ring == nil || s.ring.liveN() == 0 && len(parked) == 0 {
		s.held.Store(false)
		return nil
	}
	rd := &replayRound{c: c, req: &Request{replay: true}, next: s.ring.eh, end: s.ring.et, parked: parked}
	rd.req.OnDone = s.replayDone
	s.round = rd
	s.held.Store(true)
	return s.nextReplayLocked()
}

// nextReplayLocked readies the round's request for its next live entry;
// nil ends the round.
func (s *Session) nextReplayLocked() *Request {
	rd := s.round
	for rd.next = max(rd.next, s.ring.eh); rd.next < rd.end; rd.next++ {
		e := s.ring.at(rd.next)
		if e.dead {
			continue
		}
		r := rd.req
		r.Op, r.vol, r.Offset, r.FUA, r.Err, r.Buf, r.Length = e.op, e.vol, e.off, false, nil, nil, 0
		if e.op == OpWrite {
			r.Buf = s.ring.data(e, s.scratch)
		} else {
			r.Length = e.n
		}
		r.state.Store(reqPending)
		return r
	}
	for ; rd.xi < len(rd.parked); rd.xi++ {
		p := &rd.parked[rd.xi]
		if p.seq <= p.vol.dur.flushed {
			continue // covered since: durable, or counted lost
		}
		r := rd.req
		r.Op, r.vol, r.Offset, r.FUA, r.Err, r.Buf, r.Length = p.op, p.vol, p.off, false, nil, p.data, p.length
		r.state.Store(reqPending)
		return r
	}
	s.round = nil
	return nil
}

// parkedCopiesLocked copies, for replay, the writes of vols that wait
// for room in the full ring: acknowledged by the instance that is gone,
// and in no entry of the ring. Counting them lost turned a restart under
// an import larger than the ring into a failed flush about one time in
// two, although the writes were still at hand.
func parkedCopiesLocked(vols []*Volume) []parkedCopy {
	var out []parkedCopy
	for _, v := range vols {
		for r := v.dur.parked.head; r != nil; r = r.next {
			p := parkedCopy{vol: v, op: r.Op, off: r.Offset, length: r.Length, seq: r.seq}
			if r.Op == OpWrite {
				p.data = bytes.Clone(r.Buf)
			}
			out = append(out, p)
		}
	}
	return out
}

// replayDone is a replay write coming back.
func (s *Session) replayDone(r *Request) {
	s.dmu.Lock()
	rd := s.round
	if rd == nil || rd.req != r {
		s.dmu.Unlock()
		return // a round given up for a newer one
	}
	next, rel := s.replayResultLocked(r.Err)
	c := rd.c
	s.dmu.Unlock()
	deliverAll(&rel)
	s.runReplay(c, next)
}

// replayResultLocked records how the round's current entry went and
// readies the next.
func (s *Session) replayResultLocked(err error) (*Request, queue) {
	var rel queue
	rd := s.round
	v := rd.req.vol
	switch {
	case err != nil && v.replaced.Load():
		// volumeReplaced dropped its copies and said so.
	case err != nil:
		// Replay is how we keep the promise; without it, the loss is
		// reported as if there had been no ring.
		s.cfg.Logger.Warn("initiator: replay write failed", "volume", v.name, "err", err)
		s.lossLocked(v, &rel)
	default:
		s.stats.replayed.Add(1)
	}
	if rd.next < rd.end {
		rd.next++
	} else {
		rd.xi++
	}
	return s.nextReplayLocked(), rel
}

// runReplay queues replay writes on c until one is queued or the round is
// over; at its end every channel is let go.
func (s *Session) runReplay(c *channel, r *Request) {
	for r != nil {
		err := c.pushFront(r)
		if err == nil {
			return
		}
		var rel queue
		s.dmu.Lock()
		if s.round == nil || s.round.req != r {
			s.dmu.Unlock()
			return
		}
		r, rel = s.replayResultLocked(err)
		s.dmu.Unlock()
		deliverAll(&rel)
	}
	s.dmu.Lock()
	over := s.round == nil
	if over {
		s.held.Store(false)
	}
	s.dmu.Unlock()
	if over {
		for _, ch := range s.chans {
			ch.ring()
		}
	}
}

// pushFront queues r ahead of everything on the channel (replay writes).
func (c *channel) pushFront(r *Request) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return fmt.Errorf("initiator: channel %d: %w", c.id, ErrClosed)
	}
	r.start = clock.Nanos()
	c.q.pushFront(r)
	c.mu.Unlock()
	c.ring()
	return nil
}

// popNext is dispatch's pop (c.mu held): while a replay round runs only
// replay writes leave the queue, and the requests that change no data
// and that the round may wait on: a late volume's re-open (late_open.go:
// the round's next write may be that volume's) and the keepalive's
// ping.
func (c *channel) popNext() *Request {
	if !c.s.held.Load() || (c.q.head != nil && c.q.head.replay) {
		return c.q.pop()
	}
	return c.q.popFirst(passesHold)
}

// passesHold reports whether r may leave the queue while a replay round
// runs, ahead of the requests it holds back.
func passesHold(r *Request) bool {
	return r.replay || r.Op == opControl && r.vol == nil &&
		(r.ctrl.Op == wire.ControlOpen || r.ctrl.Op == wire.ControlPing)
}
