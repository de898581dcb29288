package target

// The core's reservation requests (PERSISTENT RESERVE OUT and IN, from a
// gosrp host's control request or an SRP host's SCSI command) and the
// check every command passes.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
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

// srpReserveOut goes on with a PERSISTENT RESERVE OUT whose parameter
// list is in the slot's data buffer: the change runs as a gosrp host's
// does, as the SRP host's initiator port (its registration is on every
// gateway's port: the state is the volume's).
func (c *core) srpReserveOut(s *slot) {
	req, a := scsi.ReserveOut(s.srp.act.PR, s.data[:s.cmd.Length])
	if a.Status != scsi.StatusGood {
		c.srpAnswer(s, a.Status, a.Sense)
		return
	}
	if req.Action == wire.ActionRegisterMove && req.Dest == c.initiator {
		// SPC-4 5.13.8: a move to the I_T nexus it came on.
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidParam)
		return
	}
	s.ctl = req
	s.ov, s.prIni = s.srp.lu.ov, c.initiator
	c.dispatch(s, jobReserve)
}

// srpReservationDone answers an SRP host's PERSISTENT RESERVE IN or OUT
// once its job ran: a report as READ KEYS' or READ RESERVATION's data;
// a change GOOD, or refused as SPC-4 says: a conflict with the status
// RESERVATION CONFLICT (a wrong key, another's reservation), a standby
// gateway that cannot record it NOT READY (standby), an invalid request
// INVALID FIELD.
func (c *core) srpReservationDone(s *slot) {
	ov, rep := s.ov, s.prRep
	s.ov, s.prRep = nil, nil
	if s.err != nil {
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.FromWire(standbySense(s.err, wire.SenseInternal), scsi.OpNone))
		return
	}
	if s.job == jobReport {
		regs := make([]scsi.Registration, len(rep.Registrants))
		for i, r := range rep.Registrants {
			regs[i] = scsi.Registration{Key: r.Key, Holder: r.Initiator == rep.Holder, TransportID: scsi.TransportIDOf(r.Initiator)}
		}
		// The state's type is ResNone whenever no host holds it.
		a := scsi.ReserveInData(s.srp.act.PR, rep.Generation, regs, rep.HolderKey, rep.ResType)
		if a.Status != scsi.StatusGood {
			c.srpAnswer(s, a.Status, a.Sense)
			return
		}
		c.srpDataIn(s, a.Data)
		return
	}
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("SRP reservation %s of %q: %s", s.ctl.Action, ov.name, ov.pr))
	}
	switch sense := s.prOut.sense; {
	case sense == wire.SenseReservationConflict:
		c.srpAnswer(s, scsi.StatusResvConflict, scsi.SenseNone)
	case s.prOut.scsi != scsi.SenseNone:
		c.srpAnswer(s, scsi.StatusCheckCondition, s.prOut.scsi)
	case sense != wire.SenseNone:
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.FromWire(sense, scsi.OpNone))
	default:
		c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
	}
}
