package initiator

import (
	"fmt"
	"math"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

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
		if c.srp != nil {
			c.srpSendDone(wc)
		}
	}
	if sends {
		c.finishWaiting()
	}
}

func (c *core) onRecv(wc *transport.WC) {
	c.ka.heard = true // any IU is proof of life (keepalive.go)
	if c.srp != nil {
		c.onRecvSRP(wc)
		return
	}
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
		if q := sl.req.ctrl; q.Op == wire.ControlOpen && rsp.Error == "" {
			if !c.handleFree(rsp.Handle) {
				c.fail(fmt.Errorf("initiator: OPEN of %q answered with handle %d, which is not free on this connection: %w", q.Volume, rsp.Handle, ErrProtocol))
				return
			}
			c.given[rsp.Handle] = true
		}
		sl.req.ctrlRsp, credits = rsp, rsp.Credits
	case wire.OpPathNotice:
		c.onPathNotice(b, idx)
		return
	default:
		c.fail(fmt.Errorf("initiator: unexpected %s: %w", op, ErrProtocol))
		return
	}
	withInv := wc.Flags&transport.WCWithInv != 0
	switch {
	case withInv && !c.remoteInv:
		// The login asked for no remote invalidation (Config.
		// NoRemoteInvalidate, or a device on which it is unsafe: a key
		// the target invalidated may be registered again by a retry,
		// transport.Quirks.RetryRepeatsLocalOps). The key's state is
		// unknown now; the connection ends and the pool replaces it.
		c.fail(fmt.Errorf("initiator: target invalidated %s though the login asked it not to: %w", wc.InvalidatedKey, ErrProtocol))
		return
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
	if r := c.slots[si].req; r != nil && r.Op != opControl {
		c.answered++
	}
	if c.srp != nil {
		c.completeSRP(si)
		return
	}
	sl := &c.slots[si]
	r := sl.req
	sl.req, sl.hasReg, sl.state = nil, false, slotFree
	c.free = append(c.free, si)
	var err error
	if r.Op != opControl && sl.rsp.Status != wire.StatusGood {
		err = &IOError{Op: r.Op, Off: r.Offset, Len: r.length(), Sense: Sense(sl.rsp.Sense), Busy: sl.rsp.Status == wire.StatusBusy}
		if sl.rsp.Status == wire.StatusBusy {
			// The target could not run it now: a draining srpd answers
			// so until its connections end (the command never ran).
			// The wire says retry; it goes again after a tick, until
			// the I/O timeout (retryLater).
			c.retryLater(r, si, err, true)
			return
		}
	}
	d := doneIO{req: r, err: err, bounce: sl.bounce, rsp: true}
	if r.Op != opControl && sl.rsp.Flags&wire.RespCapacityChanged != 0 {
		d.size = int64(sl.rsp.Size)
	}
	c.acts.done = append(c.acts.done, d)
}

// onPathNotice takes an unsolicited path notice: it names no request and
// returns no credit; its receive (the one kept beyond the credits) is
// reposted at once, since the target sends the next only after this
// one's SEND completed.
func (c *core) onPathNotice(b []byte, idx int) {
	if !c.pathNotices {
		c.fail(fmt.Errorf("initiator: a path notice the login did not ask for: %w", ErrProtocol))
		return
	}
	n, err := wire.DecodePathNotice(b)
	if err != nil {
		c.fail(fmt.Errorf("%w: %w", ErrProtocol, err))
		return
	}
	c.acts.recv = append(c.acts.recv, c.p.recvWRs[idx])
	for v, h := range c.handles {
		if h == n.Handle {
			// A state this side does not know is standby (PathState.Valid).
			c.acts.paths = append(c.acts.paths, pathNote{v: v, standby: n.State != wire.PathActive})
			return
		}
	}
	// A handle closed since the target queued the notice: nothing to do.
}
