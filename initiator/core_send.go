package initiator

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// room is how many more WRs the batch may take.
func (c *core) room() int {
	n := c.pool.Room() - c.acts.sends()
	if len(c.acts.regs) > 0 {
		n -= c.pool.FenceLen()
	}
	return n
}

// start stages one request on a free credit, at time now. It reports false
// if the request must wait (no credit, no room on the send queue, no free
// MR); the shell puts it back at the front of its queue. A request that
// cannot be carried at all is finished in acts.done.
func (c *core) start(r *Request, now int64) bool {
	if !c.canStart() {
		return false
	}
	if c.retryExpired(r, now) {
		return true
	}
	if c.held {
		return false
	}
	if c.srp != nil {
		return c.startSRP(r, now)
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
			delete(c.given, r.ctrl.Handle)
		}
		iuLen = len(iu)
	} else {
		h, ok := c.handles[r.vol]
		if !ok {
			c.finish(r, fmt.Errorf("initiator: volume %q is not open on channel %d: %w", r.vol.name, c.p.id, ErrClosed))
			return true
		}
		if c.room() < 2+c.pool.FenceLen() {
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
				var ok bool
				if reg, ok = c.register(seg, r.Op == OpRead); !ok {
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
			if !zc && r.Op == OpWrite && !c.bounceIn(r, sl, reg, hasReg) {
				return true // abandoned: drop it
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
	c.stage(si, r, reg, hasReg, iuLen, nsge, now)
	return true
}

// stage appends a started request's chain (REG, if any, and the SEND of
// its iuLen-byte IU with nsge SGEs) to the batch and takes its credit.
func (c *core) stage(si int, r *Request, reg frmr.Reg, hasReg bool, iuLen, nsge int, now int64) {
	sl := &c.slots[si]
	sl.sge[0] = transport.SGE{Addr: c.p.msgAddr + uint64(sl.sendOff), Length: uint32(iuLen), LKey: c.p.msgLKey}
	sl.gen++
	send := transport.SendWR{ID: sendID(si, sl.gen), Opcode: transport.OpSend, SGL: sl.sge[:nsge]}
	switch {
	case hasReg && c.pool.FenceLen() > 0:
		// Behind the batch's fence, with the other registrations
		// (takeSend).
		c.acts.regs = append(c.acts.regs, reg.WR())
		c.acts.regSends = append(c.acts.regSends, send)
		c.batch = append(c.batch, staged{slot: si, regSend: len(c.acts.regSends)})
	case hasReg:
		c.acts.send = append(c.acts.send, reg.WR(), send)
		c.batch = append(c.batch, staged{slot: si, end: len(c.acts.send)})
	default:
		c.acts.send = append(c.acts.send, send)
		c.batch = append(c.batch, staged{slot: si, end: len(c.acts.send)})
	}
	c.free = c.free[:len(c.free)-1]
	c.avail--
	c.staged++
	sl.state, sl.req, sl.reg, sl.hasReg, sl.started, sl.seq = slotStaged, r, reg, hasReg, now, c.staged
}

// register registers seg for the target to write (in) or read; false if
// the request must wait (no MR free yet) or the connection failed.
func (c *core) register(seg frmr.Segment, in bool) (frmr.Reg, bool) {
	dir := frmr.PeerReads
	if in {
		dir = frmr.PeerWrites
	}
	reg, err := c.pool.Get(seg, dir)
	if err != nil {
		if !errors.Is(err, frmr.ErrExhausted) && !errors.Is(err, frmr.ErrNotDrained) {
			c.fail(fmt.Errorf("initiator: register %d bytes: %w", seg.Len, err))
		}
		return reg, false
	}
	return reg, true
}

// bounceIn copies a write's data into its slot's bounce buffer; false if
// the caller gave up on r first (its registration is then cancelled).
// The caller may give up meanwhile; r is pinned so that a returned
// WriteAt never has its buffer read.
func (c *core) bounceIn(r *Request, sl *ioSlot, reg frmr.Reg, hasReg bool) bool {
	if !r.pin() {
		if hasReg {
			c.pool.Cancel(reg)
		}
		return false
	}
	copy(c.p.data[sl.bounce:sl.bounce+len(r.Buf)], r.Buf)
	r.unpin()
	return true
}

// stageInvalidations stages the LOCAL_INVs that did not fit before;
// false if the send queue is still too full for the oldest.
func (c *core) stageInvalidations() bool {
	if c.srp != nil && !c.srpStageAnswers() {
		return false
	}
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

// takeSend readies the staged batch for one PostSend: the pool sets the
// signaling flags it needs. The shell posts it and reports with posted.
func (c *core) takeSend() []transport.SendWR {
	if a := &c.acts; len(a.regs) > 0 {
		// One fence for the batch, then every registration, then the
		// commands carrying their keys in the same order: no
		// registration executes while a request before it waits for
		// its ACK (docs/registration.md#registration-repeated-by-a-retry).
		a.send = append(c.pool.AppendFence(a.send), a.regs...)
		first := len(a.send)
		a.send = append(a.send, a.regSends...)
		for i := range c.batch {
			if b := &c.batch[i]; b.regSend > 0 {
				b.end = first + b.regSend
			}
		}
		a.regs, a.regSends = a.regs[:0], a.regSends[:0]
	}
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
		if b.slot < 0 {
			c.srpUnposted(b, n)
			continue
		}
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
			c.given[r.ctrl.Handle] = true
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

// finish completes a request that never took a credit.
func (c *core) finish(r *Request, err error) {
	c.acts.done = append(c.acts.done, doneIO{req: r, err: err, bounce: -1})
}

// retryLater re-issues r, which the target answered with err, a
// condition that passes: its slot si is free again, and r goes back to
// the head of the queue, unless Config.IOTimeout has passed since it was
// first sent (retryExpired). With hold (the target said BUSY or TASK SET
// FULL: it cannot take the command now), nothing more is staged until
// the next tick, as Linux's midlayer blocks a device that answered BUSY
// for a moment (scsi_queue_insert, SCSI_MLQUEUE_DEVICE_BUSY) instead of
// sending the command straight back.
func (c *core) retryLater(r *Request, si int, err error, hold bool) {
	sl := &c.slots[si]
	if r.retries == 0 {
		r.retryFirst = sl.started
	}
	r.retries++
	r.retryLast = err
	c.held = c.held || hold
	c.requeue(r)
}

// retryExpired completes r, re-issued after a passing condition
// (retryLater), if Config.IOTimeout has passed since it was first sent:
// with the last answer, and how often it was tried. The error is
// os.ErrDeadlineExceeded as well as the last answer: the command ran out
// of time, as an I/O deadline does.
func (c *core) retryExpired(r *Request, now int64) bool {
	if r.retries == 0 || now-r.retryFirst <= c.p.ioTimeout {
		return false
	}
	err := fmt.Errorf("%w (re-issued %d times in %s, past the I/O timeout %s): %w",
		r.retryLast, r.retries, time.Duration(now-r.retryFirst).Round(time.Millisecond), time.Duration(c.p.ioTimeout), os.ErrDeadlineExceeded)
	r.retries, r.retryLast = 0, nil
	c.finish(r, err)
	return true
}

func (c *core) requeue(r *Request) {
	if r != nil && !r.abandoned() {
		c.acts.requeue = append(c.acts.requeue, r)
	}
}
