package target

// The core's reservation requests (PERSISTENT RESERVE OUT and IN) and the
// check every command passes.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
)

// reservationAllows checks a command against its volume's reservations
// (SPC-4 §5.13.1): every command but READ and FLUSH writes.
func (c *core) reservationAllows(ov *openVol, op wire.Op) bool {
	if ov.pr == nil {
		return true
	}
	return ov.pr.allows(c.initiator, ov.owner, op != wire.OpRead && op != wire.OpFlush)
}

// startReservation starts a ControlReserveOut or ControlReserveIn on the
// volume of its handle. The change runs as a job: it may have to reach
// the disk before it is answered.
func (c *core) startReservation(s *slot) {
	req := &s.ctl
	ov := c.usableHandle(s)
	switch {
	case ov == nil:
		return
	case ov.pr == nil:
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseUnsupported,
			Error: "this volume takes no reservations"})
		return
	}
	s.ov, s.prIni = ov, c.initiator
	if req.Op == wire.ControlReserveIn {
		c.dispatch(s, jobReport)
		return
	}
	if !req.Action.Valid() {
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInvalidField,
			Error: fmt.Sprintf("unknown reservation action %d", uint8(req.Action))})
		return
	}
	c.dispatch(s, jobReserve)
}

func (c *core) finishReservation(s *slot) {
	if s.job == jobReport {
		rsp := s.prRep
		if s.err != nil {
			rsp = &wire.ControlResponse{Sense: standbySense(s.err, wire.SenseInternal), Error: s.err.Error()}
		}
		s.prRep, s.ov = nil, nil
		c.controlRespond(s, rsp)
		return
	}
	rsp := &wire.ControlResponse{Generation: s.prGen}
	if s.err != nil {
		rsp.Sense, rsp.Error = wire.SenseInternal, s.err.Error()
	} else if s.prOut.sense != wire.SenseNone {
		rsp.Sense, rsp.Error = s.prOut.sense, s.prOut.msg
	}
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("reservation %s of %q: %s", s.ctl.Action, s.ov.name, s.ov.pr))
	}
	s.ov = nil
	c.controlRespond(s, rsp)
}
