package initiator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// wr_id tags of the channel's own work requests; the pool uses 0xF7.
const (
	idRecv = 0xE1
	idSend = 0xE2
)

func sendID(slot int, gen uint32) uint64 { return idSend<<56 | uint64(gen)<<24 | uint64(slot) }
func recvID(i int) uint64                { return idRecv<<56 | uint64(i) }

type slotState uint8

const (
	slotFree      slotState = iota
	slotStaged              // chain built, not yet accepted by PostSend
	slotSent                // command posted, response outstanding
	slotResponded           // response in; waiting for the key to be proven dead
)

func (s slotState) String() string {
	switch s {
	case slotFree:
		return "FREE"
	case slotStaged:
		return "STAGED"
	case slotSent:
		return "SENT"
	case slotResponded:
		return "RESPONDED"
	}
	return fmt.Sprintf("slotState(%d)", uint8(s))
}

// ioSlot is one credit: a send buffer, a bounce buffer and the request
// using them.
type ioSlot struct {
	state   slotState
	gen     uint32
	req     *Request
	reg     frmr.Reg
	hasReg  bool
	rsp     wire.Response
	bounce  int          // offset of the bounce buffer in the session arena
	base    transport.MR // MR over the bounce buffer alone (isolate), windows bind over it
	sendOff int          // offset of the send buffer in the channel arena
	started int64        // when its command was staged (the shell's clock)
	seq     uint64       // the core's count of commands staged, at this one
	sge     [2]transport.SGE
}

// coreParams are what a channel's core works with: the buffers the shell
// allocated and registered, and the session's limits.
type coreParams struct {
	id        int
	credits   int // slots (Config.Credits)
	sqDepth   int
	ioTimeout int64  // ns
	msg       []byte // the channel arena: receive buffers, then send buffers
	msgAddr   uint64
	msgLKey   transport.Key
	data      []byte // the session arena (bounce buffers, then AllocBuffer's)
	dataAddr  uint64
	dataLKey  transport.Key
	dataArena *transport.Arena
	// zeroCopy reports whether a buffer lies in the session's registered
	// pool (and may be registered in place), and where.
	zeroCopy func([]byte) (frmr.Segment, bool)
	recvWRs  []transport.RecvWR
	pool     *frmr.Pool
}

// doneIO is a request the core has finished with: its slot is free again,
// and the shell delivers it (copying a read out of bounce first, if the
// request went through bounce). bounce is -1 for a request that never got
// a slot.
type doneIO struct {
	req    *Request
	err    error
	bounce int
	rsp    bool // the target answered (stats count it as an I/O)
	// size, if not 0, is the volume's new size from a capacity notice
	// in the response (wire.RespCapacityChanged).
	size int64
}

// coreActions are what the events since the last take asked the shell to
// do, in this order: post the receives, post send (one PostSend, whose
// outcome goes back through posted), deliver done, put requeue back at the
// front of the queue in order, then, if fail is set, tear the connection
// down.
type coreActions struct {
	recv    []transport.RecvWR
	send    []transport.SendWR
	done    []doneIO
	requeue []*Request
	fail    error
}

func (a *coreActions) empty() bool {
	return len(a.recv) == 0 && len(a.send) == 0 && len(a.done) == 0 && len(a.requeue) == 0 && a.fail == nil
}

// staged is one chain of the batch in acts.send: a command's (REG and)
// SEND, or a LOCAL_INV.
type staged struct {
	slot     int
	end      int // index in acts.send one past the chain
	localInv bool
}

// core is a channel's I/O state machine. It takes events (a request to
// start, work completions, the outcome of a post, a tick, the connection
// coming up or going down) and returns actions (work requests to post,
// requests to deliver or re-queue, a reason to tear down). It starts no
// goroutines, reads no clock (the shell passes the time in) and calls no
// provider: the shell (channel) posts, polls and connects. Its one
// collaborator is the registration pool, whose Get, Invalidate and
// completion bookkeeping it drives; replacing MRs after a loss is the
// shell's (Recover allocates on the device).
//
// Rules it keeps, each checked by check and by the traces in
// testdata/core:
//   - a request completes only when its response has arrived, its SEND
//     has completed and its key is proven dead (remote invalidation of
//     exactly its key, or a LOCAL_INV that completed SUCCESS), so a
//     returned I/O leaves no key the target can use;
//   - anything a peer sends that the protocol does not allow (an unknown
//     or stale tag, a second answer, an invalidation of another key, an
//     invalidation for a request without data) ends the connection and
//     completes nothing;
//   - after fail, no event changes anything until reset.
type core struct {
	p    coreParams
	pool *frmr.Pool

	up          bool // a connection is logged in and has not failed
	credits     int  // granted at login
	avail       int
	maxImm      int // largest WRITE sent as immediate data (0: none)
	remoteInv   bool
	handles     map[*Volume]uint32
	slots       []ioSlot
	free        []int
	waiting     []int // slots in slotResponded, waiting for their keys
	invPending  []int // responded slots whose LOCAL_INV is still to post
	batch       []staged
	staged      uint64 // commands staged so far (ioSlot.seq)
	order       []int  // reset's scratch
	cmd         wire.Command
	acts        coreActions
	lastFailure error
}

func newCore(p coreParams) *core {
	c := &core{p: p, pool: p.pool, handles: map[*Volume]uint32{}}
	c.slots = make([]ioSlot, p.credits)
	c.free = make([]int, 0, p.credits)
	for i := range c.slots {
		c.free = append(c.free, i)
	}
	c.waiting = make([]int, 0, p.credits)
	c.invPending = make([]int, 0, p.credits)
	c.batch = make([]staged, 0, 2*p.credits)
	c.order = make([]int, 0, p.credits)
	c.acts.recv = make([]transport.RecvWR, 0, len(p.recvWRs))
	c.acts.send = make([]transport.SendWR, 0, p.sqDepth)
	c.acts.done = make([]doneIO, 0, p.credits)
	c.acts.requeue = make([]*Request, 0, p.credits)
	return c
}

// login is what a successful login granted.
type login struct {
	credits   int
	remoteInv bool
	maxImm    int
}

// ---- events ----

// connected is a login that succeeded: the connection may carry I/O.
func (c *core) connected(l login) {
	c.credits = min(l.credits, len(c.slots))
	c.avail = c.credits
	c.remoteInv = l.remoteInv
	c.maxImm = l.maxImm
	c.up = true
	c.lastFailure = nil
}

// setHandle records the handle a volume has on this connection; dropHandle
// forgets it.
func (c *core) setHandle(v *Volume, h uint32) { c.handles[v] = h }
func (c *core) dropHandle(v *Volume)          { delete(c.handles, v) }

// hasHandle reports whether v is open on this connection.
func (c *core) hasHandle(v *Volume) bool {
	_, ok := c.handles[v]
	return ok
}

// canStart reports whether a request could take a credit now.
func (c *core) canStart() bool { return c.up && c.avail > 0 && len(c.free) > 0 }

// stageInvalidations stages the LOCAL_INVs that did not fit before;
// false if the send queue is still too full for the oldest.
func (c *core) stageInvalidations() bool {
	k := 0
	for k < len(c.invPending) && c.up {
		if !c.stageInvalidate(c.invPending[k]) {
			break
		}
		k++
	}
	// Shift rather than reslice, so the list keeps its capacity and
	// the hot path never allocates.
	c.invPending = append(c.invPending[:0], c.invPending[k:]...)
	return c.up && len(c.invPending) == 0
}

// room is how many more WRs the batch may take.
func (c *core) room() int { return c.pool.Room() - len(c.acts.send) }

// start stages one request on a free credit, at time now. It reports false
// if the request must wait (no credit, no room on the send queue, no free
// MR); the shell puts it back at the front of its queue. A request that
// cannot be carried at all is finished in acts.done.
func (c *core) start(r *Request, now int64) bool {
	if !c.canStart() {
		return false
	}
	si := c.free[len(c.free)-1]
	sl := &c.slots[si]
	sendBuf := c.p.msg[sl.sendOff : sl.sendOff+sendIU]
	tag := uint64(si) | uint64(sl.gen+1)<<32
	var iuLen int
	nsge := 1 // the IU; 2 with immediate data
	var reg frmr.Reg
	hasReg := false
	if r.Op == opControl {
		if r.vol != nil {
			// A request about an open volume (close, extents) names
			// this connection's handle for it.
			h, ok := c.handles[r.vol]
			switch {
			case !ok && r.ctrl.Op == wire.ControlClose:
				c.finish(r, nil) // never opened on this connection
				return true
			case !ok:
				c.finish(r, fmt.Errorf("initiator: volume %q is not open on channel %d: %w", r.vol.name, c.p.id, ErrClosed))
				return true
			}
			r.ctrl.Handle = h
		}
		r.ctrl.Tag = tag
		iu, err := wire.EncodeControl(sendBuf[:0], wire.OpControl, r.ctrl)
		if err != nil || len(iu) > sendIU {
			c.finish(r, fmt.Errorf("initiator: control request: %w", wire.ErrTooLarge))
			return true
		}
		if c.room() < 1 {
			return false
		}
		if r.ctrl.Op == wire.ControlClose {
			delete(c.handles, r.vol)
		}
		iuLen = len(iu)
	} else {
		h, ok := c.handles[r.vol]
		if !ok {
			c.finish(r, fmt.Errorf("initiator: volume %q is not open on channel %d: %w", r.vol.name, c.p.id, ErrClosed))
			return true
		}
		if c.room() < 2 {
			return false
		}
		cmd := &c.cmd
		*cmd = wire.Command{Op: wire.Op(r.Op), Volume: h, Tag: tag, Offset: uint64(r.Offset), Length: uint32(r.length())}
		if r.FUA {
			cmd.Flags |= wire.FlagFUA
		}
		if r.Op == OpRead || r.Op == OpWrite {
			n := len(r.Buf)
			seg, zc := c.p.zeroCopy(r.Buf)
			if !zc {
				seg = frmr.Segment{Arena: c.p.dataArena, Off: sl.bounce, Len: n, Base: sl.base}
			}
			if r.Op == OpWrite && n <= c.maxImm {
				// Immediate data: the SEND gathers it from the buffer
				// through the session MR's local key, so no key is
				// exposed to the target and none needs invalidating.
				// The buffer has been read when the response arrives:
				// on RC the target answers only a command it received.
				cmd.Flags |= wire.FlagImmediate
				sl.sge[1] = transport.SGE{Addr: c.p.dataAddr + uint64(seg.Off), Length: uint32(n), LKey: c.p.dataLKey}
				nsge = 2
			} else {
				dir := frmr.PeerReads
				if r.Op == OpRead {
					dir = frmr.PeerWrites
				}
				var err error
				reg, err = c.pool.Get(seg, dir)
				if err != nil {
					if errors.Is(err, frmr.ErrExhausted) || errors.Is(err, frmr.ErrNotDrained) {
						return false
					}
					c.fail(fmt.Errorf("initiator: register %d bytes: %w", n, err))
					return false
				}
				hasReg = true
				cmd.NDesc = 1
				cmd.Desc[0] = wire.Descriptor{VA: reg.IOVA(), RKey: uint32(reg.RKey()), Len: uint32(n)}
				if c.remoteInv {
					cmd.Flags |= wire.FlagInvalidate
					cmd.InvalidateKey = uint32(reg.RKey())
				}
			}
			if !zc && r.Op == OpWrite {
				// The caller may give up on r meanwhile; pin it so that
				// a returned WriteAt never has its buffer read.
				if !r.pin() {
					if hasReg {
						c.pool.Cancel(reg)
					}
					return true // abandoned: drop it
				}
				copy(c.p.data[sl.bounce:sl.bounce+n], r.Buf)
				r.unpin()
			}
		}
		n, err := cmd.Encode(sendBuf)
		if err != nil {
			if hasReg {
				c.pool.Cancel(reg)
			}
			c.finish(r, err)
			return true
		}
		iuLen = n
	}
	if hasReg {
		c.acts.send = append(c.acts.send, reg.WR())
	}
	sl.sge[0] = transport.SGE{Addr: c.p.msgAddr + uint64(sl.sendOff), Length: uint32(iuLen), LKey: c.p.msgLKey}
	sl.gen++
	c.acts.send = append(c.acts.send, transport.SendWR{ID: sendID(si, sl.gen), Opcode: transport.OpSend, SGL: sl.sge[:nsge]})
	c.batch = append(c.batch, staged{slot: si, end: len(c.acts.send)})
	c.free = c.free[:len(c.free)-1]
	c.avail--
	c.staged++
	sl.state, sl.req, sl.reg, sl.hasReg, sl.started, sl.seq = slotStaged, r, reg, hasReg, now, c.staged
	return true
}

// takeSend readies the staged batch for one PostSend: the pool sets the
// signaling flags it needs. The shell posts it and reports with posted.
func (c *core) takeSend() []transport.SendWR {
	if len(c.acts.send) == 0 {
		return nil
	}
	if err := c.pool.Admit(c.acts.send); err != nil {
		// start and stageInvalidate checked the room, so this is a
		// bookkeeping bug; nothing was posted, and nothing is lost by
		// trying again on a new connection.
		c.settle(0, fmt.Errorf("initiator: admit %d WRs: %w", len(c.acts.send), err), false)
		return nil
	}
	return c.acts.send
}

// posted is the outcome of PostSend(takeSend()): the first n WRs were
// accepted.
func (c *core) posted(n int, err error) { c.settle(n, err, true) }

// settle ends a batch. Chains past n go back: their requests to the front
// of the queue (their slots free again), their LOCAL_INVs to invPending.
// A full queue is waited out; any other refusal ends the connection.
func (c *core) settle(n int, err error, didPost bool) {
	batch := c.acts.send
	if didPost {
		// The pool taints what was registered and never advertised.
		c.pool.Posted(batch, n)
	}
	for _, b := range c.batch {
		sl := &c.slots[b.slot]
		if b.end <= n {
			if !b.localInv {
				sl.state = slotSent
			}
			continue
		}
		if b.localInv {
			c.invPending = append(c.invPending, b.slot)
			continue
		}
		if sl.hasReg && !didPost {
			c.pool.Cancel(sl.reg) // the device saw nothing
		}
		if r := sl.req; r.Op == opControl && r.ctrl.Op == wire.ControlClose {
			c.handles[r.vol] = r.ctrl.Handle // still open on the target
		}
		c.requeue(sl.req)
		sl.req, sl.hasReg, sl.state = nil, false, slotFree
		c.free = append(c.free, b.slot)
		c.avail++
	}
	c.batch = c.batch[:0]
	c.acts.send = c.acts.send[:0]
	if n < len(batch) && (!didPost || !errors.Is(err, transport.ErrQueueFull)) {
		c.fail(fmt.Errorf("initiator: post %d WRs: %w", len(batch)-n, err))
	}
}

// completions handles one batch of polled work completions.
func (c *core) completions(wcs []transport.WC) {
	sends := false
	for i := range wcs {
		if !c.up {
			return
		}
		wc := &wcs[i]
		if wc.ID>>56 == idRecv {
			if wc.Status != transport.StatusSuccess {
				c.fail(fmt.Errorf("initiator: receive completion %s%s", wc.Status, rootCause(wcs[i+1:])))
				return
			}
			c.onRecv(wc)
			continue
		}
		sends = true
		c.pool.OnSendCompletion(wc)
		if wc.Status != transport.StatusSuccess {
			c.fail(fmt.Errorf("initiator: send completion %s%s", wc.Status, rootCause(wcs[i+1:])))
			return
		}
		if err := c.pool.Err(); err != nil {
			// A successful completion that proves a signaled WR before
			// it was skipped: nothing the pool hands out is trustworthy
			// until the QP is rebuilt.
			c.fail(fmt.Errorf("initiator: %w", err))
			return
		}
	}
	if sends {
		c.finishWaiting()
	}
}

func (c *core) onRecv(wc *transport.WC) {
	idx := int(wc.ID & 0xffffff)
	if idx >= len(c.p.recvWRs) || int(wc.ByteLen) > recvIU {
		c.fail(fmt.Errorf("initiator: receive %#x of %d bytes: %w", wc.ID, wc.ByteLen, ErrProtocol))
		return
	}
	b := c.p.msg[idx*recvIU : idx*recvIU+int(wc.ByteLen)]
	op, err := wire.PeekOpcode(b)
	if err != nil {
		c.fail(fmt.Errorf("initiator: %w: %w", ErrProtocol, err))
		return
	}
	var sl *ioSlot
	si := -1
	lookup := func(tag uint64) bool {
		i := int(tag & 0xffffffff)
		if i >= len(c.slots) {
			return false
		}
		si, sl = i, &c.slots[i]
		return sl.state == slotSent && sl.gen == uint32(tag>>32)
	}
	var credits uint32
	switch op {
	case wire.OpResponse:
		var rsp wire.Response
		if err := rsp.Decode(b); err != nil {
			c.fail(fmt.Errorf("initiator: %w: %w", ErrProtocol, err))
			return
		}
		if !lookup(rsp.Tag) || sl.req.Op == opControl {
			c.fail(fmt.Errorf("initiator: response for tag %#x, which names no block request in flight: %w", rsp.Tag, ErrProtocol))
			return
		}
		if rsp.Flags&wire.RespCapacityChanged != 0 && (rsp.Size == 0 || rsp.Size > math.MaxInt64) {
			c.fail(fmt.Errorf("initiator: capacity notice of a %d-byte volume: %w", rsp.Size, ErrProtocol))
			return
		}
		sl.rsp, credits = rsp, rsp.Credits
	case wire.OpControlResp:
		var rsp wire.ControlResponse
		if err := wire.DecodeControl(b, op, &rsp); err != nil {
			c.fail(fmt.Errorf("initiator: %w: %w", ErrProtocol, err))
			return
		}
		if !lookup(rsp.Tag) || sl.req.Op != opControl {
			c.fail(fmt.Errorf("initiator: control response for tag %#x, which names no control request in flight: %w", rsp.Tag, ErrProtocol))
			return
		}
		sl.req.ctrlRsp, credits = rsp, rsp.Credits
	default:
		c.fail(fmt.Errorf("initiator: unexpected %s: %w", op, ErrProtocol))
		return
	}
	withInv := wc.Flags&transport.WCWithInv != 0
	switch {
	case sl.hasReg && withInv:
		// Remote invalidation counts only if it names the key
		// registered for this request
		// (docs/registration.md#bogus-remote-invalidation; nvme-rdma's
		// nvme_rdma_process_nvme_rsp).
		if err := c.pool.OnRemoteInvalidate(sl.reg, wc.InvalidatedKey); err != nil {
			c.fail(err)
			return
		}
	case withInv:
		c.fail(fmt.Errorf("initiator: target invalidated %s for a request without data: %w", wc.InvalidatedKey, ErrProtocol))
		return
	}
	c.avail = min(c.avail+int(credits), c.credits)
	c.acts.recv = append(c.acts.recv, c.p.recvWRs[idx])
	sl.state = slotResponded
	if sl.hasReg && !withInv && !c.stageInvalidate(si) {
		c.invPending = append(c.invPending, si)
	}
	if !c.up {
		return
	}
	c.waiting = append(c.waiting, si)
	c.finishWaiting()
}

// stageInvalidate stages the signaled LOCAL_INV of a slot whose response
// did not invalidate its key; false if the send queue has no room yet.
func (c *core) stageInvalidate(si int) bool {
	if c.room() < 1 {
		return false
	}
	wr, err := c.pool.Invalidate(c.slots[si].reg)
	if err != nil {
		c.fail(fmt.Errorf("initiator: invalidate: %w", err))
		return true
	}
	c.acts.send = append(c.acts.send, wr)
	c.batch = append(c.batch, staged{slot: si, end: len(c.acts.send), localInv: true})
	return true
}

// finishWaiting completes every responded request whose memory the pool
// has proven unreachable.
func (c *core) finishWaiting() {
	for k := 0; k < len(c.waiting); {
		si := c.waiting[k]
		sl := &c.slots[si]
		if sl.hasReg && !c.pool.Done(sl.reg) {
			k++
			continue
		}
		c.waiting[k] = c.waiting[len(c.waiting)-1]
		c.waiting = c.waiting[:len(c.waiting)-1]
		c.complete(si)
	}
}

func (c *core) complete(si int) {
	sl := &c.slots[si]
	r := sl.req
	sl.req, sl.hasReg, sl.state = nil, false, slotFree
	c.free = append(c.free, si)
	var err error
	if r.Op != opControl && sl.rsp.Status != wire.StatusGood {
		err = &IOError{Op: r.Op, Off: r.Offset, Len: r.length(), Sense: Sense(sl.rsp.Sense)}
	}
	d := doneIO{req: r, err: err, bounce: sl.bounce, rsp: true}
	if r.Op != opControl && sl.rsp.Flags&wire.RespCapacityChanged != 0 {
		d.size = int64(sl.rsp.Size)
	}
	c.acts.done = append(c.acts.done, d)
}

// finish completes a request that never took a credit.
func (c *core) finish(r *Request, err error) {
	c.acts.done = append(c.acts.done, doneIO{req: r, err: err, bounce: -1})
}

func (c *core) requeue(r *Request) {
	if r != nil && !r.abandoned() {
		c.acts.requeue = append(c.acts.requeue, r)
	}
}

// tick is the passage of time: the pool's completion deadlines and the
// I/O timeout.
func (c *core) tick(now int64) {
	if !c.up {
		return
	}
	if err := c.pool.Tick(); err != nil {
		c.fail(fmt.Errorf("initiator: %w", err))
		return
	}
	for i := range c.slots {
		if sl := &c.slots[i]; sl.state == slotSent && now-sl.started > c.p.ioTimeout {
			c.fail(fmt.Errorf("initiator: %s outstanding for %s (I/O timeout %s)", sl.req.Op, time.Duration(now-sl.started).Round(time.Millisecond), time.Duration(c.p.ioTimeout)))
			return
		}
	}
}

// fail ends the connection: no event changes anything until reset.
func (c *core) fail(err error) {
	if !c.up {
		return
	}
	c.up = false
	c.acts.fail = err
	c.lastFailure = err
}

// reset forgets the connection after the shell tore it down: every
// request that had not completed goes back to the queue in the order it
// was started (xprtrdma's and nvme-rdma's recovery: requests are
// re-issued, MRs never survive a connection).
func (c *core) reset() {
	c.up = false
	c.order = c.order[:0]
	for i := range c.slots {
		if c.slots[i].state != slotFree {
			c.order = append(c.order, i)
		}
	}
	slices.SortFunc(c.order, func(a, b int) int { return cmp.Compare(c.slots[a].seq, c.slots[b].seq) })
	for _, i := range c.order {
		sl := &c.slots[i]
		c.requeue(sl.req)
		sl.req, sl.hasReg, sl.state = nil, false, slotFree
	}
	c.free = c.free[:0]
	for i := range c.slots {
		c.free = append(c.free, i)
	}
	c.waiting, c.invPending, c.batch = c.waiting[:0], c.invPending[:0], c.batch[:0]
	c.acts.send = c.acts.send[:0]
	c.acts.recv = c.acts.recv[:0]
	c.avail = 0
	clear(c.handles)
}

// idle reports whether no request holds a credit.
func (c *core) idle() bool { return len(c.free) == len(c.slots) }

// unfinished are the requests still holding a credit (Close's last word).
func (c *core) unfinished() []*Request {
	var rs []*Request
	for i := range c.slots {
		if sl := &c.slots[i]; sl.req != nil {
			rs = append(rs, sl.req)
			sl.req = nil
		}
	}
	return rs
}

// check verifies the core's invariants: the pool's own (frmr's Check),
// and that every credit slot is accounted for exactly once (free, or
// holding the request it was started for), the responded ones waiting
// for their keys to die.
func (c *core) check() error {
	if err := c.pool.Check(); err != nil {
		return fmt.Errorf("initiator: channel %d: %w", c.p.id, err)
	}
	free := make([]bool, len(c.slots))
	for _, si := range c.free {
		if free[si] {
			return fmt.Errorf("initiator: channel %d: slot %d twice on the free list", c.p.id, si)
		}
		free[si] = true
	}
	waiting := make([]bool, len(c.slots))
	for _, si := range c.waiting {
		waiting[si] = true
	}
	for i := range c.slots {
		sl := &c.slots[i]
		switch {
		case free[i] != (sl.state == slotFree):
			return fmt.Errorf("initiator: channel %d: slot %d in %s, on the free list: %v", c.p.id, i, sl.state, free[i])
		case sl.state == slotFree && sl.req != nil:
			return fmt.Errorf("initiator: channel %d: free slot %d holds a request", c.p.id, i)
		case sl.state != slotFree && sl.req == nil:
			return fmt.Errorf("initiator: channel %d: slot %d in %s holds no request", c.p.id, i, sl.state)
		case sl.state == slotResponded && !waiting[i] && !slices.Contains(c.invPending, i):
			return fmt.Errorf("initiator: channel %d: responded slot %d neither waits for its key nor for its LOCAL_INV", c.p.id, i)
		case sl.state == slotStaged && len(c.acts.send) == 0:
			return fmt.Errorf("initiator: channel %d: slot %d staged with nothing to post", c.p.id, i)
		}
	}
	if c.avail < 0 || c.avail > c.credits {
		return fmt.Errorf("initiator: channel %d: %d credits available of %d", c.p.id, c.avail, c.credits)
	}
	return nil
}
