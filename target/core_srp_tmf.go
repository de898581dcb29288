package target

// SRP task management (SRP r16a 6.7, SAM-5 7): what an SRP_TSK_MGMT
// does to the channel's commands, in the pure core.
//
// A command is aborted in one of three places: waiting for the RDMA READ
// of its indirect table or of its data-out (not started: its volume job
// never runs), or with its
// volume job running (it finishes; a job cannot be called back). Either
// way the aborted command gets no SRP_RSP, as LIO sends none for an
// aborted task without TAS, and ib_srp, which claimed the request before
// it sent the abort (srp_abort, srp_claim_req), would only log a late one
// as "Null scmnd". Its credit comes back in the task management
// response's REQUEST LIMIT DELTA instead (ib_srpt's srpt_aborted_task
// does the same through the next response), or the initiator would lose
// a credit per abort.
//
// The task management response waits until every command it aborted has
// stopped: ib_srp frees an aborted request as soon as the answer says
// FUNCTION COMPLETE, invalidating its memory registration, and an RDMA
// READ still running against it would fail and end the connection; and
// a write the initiator was told is aborted must not land after that.
// Commands already answered (their SRP_RSP posted) are past aborting.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// srpTaskMgmt carries out the SRP_TSK_MGMT tm that slot s holds: ABORT
// TASK (the command tagged TaskTag, if it is on the LUN and not
// answered), ABORT TASK SET and CLEAR TASK SET (every unanswered command
// of the LUN on this channel; SRP's task sets are per I_T nexus, and this
// target shares none across nexuses), LOGICAL UNIT RESET (the same; the
// unit has no other state to reset). The answer is FUNCTION COMPLETE once
// the aborted commands stopped, also when there was nothing to abort
// (SAM-5 7.2: an ABORT TASK for a task that does not exist completes);
// CLEAR ACA and unknown functions are FUNCTION NOT SUPPORTED, a LUN field
// that addresses no LUN is INVALID IU.
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
		if s.srp.waiting > 0 {
			return // answered by srpAbortDone when the last one stops
		}
	default:
		s.srp.resp[3] = srp.TaskNotSupported
	}
	c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
}

// srpAbortable reports whether slot x holds a command of lun that is
// not answered yet and can still be aborted: its data-out on the way or
// its volume job running.
func (c *core) srpAbortable(x *slot, lun uint16) bool {
	return !x.srp.tmf && !x.srp.aborted && !x.busy && x.srp.lun == lun &&
		(x.state == slotFetchingTable || x.state == slotReadingData || x.state == slotBackend)
}

// srpAbortDone retires an aborted command whose RDMA READs or volume job
// finished: no SRP_RSP, its credit owed to the next one, its slot free;
// the last of a task management function's commands lets it answer.
func (c *core) srpAbortDone(s *slot) {
	tmf := &c.slots[s.srp.abortBy]
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("slot %d tag=%d aborted, no response", s.idx, s.srp.tag))
	}
	c.outstanding--
	c.srp.owed++
	c.freeSlot(s)
	if tmf.srp.waiting--; tmf.srp.waiting == 0 && c.state != connClosed {
		c.srpAnswer(tmf, scsi.StatusGood, scsi.SenseNone)
	}
}
