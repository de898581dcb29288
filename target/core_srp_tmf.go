package target

// SRP task management (SRP r16a 6.7, SAM-5 7): what an SRP_TSK_MGMT
// does to the channel's commands, in the pure core.
//
// A command is aborted in one of three places: waiting for the RDMA READ
// of its indirect table or of its data-out (not started: its volume job
// never runs), or with its
// volume job running (it finishes; a job cannot be called back). Either
// way a command its own I_T nexus aborted gets no SRP_RSP, as LIO sends
// none for one (TAS is about other nexuses'), and ib_srp, which claimed
// the request before it sent the abort (srp_abort, srp_claim_req), would
// only log a late one as "Null scmnd". Its credit comes back in the task
// management response's REQUEST LIMIT DELTA instead (ib_srpt's
// srpt_aborted_task does the same through the next response), or the
// initiator would lose a credit per abort.
//
// The task management response waits until every command it aborted has
// stopped: ib_srp frees an aborted request as soon as the answer says
// FUNCTION COMPLETE, invalidating its memory registration, and an RDMA
// READ still running against it would fail and end the connection; and
// a write the initiator was told is aborted must not land after that.
// Commands already answered (their SRP_RSP posted) are past aborting.
//
// ABORT TASK SET and CLEAR TASK SET act on the task set of the I_T
// nexus (the control mode page says TST 001b, a task set per nexus),
// and a nexus of ib_srp has several channels (ch_count), each a
// connection with a core of its own: the function aborts its own
// channel's commands of the unit, and asks the shell
// (actions.srpAborts) to have the nexus's other channels abort theirs
// (srpPeerAbort); it is answered once they all report that theirs have
// stopped (srpPeersDone). Their credits come back in the next SRP_RSP
// of their own channel, whose request limit they are part of, or in an
// SRP_CRED_REQ when it has none to send (core_srp_credit.go).
//
// A LOGICAL UNIT RESET aborts every task set of the unit (SAM-5 6.3.3,
// 7.7): the shell carries it to every channel of every SRP nexus, and
// those of another nexus that have the unit (the same volume) abort
// their commands of it too; the reset is answered once they stopped as
// well, so a write another host had running cannot land after the
// requester was told the unit is reset. It also raises BUS DEVICE RESET
// FUNCTION OCCURRED on the unit for every other nexus. Another nexus's
// host did not ask for the abort and is still waiting for its commands:
// with TAS set in the control mode page (SAM-5 5.6, SPC-4 7.5.8), each
// gets an SRP_RSP with status TASK ABORTED once it stopped, which Linux
// retries at once (scsi_decide_disposition), where without a status it
// would wait for its command timeout and an ABORT TASK; the retry then
// hears of the reset through the unit attention. LIO does the same with
// its default emulate_tas. The requester's own commands still get no
// SRP_RSP: TAS is about other nexuses' commands, and ib_srp completed
// them itself when it sent the reset (srp_reset_device).

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// srpTaskMgmt carries out the SRP_TSK_MGMT tm that slot s holds: ABORT
// TASK (the command tagged TaskTag, if it is on the LUN and not
// answered: ib_srp sends it on the command's channel), ABORT TASK SET
// and CLEAR TASK SET (every unanswered command of the LUN on every
// channel of the I_T nexus; SRP's task sets are per I_T nexus, and this
// target shares none across nexuses), LOGICAL UNIT RESET (the same on
// every nexus that has the unit, and the reset unit attention for the
// other nexuses; the unit has no other state to reset). The answer is
// FUNCTION COMPLETE once the aborted commands stopped, also when there
// was nothing to abort (SAM-5 7.2: an ABORT TASK for a task that does
// not exist completes); CLEAR ACA and unknown functions are FUNCTION NOT
// SUPPORTED, a LUN field that addresses no LUN is INVALID IU.
func (c *core) srpTaskMgmt(s *slot, tm *srp.TaskMgmt) {
	s.srp.tag, s.srp.tmf = tm.Tag, true
	lun, err := scsi.DecodeLUN(tm.LUN)
	switch {
	case err != nil:
		s.srp.resp[3] = srp.TaskInvalidIU
	case tm.Function == srp.TaskAbortTask, tm.Function == srp.TaskAbortTaskSet,
		tm.Function == srp.TaskClearTaskSet, tm.Function == srp.TaskLUNReset:
		for i := range c.slots {
			x := &c.slots[i]
			if x == s || !c.srpAbortable(x, lun) || (tm.Function == srp.TaskAbortTask && x.srp.tag != tm.TaskTag) {
				continue
			}
			x.srp.aborted, x.srp.abortBy = true, s.idx
			s.srp.waiting++
			if c.p.trace != nil {
				c.p.trace(fmt.Sprintf("%s tag=%d aborts slot %d tag=%d in %s", tm.Function, tm.Tag, x.idx, x.srp.tag, x.state))
			}
		}
		s.srp.resp[3] = srp.TaskComplete
		u := c.srpUnitOf(lun)
		ev := srpTaskMgmtEvent{fn: tm.Function, lun: lun, tag: tm.Tag, aborted: s.srp.waiting}
		if u != nil {
			ev.volume = u.name
		}
		c.acts.taskMgmt = append(c.acts.taskMgmt, ev)
		if u != nil && tm.Function != srp.TaskAbortTask {
			// One more to wait for: the nexus's other channels, and for
			// a reset those of every other nexus.
			reset := tm.Function == srp.TaskLUNReset
			s.srp.peers = true
			s.srp.waiting++
			c.acts.srpAborts = append(c.acts.srpAborts, srpNexusAbort{slot: s.idx, unit: u, reset: reset})
			if reset {
				n := u.nx.resetOthers(u.name)
				if c.p.trace != nil {
					c.p.trace(fmt.Sprintf("%s tag=%d: unit attention reset-occurred on %d other I_T nexuses", tm.Function, tm.Tag, n))
				}
			}
		}
		if s.srp.waiting > 0 {
			return // answered by srpAbortDone when the last one stops
		}
	default:
		s.srp.resp[3] = srp.TaskNotSupported
	}
	c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
}

// srpTagInUse reports whether a request of the channel not yet answered
// (slot.holdsTag) other than s's carries s's tag: a command, or a task
// management function waiting for the commands it aborted. Tags are
// compared within a channel only, where the core sees them; ib_srp's
// carry the channel's hardware queue (blk_mq_unique_tag), so they never
// meet across channels anyway.
func (c *core) srpTagInUse(s *slot) bool {
	for i := range c.slots {
		if x := &c.slots[i]; x != s && x.srp.tag == s.srp.tag && x.holdsTag() {
			return true
		}
	}
	return false
}

// srpReplayed ends the connection over the SRP_CMD in slot s, whose tag
// is in use (srpTagInUse), on a device that replays requests at ERR
// (coreParams.replays). There the command is a copy of one in flight,
// which the device carries out again as the QP enters ERR, not an
// initiator's overlapped command: srpOverlapped would abort the commands
// of the nexus's other channels as SAM-5 5.9.4 says, and its answer,
// the one word that tells the initiator so, goes out on this QP, which
// is in ERR; those channels' commands would wait out the initiator's
// I/O timeout. The channel is ending anyway: its commands end with it,
// as on any lost connection, and none of the copies runs.
func (c *core) srpReplayed(s *slot) {
	c.close(fmt.Sprintf("SRP_CMD under tag %#x of a command in flight: a copy the device replayed as its QP entered ERR", s.srp.tag), false)
}

// srpOverlapped answers the SRP_CMD in slot s, whose tag is in use
// (srpTagInUse): an overlapped command (SAM-5 5.9.4). Two commands
// under one tag would get two SRP_RSPs the initiator cannot tell apart,
// and an initiator that sends one has lost track of its tags; SAM-5
// has the task router abort every command of the I_T nexus and the
// device server answer the new one CHECK CONDITION, ABORTED COMMAND,
// OVERLAPPED COMMANDS ATTEMPTED. The new command never runs. The
// nexus's commands are aborted as ABORT TASK SET aborts a unit's, on
// every unit: this channel's here, the other channels' through the
// shell (srpNexusAbort with no unit); the aborted get no SRP_RSP, and
// the answer waits until they stopped, so that a write the initiator
// retries cannot meet the one it overlapped. Neither ib_srpt nor LIO
// looks for overlapped commands; ib_srp never sends one. A NIC that
// replays receives at ERR makes them (transport.Quirks.ReplayOnErr), and
// srpReplayed takes those.
func (c *core) srpOverlapped(s *slot) {
	s.srp.overlap = true
	for i := range c.slots {
		x := &c.slots[i]
		if x == s || !srpRunning(x) {
			continue
		}
		x.srp.aborted, x.srp.abortBy = true, s.idx
		s.srp.waiting++
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("overlapped command tag=%d aborts slot %d tag=%d in %s", s.srp.tag, x.idx, x.srp.tag, x.state))
		}
	}
	c.acts.taskMgmt = append(c.acts.taskMgmt, srpTaskMgmtEvent{tag: s.srp.tag, aborted: s.srp.waiting, overlap: true})
	s.srp.peers = true
	s.srp.waiting++
	c.acts.srpAborts = append(c.acts.srpAborts, srpNexusAbort{slot: s.idx})
}

// srpAbortsDone answers the request in slot s once every command it
// aborted has stopped: a task management function with its response
// (FUNCTION COMPLETE), an overlapped command with its CHECK CONDITION.
func (c *core) srpAbortsDone(s *slot) {
	if s.srp.overlap {
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseOverlapped)
		return
	}
	c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
}

// srpAbortable reports whether slot x holds a command of lun that is
// not answered yet and can still be aborted: its data-out on the way or
// its volume job running.
func (c *core) srpAbortable(x *slot, lun uint16) bool {
	return x.srp.lun == lun && srpRunning(x)
}

// srpRunning reports whether slot x holds a command that is not
// answered yet and can still be aborted.
func srpRunning(x *slot) bool {
	return !x.srp.tmf && !x.srp.aborted && !x.busy &&
		(x.state == slotFetchingTable || x.state == slotReadingData || x.state == slotBackend ||
			x.state == slotWritingData && x.srp.pushing) // a long data-in between rounds
}

// srpUnitOf is the nexus's unit behind LUN lun of the session, nil when
// the LUN has no volume.
func (c *core) srpUnitOf(lun uint16) *srpUnit {
	if int(lun) < len(c.srp.luns) && c.srp.luns[lun].ov != nil {
		return c.srp.luns[lun].unit
	}
	return nil
}

// srpNexusAbort asks the shell to have the other channels of the I_T
// nexus abort their commands of unit, or of every unit when unit is nil
// (srpPeerAbort), and for a LOGICAL UNIT RESET (reset) every channel of
// every other SRP nexus too, then report to this channel's task
// management function, or overlapped command, in slot (srpPeersDone).
type srpNexusAbort struct {
	slot  int32
	unit  *srpUnit
	reset bool
}

// srpPeerAbort is a task management function of another channel,
// acting on this channel's commands: how many of them have not stopped,
// and the shell's token to hand back when none is left.
type srpPeerAbort struct {
	waiting int
	token   any
}

// srpPeerAbort aborts this channel's commands of unit (of every unit
// when unit is nil: another channel's overlapped command) for a task
// management function received on another channel: of the same nexus
// (this channel's unit is unit), or for a LOGICAL UNIT RESET (reset) of
// another nexus, whose unit of the same volume this channel's is; those
// get TASK ABORTED once they stop (srpAbortDone). The shell's token
// comes back in actions.peerAborted once they all stopped (at once when
// there were none, or the connection is closed).
func (c *core) srpPeerAbort(unit *srpUnit, reset bool, token any) {
	pa := &srpPeerAbort{token: token}
	others := 0 // another nexus's commands, answered TASK ABORTED
	if c.srp != nil && c.state != connClosed {
		for i := range c.slots {
			x := &c.slots[i]
			if !srpRunning(x) {
				continue
			}
			u := c.srpUnitOf(x.srp.lun)
			other := unit != nil && u != nil && u != unit && reset && u.name == unit.name
			if unit != nil && u != unit && !other {
				continue
			}
			x.srp.aborted, x.srp.peer, x.srp.tas = true, pa, other
			pa.waiting++
			if other {
				others++
			}
			if c.p.trace != nil {
				who := "another channel's task management"
				if unit == nil {
					who = "another channel's overlapped command"
				}
				if other {
					who = "another I_T nexus's LOGICAL UNIT RESET"
				}
				c.p.trace(fmt.Sprintf("%s aborts slot %d tag=%d in %s", who, x.idx, x.srp.tag, x.state))
			}
		}
	}
	if others > 0 {
		c.acts.taskMgmt = append(c.acts.taskMgmt, srpTaskMgmtEvent{fn: srp.TaskLUNReset, volume: unit.name,
			aborted: others, peer: true})
	}
	if pa.waiting == 0 {
		c.acts.peerAborted = append(c.acts.peerAborted, token)
	}
}

// srpTaskMgmtEvent is a task management function for the shell to log,
// as LIO logs each ABORT_TASK and LUN_RESET: one received on this
// channel (aborted counts its commands aborted here), (peer) another
// I_T nexus's LOGICAL UNIT RESET that aborted commands of volume here,
// which are answered TASK ABORTED, or (overlap) an overlapped command
// under tag, which aborted the nexus's commands.
type srpTaskMgmtEvent struct {
	fn      srp.TaskFunc
	lun     uint16
	tag     uint64
	volume  string // "" for a LUN that addresses no volume
	aborted int
	peer    bool
	overlap bool
}

// srpPeersDone goes on with the task management function, or the
// overlapped command, in slot idx once the nexus's other channels
// aborted their commands: it is answered if its own channel's have
// stopped too.
func (c *core) srpPeersDone(idx int32) {
	if c.state == connClosed || idx < 0 || int(idx) >= len(c.slots) {
		return
	}
	s := &c.slots[idx]
	if !(s.srp.tmf || s.srp.overlap) || !s.srp.peers {
		return
	}
	s.srp.peers = false
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("slot %d tag=%d: the other channels' commands stopped", s.idx, s.srp.tag))
	}
	if s.srp.waiting--; s.srp.waiting == 0 {
		c.srpAbortsDone(s)
	}
}

// srpPeersClosed hands back, in actions.peerAborted, the token of every
// other channel's task management function still waiting for this
// channel's commands: the connection ended, and they will not stop
// later than its teardown (the shell calls it after the last job).
func (c *core) srpPeersClosed() {
	for i := range c.slots {
		if pa := c.slots[i].srp.peer; pa != nil && pa.waiting > 0 {
			pa.waiting = 0
			c.acts.peerAborted = append(c.acts.peerAborted, pa.token)
		}
	}
}

// srpAbortDone retires an aborted command whose RDMA READs or volume job
// finished: no SRP_RSP, its credit owed to the next one (or to an
// SRP_CRED_REQ when none is coming, core_srp_credit.go), its slot free;
// the last of a task management function's commands lets it answer. A
// command another nexus's reset aborted is answered TASK ABORTED
// instead (TAS), its credit in that SRP_RSP.
func (c *core) srpAbortDone(s *slot) {
	if pa := s.srp.peer; pa != nil && s.srp.tas && c.state != connClosed {
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("slot %d tag=%d aborted by another I_T nexus: TASK ABORTED", s.idx, s.srp.tag))
		}
		c.srpAnswer(s, scsi.StatusTaskAborted, scsi.SenseNone)
		if pa.waiting--; pa.waiting == 0 {
			c.acts.peerAborted = append(c.acts.peerAborted, pa.token)
		}
		return
	}
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("slot %d tag=%d aborted, no response", s.idx, s.srp.tag))
	}
	c.outstanding--
	c.srp.owed++
	defer c.srpReturnCredits() // if no SRP_RSP is coming to carry the credit
	if pa := s.srp.peer; pa != nil {
		c.freeSlot(s) // may reuse s at once
		if pa.waiting--; pa.waiting == 0 {
			c.acts.peerAborted = append(c.acts.peerAborted, pa.token)
		}
		return
	}
	tmf := &c.slots[s.srp.abortBy]
	c.freeSlot(s)
	if tmf.srp.waiting--; tmf.srp.waiting == 0 && c.state != connClosed {
		c.srpAbortsDone(tmf)
	}
}
