package target

// The core's control requests (LIST, OPEN, CLOSE, ...): started on a slot,
// run as a backend job, answered with a control response.

import (
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

func (c *core) startControl(s *slot) {
	req := &s.ctl
	if c.state == connDraining {
		s.busy = true
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInternal, Error: "target shutting down"})
		return
	}
	switch req.Op {
	case wire.ControlList:
		c.dispatch(s, jobList)
	case wire.ControlOpen:
		acc := c.allow(c.p.acl(), req.Volume)
		if acc == AccessNone {
			c.controlRespond(s, c.deniedOpen(req.Volume))
			return
		}
		if c.nhandles >= maxHandles {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInvalidField,
				Error: fmt.Sprintf("too many open volumes (max %d per connection)", maxHandles)})
			return
		}
		if req.Exclusive && req.ReadOnly {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInvalidField,
				Error: "an exclusive open must be read-write"})
			return
		}
		s.ctlRO = req.ReadOnly || acc == AccessReadOnly
		s.resizedTo = 0
		// The job looks the volume up in the table once the store has
		// opened it: OPENs of names that do not exist add no entry.
		s.prt, s.prv, s.prIni, s.prOwner, s.prOut = c.p.pr, nil, c.initiator, c.sessionKey(), prOutcome{}
		s.prWriter = false
		c.dispatch(s, jobOpen)
	case wire.ControlClose:
		ov := c.lookup(req.Handle)
		if ov == nil {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseNoSuchVolume,
				Error: fmt.Sprintf("no open volume with handle %d", req.Handle)})
			return
		}
		c.handles[req.Handle-1] = nil
		c.nhandles--
		c.handlesGen++
		if ov.revoked {
			// The shell closed the volume when it was revoked; only the
			// number was still reserved.
			c.controlRespond(s, &wire.ControlResponse{})
			return
		}
		s.ov = ov
		c.dispatch(s, jobClose)
	case wire.ControlPing:
		// Answered here, on the connection's loop, not by a worker:
		// it proves the target alive even while its store is slow.
		c.controlRespond(s, &wire.ControlResponse{})
	case wire.ControlExtents:
		c.startExtents(s)
	case wire.ControlReserveOut, wire.ControlReserveIn:
		c.startReservation(s)
	default:
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseUnsupported,
			Error: fmt.Sprintf("unknown control operation %q", req.Op)})
	}
}

func (c *core) finishControl(s *slot) {
	req := &s.ctl
	switch s.job {
	case jobList:
		if s.err != nil {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInternal, Error: "list volumes: " + s.err.Error()})
			return
		}
		rsp := &wire.ControlResponse{Volumes: []wire.VolumeInfo{}}
		for _, v := range s.list {
			acc := c.allow(c.p.acl(), v.Name)
			if acc == AccessNone {
				continue
			}
			rsp.Volumes = append(rsp.Volumes, wire.VolumeInfo{Name: v.Name, Size: uint64(v.Size),
				BlockSize: uint32(v.BlockSize), ReadOnly: v.ReadOnly || acc == AccessReadOnly})
		}
		s.list = nil
		c.controlRespond(s, rsp)
	case jobOpen:
		if s.err != nil {
			sense := standbySense(s.err, wire.SenseNoSuchVolume)
			if errors.Is(s.err, errOpenPending) {
				sense = wire.SenseBecomingReady
			}
			rsp := &wire.ControlResponse{Sense: sense, Error: fmt.Sprintf("open volume %q: %v", req.Volume, s.err)}
			if s.prOut.sense != wire.SenseNone {
				rsp.Sense, rsp.Error = s.prOut.sense, fmt.Sprintf("open volume %q: %s", req.Volume, s.prOut.msg)
			}
			c.controlRespond(s, rsp)
			return
		}
		// The policy may have changed while the volume was being opened:
		// what it says now is what the handle gets.
		switch c.allow(c.p.acl(), req.Volume) {
		case AccessNone:
			c.acts.closeVols = append(c.acts.closeVols, &openVol{name: req.Volume, vol: s.opened,
				pr: s.prv, owner: s.prOwner, writer: s.prWriter, excl: req.Exclusive})
			s.opened = nil
			c.controlRespond(s, c.deniedOpen(req.Volume))
			return
		case AccessReadOnly:
			s.ctlRO = true
		}
		info := s.openInfo
		if s.resizedTo != 0 {
			info.Size = s.resizedTo
		}
		ov := &openVol{name: req.Volume, vol: s.opened, size: info.Size, bs: int64(info.BlockSize),
			ro: s.ctlRO || info.ReadOnly, stats: c.p.volStats(req.Volume),
			pr: s.prv, owner: s.prOwner, ini: c.initiator, writer: s.prWriter, excl: req.Exclusive && s.prWriter}
		if ov.writer {
			ov.pr.addWriter(ov)
		}
		ov.now = immediate(s.opened)
		if bw, ok := s.opened.(BatchWriter); ok && !ov.now && !ov.ro {
			ov.batch = bw
		}
		s.opened = nil
		h := -1
		for i, x := range c.handles {
			if x == nil {
				h = i
				break
			}
		}
		if h < 0 {
			c.handles = append(c.handles, ov)
			h = len(c.handles) - 1
		} else {
			c.handles[h] = ov
		}
		c.nhandles++
		c.handlesGen++
		ov.handle = uint32(h + 1)
		caps := wire.CapFlush
		if !ov.ro {
			caps |= wire.CapFUA | wire.CapDiscard | wire.CapWriteZeroes
		}
		if ov.now && !ov.ro {
			// An Immediate volume lives in memory (see Immediate): the
			// writer must not take a restart for the loss of its
			// unflushed writes alone.
			caps |= wire.CapVolatile
		}
		rsp := &wire.ControlResponse{Handle: ov.handle, Size: uint64(ov.size),
			BlockSize: uint32(ov.bs), ReadOnly: ov.ro, Caps: caps, Identity: identity(ov.vol)}
		if info.Standby {
			rsp.PathState = wire.PathStandby
		}
		c.controlRespond(s, rsp)
	case jobExtents:
		c.finishExtents(s)
	case jobReserve, jobReport:
		c.finishReservation(s)
	case jobClose:
		s.ov = nil
		rsp := &wire.ControlResponse{}
		if s.err != nil {
			rsp.Sense, rsp.Error = wire.SenseInternal, "close: "+s.err.Error()
		}
		c.controlRespond(s, rsp)
	}
}

func (c *core) deniedOpen(volume string) *wire.ControlResponse {
	return &wire.ControlResponse{Sense: wire.SenseAccessDenied,
		Error: fmt.Sprintf("access denied: initiator %q may not open volume %q", c.initiator, volume)}
}

// controlRespond posts a ControlResponse; one that does not fit the
// initiator's receive buffer becomes an error.
func (c *core) controlRespond(s *slot, rsp *wire.ControlResponse) {
	if !c.sqReserve(1) {
		return
	}
	rsp.Tag = s.ctl.Tag
	rsp.Credits = 1
	limit := min(iuSize, c.iniRecvIU)
	b, err := wire.EncodeControl(s.send[:0], wire.OpControlResp, rsp)
	if err != nil || len(b) > limit {
		msg := fmt.Sprintf("control response of %d bytes does not fit the %d-byte receive buffer", len(b), limit)
		if err != nil {
			msg = err.Error()
		}
		b, _ = wire.EncodeControl(s.send[:0], wire.OpControlResp,
			&wire.ControlResponse{Tag: s.ctl.Tag, Credits: 1, Sense: wire.SenseInternal, Error: msg})
	}
	if len(b) > len(s.send) || &b[0] != &s.send[0] {
		// EncodeControl outgrew the buffer and reallocated; copy what fits.
		n := copy(s.send, b)
		b = s.send[:n]
	}
	s.sges[0] = transport.SGE{Addr: s.sendAddr, Length: uint32(len(b)), LKey: c.p.iuLKey}
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindResp, int(s.idx)),
		Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: s.sges[0:1]})
	s.sigSeq = c.sqPosted
	c.outstanding--
	c.setSlot(s, slotResponding)
}

// openVolumes returns every volume the connection still holds, for the
// shell to close at teardown.
func (c *core) openVolumes() []*openVol {
	var out []*openVol
	for _, ov := range c.handles {
		if ov != nil && !ov.revoked {
			out = append(out, ov)
		}
	}
	return out
}
