package initiator

// The core's SRP mode: the same slots, credits, registration pool and
// completion-gated rules as gosrp's protocol, with SRP_CMD and SRP_RSP
// (package internal/srp) in place of gosrp's IUs. What differs:
//
//   - every request is a SCSI command (READ(16), WRITE(16), SYNCHRONIZE
//     CACHE(16), UNMAP, or the session's own discovery commands) for the
//     LUN that is the volume's handle;
//   - SRP has no remote invalidation (SRP r16a; ib_srp invalidates in
//     srp_unmap_data), so every registered I/O ends with a signaled
//     LOCAL_INV after its SRP_RSP, and an SRP_RSP that arrives with an
//     invalidation ends the connection: the target is never trusted to
//     invalidate;
//   - the target may ask for things itself: SRP_CRED_REQ and SRP_AER_REQ
//     are answered SRP_CRED_RSP and SRP_AER_RSP (SRP r16a 6.10-6.13),
//     SRP_T_LOGOUT ends the connection.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// idAnswer tags the SEND of an answer to a target request; the low bits
// are the receive buffer it was written into and is sent from.
const idAnswer = 0xE3

// srpImmOffset is where immediate data starts in an SRP_CMD: 68, as
// ib_srp puts it (SRP_IMM_DATA_OFFSET: a 48-byte SRP_CMD, 16 bytes of
// additional CDB and the 4-byte immediate descriptor), the offset
// ib_srpt and srpd accept.
const srpImmOffset = 68

// SCSI operation codes the initiator sends (SBC-3, SPC-4).
const (
	scsiInquiry     = 0x12
	scsiModeSense6  = 0x1A
	scsiUnmap       = 0x42
	scsiRead16      = 0x88
	scsiWrite16     = 0x8A
	scsiSyncCache16 = 0x91
	scsiServiceIn16 = 0x9E // READ CAPACITY(16) is its service action 0x10
	scsiReportLUNs  = 0xA0
	// MAINTENANCE IN and OUT: REPORT and SET TARGET PORT GROUPS are
	// their service action 0Ah (SPC-4 6.27, 6.37).
	scsiMaintenanceIn  = 0xA3
	scsiMaintenanceOut = 0xA4
	saPortGroups       = 0x0A
	// Asymmetric access states a target port group reports (SPC-4
	// 6.27).
	aluaActiveOptimized    = 0x0
	aluaActiveNonOptimized = 0x1
	unmapParamLen          = scsi.UnmapHeaderLen + scsi.UnmapDescriptorLen
	senseKeyUnitAttn       = 0x6
)

// scsiCmd is a SCSI command the session sends itself (discovery, SET
// TARGET PORT GROUPS): a CDB for a LUN, its data-in going to the
// request's Buf, or its data-out taken from it; got is how much data-in
// the target transferred.
type scsiCmd struct {
	lun uint16
	cdb []byte
	got int
	// out says the request's Buf is the command's data-out (a parameter
	// list), not room for its data-in.
	out bool
}

// name names the command in an error: its operation code and, for the
// codes that take one, service action (SPC-4 4.2.5.1). "" for a
// volume's I/O (c nil), which its Op names.
func (c *scsiCmd) name() string {
	switch {
	case c == nil || len(c.cdb) == 0:
		return ""
	case len(c.cdb) > 1 && (c.cdb[0] == scsiMaintenanceIn || c.cdb[0] == scsiMaintenanceOut || c.cdb[0] == scsiServiceIn16 ||
		c.cdb[0] == scsiPersistIn || c.cdb[0] == scsiPersistOut):
		return fmt.Sprintf("SCSI command %#02x/%#02x", c.cdb[0], c.cdb[1]&0x1f)
	}
	return fmt.Sprintf("SCSI command %#02x", c.cdb[0])
}

// srpCore is the core's SRP state.
type srpCore struct {
	cmd srp.Cmd
	rsp srp.Rsp
	cdb [16]byte
	// res is each slot's outcome, set when its SRP_RSP arrives.
	res []srpResult
	// answers are receive buffers holding an answer to a target request
	// that is still to be posted; the buffer is reposted when its SEND
	// completes.
	answers []int
	sge     []transport.SGE // per receive buffer, the answer's SGE
	// starving reports that a tick found no credit and no command whose
	// SRP_RSP could return one, since starvedAt.
	starving  bool
	starvedAt int64
}

type srpResult struct {
	err error // nil: GOOD, the whole transfer moved
	got int   // data-in bytes moved
	ua  bool  // CHECK CONDITION, UNIT ATTENTION
	// aborted: TASK ABORTED, another I_T nexus's task management (a
	// LOGICAL UNIT RESET) aborted the command (SAM-5 5.6, TAS).
	aborted bool
	// busy: BUSY or TASK SET FULL, the target cannot take the command
	// now (SAM-5 5.3): a draining srpd answers BUSY, LIO a full queue
	// TASK SET FULL.
	busy bool
}

func newSRPCore(slots, recvs int) *srpCore {
	return &srpCore{
		res:     make([]srpResult, slots),
		answers: make([]int, 0, recvs),
		sge:     make([]transport.SGE, recvs),
	}
}

// startSRP is start for an SRP session: r becomes an SRP_CMD on a free
// slot (the caller checked canStart).
func (c *core) startSRP(r *Request, now int64) bool {
	s := c.srp
	si := c.free[len(c.free)-1]
	sl := &c.slots[si]
	tag := uint64(si) | uint64(sl.gen+1)<<32
	cmd := &s.cmd
	*cmd = srp.Cmd{Tag: tag}
	var lun uint16
	var out, in bool // the direction of the data, if any
	n := 0           // its length
	bounceOnly := false
	switch {
	case r.Op == opControl:
		if r.ctrl != nil && r.ctrl.Op == wire.ControlClose {
			// SRP opens nothing: a LUN is there for the whole login.
			delete(c.handles, r.vol)
			c.finish(r, nil)
			return true
		}
		c.finish(r, fmt.Errorf("initiator: a gosrp control request on an SRP session: %w", errors.ErrUnsupported))
		return true
	case r.scsi != nil:
		lun, cmd.CDB = r.scsi.lun, r.scsi.cdb
		n = len(r.Buf)
		in, out = n > 0 && !r.scsi.out, n > 0 && r.scsi.out
	default:
		h, ok := c.handles[r.vol]
		if !ok {
			c.finish(r, fmt.Errorf("initiator: volume %q is not open on channel %d: %w", r.vol.name, c.p.id, ErrClosed))
			return true
		}
		lun = uint16(h)
		cdb := s.cdb[:]
		clear(cdb)
		bs := int64(r.vol.bs)
		lba, blocks := uint64(r.Offset/bs), uint32(r.length()/bs)
		switch r.Op {
		case OpRead, OpWrite:
			cdb[0] = scsiRead16
			if r.Op == OpWrite {
				cdb[0] = scsiWrite16
				if r.FUA {
					cdb[1] = 0x08 // FUA (SBC-3 5.40)
				}
			}
			be.PutUint64(cdb[2:], lba)
			be.PutUint32(cdb[10:], blocks)
			in, out, n = r.Op == OpRead, r.Op == OpWrite, len(r.Buf)
		case OpFlush:
			// LBA 0 and 0 blocks: the whole medium (SBC-3 5.23).
			cdb[0] = scsiSyncCache16
		case OpDiscard:
			if r.vol.caps&wire.CapDiscard == 0 {
				c.finish(r, fmt.Errorf("initiator: discard on %q: the LUN does not report UNMAP (VPD B2 LBPU): %w", r.vol.name, errors.ErrUnsupported))
				return true
			}
			// UNMAP (SBC-3 5.28) with one block descriptor, its parameter
			// list staged in the slot's bounce buffer.
			cdb = cdb[:10]
			cdb[0] = scsiUnmap
			be.PutUint16(cdb[7:], unmapParamLen)
			p := c.p.data[sl.bounce : sl.bounce+unmapParamLen]
			clear(p)
			be.PutUint16(p[0:], unmapParamLen-2)
			be.PutUint16(p[2:], scsi.UnmapDescriptorLen)
			be.PutUint64(p[8:], lba)
			be.PutUint32(p[16:], blocks)
			out, n, bounceOnly = true, unmapParamLen, true
		default:
			c.finish(r, fmt.Errorf("initiator: %s on %q over SRP: %w", r.Op, r.vol.name, errors.ErrUnsupported))
			return true
		}
		cmd.CDB = cdb
	}
	if c.room() < 2+c.pool.FenceLen() {
		return false
	}
	cmd.LUN = scsi.EncodeLUN(lun)
	nsge := 1
	var reg frmr.Reg
	hasReg := false
	if n > 0 {
		var seg frmr.Segment
		zc := false
		if !bounceOnly && r.scsi == nil {
			seg, zc = c.p.zeroCopy(r.Buf)
		}
		if !zc {
			seg = frmr.Segment{Arena: c.p.dataArena, Off: sl.bounce, Len: n, Base: sl.base}
		}
		if out && n <= c.maxImm {
			// Immediate data (SRP-2): gathered through a local key, no
			// key exposed, nothing to invalidate.
			cmd.DataOut = srp.DataBuffer{Format: srp.FormatImmediate, Total: uint32(n), Imm: c.p.data[seg.Off : seg.Off+n]}
			sl.sge[1] = transport.SGE{Addr: c.p.dataAddr + uint64(seg.Off), Length: uint32(n), LKey: c.p.dataLKey}
			nsge = 2
		} else {
			var ok bool
			if reg, ok = c.register(seg, in); !ok {
				return false
			}
			hasReg = true
			d := srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: reg.IOVA(), Key: uint32(reg.RKey()), Len: uint32(n)}}
			if in {
				cmd.DataIn = d
			} else {
				cmd.DataOut = d
			}
		}
		if !zc && out && !bounceOnly && !c.bounceIn(r, sl, reg, hasReg) {
			return true // abandoned: drop it
		}
	}
	sendBuf := c.p.msg[sl.sendOff : sl.sendOff+sendIU]
	iuLen, err := cmd.Encode(sendBuf)
	if err != nil {
		if hasReg {
			c.pool.Cancel(reg)
		}
		c.finish(r, fmt.Errorf("initiator: encode SRP_CMD: %w", err))
		return true
	}
	if nsge == 2 {
		// The data follows the IU at the offset the login agreed, the
		// gap zeroed (ib_srp's srp_queuecommand pads the same way).
		clear(sendBuf[iuLen:srpImmOffset])
		iuLen = srpImmOffset
	}
	if r.scsi != nil {
		r.scsi.got = 0
	}
	c.stage(si, r, reg, hasReg, iuLen, nsge, now)
	return true
}

// onRecvSRP is onRecv for an SRP session: an SRP_RSP completes its slot's
// command; target requests are answered; anything else ends the
// connection.
func (c *core) onRecvSRP(wc *transport.WC) {
	s := c.srp
	idx := int(wc.ID & 0xffffff)
	if idx >= len(c.p.recvWRs) || int(wc.ByteLen) > recvIU {
		c.fail(fmt.Errorf("initiator: receive %#x of %d bytes: %w", wc.ID, wc.ByteLen, ErrProtocol))
		return
	}
	if wc.Flags&transport.WCWithInv != 0 {
		c.fail(fmt.Errorf("initiator: SRP target sent an IU with invalidation of %s, which SRP does not have: %w", wc.InvalidatedKey, ErrProtocol))
		return
	}
	b := c.p.msg[idx*recvIU : idx*recvIU+int(wc.ByteLen)]
	op, err := srp.PeekOpcode(b)
	if err != nil {
		c.fail(fmt.Errorf("%w: %w", ErrProtocol, err))
		return
	}
	switch op {
	case srp.OpRsp:
		if err = s.rsp.Decode(b); err == nil {
			c.srpResponse(idx, &s.rsp)
		}
	case srp.OpCredReq:
		var q srp.CredReq
		if err = q.Decode(b); err == nil {
			c.srpAnswer(idx, srp.OpCredRsp, q.Tag, q.ReqLimDelta)
		}
	case srp.OpAERReq:
		// ib_srp logs the event and goes on (srp_process_aer_req); so
		// does this initiator, whose next command sees any unit
		// attention the event stands for.
		var q srp.AERReq
		if err = q.Decode(b); err == nil {
			c.srpAnswer(idx, srp.OpAERRsp, q.Tag, q.ReqLimDelta)
		}
	case srp.OpTLogout:
		var l srp.TLogout
		if err = l.Decode(b); err == nil {
			c.fail(fmt.Errorf("initiator: target logged the channel out (SRP_T_LOGOUT, reason %#x): %w", l.Reason, transport.ErrDisconnected))
		}
	default:
		err = fmt.Errorf("unexpected %s from the SRP target", op)
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: %w", ErrProtocol, err))
	}
}

// srpResponse takes the SRP_RSP that arrived in receive buffer idx.
func (c *core) srpResponse(idx int, rsp *srp.Rsp) {
	si := int(rsp.Tag & 0xffffffff)
	if si >= len(c.slots) || c.slots[si].state != slotSent || c.slots[si].gen != uint32(rsp.Tag>>32) {
		c.fail(fmt.Errorf("initiator: SRP_RSP for tag %#x, which names no command in flight: %w", rsp.Tag, ErrProtocol))
		return
	}
	sl := &c.slots[si]
	res, err := c.srpOutcome(sl.req, rsp)
	if err != nil {
		c.fail(err)
		return
	}
	c.srp.res[si] = res
	c.avail = min(c.avail+int(min(rsp.ReqLimDelta, uint32(c.credits))), c.credits)
	c.acts.recv = append(c.acts.recv, c.p.recvWRs[idx])
	sl.state = slotResponded
	if sl.hasReg && !c.stageInvalidate(si) {
		c.invPending = append(c.invPending, si)
	}
	if !c.up {
		return
	}
	c.waiting = append(c.waiting, si)
	c.finishWaiting()
}

// srpOutcome judges an SRP_RSP for request r: the command's result, or
// an error that ends the connection (residuals that cannot be).
func (c *core) srpOutcome(r *Request, rsp *srp.Rsp) (srpResult, error) {
	n := uint32(r.length())
	in := r.Op == OpRead
	if r.scsi != nil {
		n = uint32(len(r.Buf))
	}
	switch {
	case r.Op == OpFlush || (r.Op == OpDiscard && r.scsi == nil):
		if r.Op == OpDiscard {
			n = unmapParamLen
		} else {
			n = 0
		}
	}
	var res srpResult
	// A residual counts bytes of a transfer that was asked for (SRP r16a
	// 6.9); one in the direction the command moves nothing is a lie
	// about what was moved, so nothing else the SRP_RSP says is trusted.
	switch {
	case !in && rsp.Flags&(srp.DIUnder|srp.DIOver) != 0 && rsp.DataInResid != 0:
		return res, fmt.Errorf("initiator: SRP_RSP of a %s claims a data-in residual of %d (flags %#x), but it moves no data in: %w", r.Op, rsp.DataInResid, rsp.Flags, ErrProtocol)
	case in && rsp.Flags&(srp.DOUnder|srp.DOOver) != 0 && rsp.DataOutResid != 0:
		return res, fmt.Errorf("initiator: SRP_RSP of a %s claims a data-out residual of %d (flags %#x), but it moves no data out: %w", r.Op, rsp.DataOutResid, rsp.Flags, ErrProtocol)
	}
	if rsp.Flags&(srp.DIUnder|srp.DIOver) != 0 && rsp.DataInResid > n ||
		rsp.Flags&(srp.DOUnder|srp.DOOver) != 0 && rsp.DataOutResid > n {
		return res, fmt.Errorf("initiator: SRP_RSP residuals %d in, %d out for a %d-byte transfer: %w", rsp.DataInResid, rsp.DataOutResid, n, ErrProtocol)
	}
	if rsp.Status != uint8(scsi.StatusGood) {
		st := SCSIStatus(rsp.Status)
		if st != SCSIStatusCheckCondition || len(rsp.Sense) == 0 {
			res.aborted = st == SCSIStatusTaskAborted
			res.busy = st == SCSIStatusBusy || st == SCSIStatusTaskSetFull
			res.err = &SCSIError{Op: r.Op, Status: st, cmd: r.scsi.name()}
			return res, nil
		}
		sn, err := scsi.ParseSense(rsp.Sense)
		if err != nil {
			res.err = &SCSIError{Op: r.Op, Status: st, cmd: r.scsi.name()}
			return res, nil
		}
		res.ua = sn.Key == senseKeyUnitAttn
		res.err = &SCSIError{Op: r.Op, Status: st, Key: uint8(sn.Key), ASC: sn.ASC, ASCQ: sn.ASCQ, cmd: r.scsi.name()}
		return res, nil
	}
	res.got = int(n)
	if in {
		switch {
		case rsp.Flags&srp.DIUnder != 0:
			res.got = int(n - rsp.DataInResid)
		case rsp.Flags&srp.DIOver != 0 && r.scsi == nil:
			res.err = fmt.Errorf("initiator: %s of %d bytes: the target had %d bytes more to send: %w", r.Op, n, rsp.DataInResid, ErrShortTransfer)
		}
		if r.scsi == nil && res.got < int(n) {
			res.err = fmt.Errorf("initiator: %s of %d bytes: the target moved %d: %w", r.Op, n, res.got, ErrShortTransfer)
		}
	} else if rsp.Flags&(srp.DOUnder|srp.DOOver) != 0 && rsp.DataOutResid != 0 {
		res.err = fmt.Errorf("initiator: %s of %d bytes: data-out residual %d: %w", r.Op, n, rsp.DataOutResid, ErrShortTransfer)
	}
	return res, nil
}

// completeSRP is complete for an SRP session. A command answered UNIT
// ATTENTION or TASK ABORTED did not do what it asked, and is re-issued
// at once: a UNIT ATTENTION (a reset, a capacity or LUN inventory
// change) is reported once per I_T nexus and condition (SAM-5 5.14), and
// TASK ABORTED means another host's LOGICAL UNIT RESET aborted the
// command (SAM-5 6.3.3, TAS), whose re-issue then hears of the reset as
// a UNIT ATTENTION; Linux retries both (scsi_decide_disposition). BUSY
// and TASK SET FULL say the target cannot take the command now (a
// draining srpd, a full queue): it is re-issued after the next tick,
// nothing else staged meanwhile (retryLater), as Linux requeues it. The
// bound is the command's time, not a count: another host that resets the
// unit as fast as it can aborts every try, and a count it can exhaust
// would turn its flood into this host's I/O errors. A command still
// answered so Config.IOTimeout after it was first sent ends with the
// last answer (retryExpired), so one aborted forever does not loop
// forever.
func (c *core) completeSRP(si int) {
	sl := &c.slots[si]
	r := sl.req
	res := c.srp.res[si]
	c.srp.res[si] = srpResult{}
	sl.req, sl.hasReg, sl.state = nil, false, slotFree
	c.free = append(c.free, si)
	if res.ua || res.aborted || res.busy {
		c.retryLater(r, si, res.err, res.busy)
		return
	}
	r.retries, r.retryLast = 0, nil
	if r.scsi != nil {
		r.scsi.got = res.got
	}
	c.acts.done = append(c.acts.done, doneIO{req: r, err: res.err, bounce: sl.bounce, rsp: true})
}

// srpAnswer answers a target request in the receive buffer it arrived
// in (16 bytes over the request's own), which is reposted once the
// answer's SEND completed; delta is the credit the request grants.
func (c *core) srpAnswer(idx int, op srp.Opcode, tag uint64, delta uint32) {
	c.avail = min(c.avail+int(min(delta, uint32(c.credits))), c.credits)
	a := srp.TargetRsp{Op: op, Tag: tag}
	n, _ := a.Encode(c.p.msg[idx*recvIU : (idx+1)*recvIU])
	c.srp.sge[idx] = transport.SGE{Addr: c.p.msgAddr + uint64(idx*recvIU), Length: uint32(n), LKey: c.p.msgLKey}
	c.srp.answers = append(c.srp.answers, idx)
	c.srpStageAnswers()
}

// srpStageAnswers stages the answers still to post; false if the send
// queue has no room for all of them yet.
func (c *core) srpStageAnswers() bool {
	s := c.srp
	k := 0
	for ; k < len(s.answers) && c.up && c.room() >= 1; k++ {
		idx := s.answers[k]
		c.acts.send = append(c.acts.send, transport.SendWR{ID: idAnswer<<56 | uint64(idx), Opcode: transport.OpSend,
			Flags: transport.FlagSignaled, SGL: s.sge[idx : idx+1]})
		c.batch = append(c.batch, staged{slot: -1 - idx, end: len(c.acts.send)})
	}
	s.answers = append(s.answers[:0], s.answers[k:]...)
	return len(s.answers) == 0
}

// srpSendDone takes a successful send completion: an answer's receive
// buffer is free to be posted again.
func (c *core) srpSendDone(wc *transport.WC) {
	if wc.ID>>56 == idAnswer {
		if idx := int(wc.ID & 0xffffff); idx < len(c.p.recvWRs) {
			c.acts.recv = append(c.acts.recv, c.p.recvWRs[idx])
		}
	}
}

// srpUnposted takes back an answer PostSend did not accept.
func (c *core) srpUnposted(b staged, n int) {
	if b.end > n {
		c.srp.answers = append(c.srp.answers, -1-b.slot)
	}
}

// srpTick ends a connection starved of credit: the target returned none
// (req_lim_delta 0 in every SRP_RSP, SRP r16a 6.9) and no command is
// outstanding whose SRP_RSP could, so only an SRP_CRED_REQ could bring
// one back. Requests would queue forever; past the I/O timeout the
// connection is ended instead, and the next login grants a fresh request
// limit (ib_srp's queued commands time out and the host resets the same
// way).
func (c *core) srpTick(now int64) {
	s := c.srp
	if c.avail > 0 || !c.idle() {
		s.starving = false
		return
	}
	if !s.starving {
		s.starving, s.starvedAt = true, now
		return
	}
	if d := now - s.starvedAt; d > c.p.ioTimeout {
		c.fail(fmt.Errorf("initiator: SRP target granted no credit (req_lim 0) and none can come back, for %s (I/O timeout %s): %w",
			time.Duration(d).Round(time.Millisecond), time.Duration(c.p.ioTimeout), ErrProtocol))
	}
}

func (s *srpCore) reset() {
	s.answers = s.answers[:0]
	s.starving = false
	clear(s.res)
}

// ErrShortTransfer: an SRP target moved less (or more) data than a
// command asked for and still answered GOOD. The data is not trusted.
var ErrShortTransfer = errors.New("initiator: short transfer")

// SCSIError is an SRP command the target answered with a SCSI status
// other than GOOD: CHECK CONDITION with its sense (key, ASC, ASCQ), or
// BUSY, RESERVATION CONFLICT, TASK SET FULL and the like.
type SCSIError struct {
	Op        Op
	Status    SCSIStatus
	Key       uint8
	ASC, ASCQ uint8

	// cmd names a command the session sent for itself (an INQUIRY, a
	// SET TARGET PORT GROUPS), whose Op says only its direction.
	cmd string
}

func (e *SCSIError) Error() string {
	what := e.cmd
	if what == "" {
		what = e.Op.String()
	}
	if e.Status != SCSIStatusCheckCondition {
		return fmt.Sprintf("initiator: %s: target: SCSI status %s", what, e.Status)
	}
	return fmt.Sprintf("initiator: %s: target: %s", what, scsi.Sense{Key: scsi.SenseKey(e.Key), ASC: e.ASC, ASCQ: e.ASCQ})
}

// sense is the sense data's key, ASC and ASCQ.
func (e *SCSIError) sense() scsi.Sense {
	return scsi.Sense{Key: scsi.SenseKey(e.Key), ASC: e.ASC, ASCQ: e.ASCQ}
}

// Unwrap maps the sense callers act on to the package's sentinels, as
// IOError does: WRITE PROTECTED is ErrReadOnly, ACCESS DENIED
// ErrAccessDenied, SPACE ALLOCATION FAILED ErrNoSpace, INVALID COMMAND
// OPERATION CODE errors.ErrUnsupported, LBA OUT OF RANGE ErrInvalid,
// TARGET PORT IN STANDBY STATE and IN UNAVAILABLE STATE (a fenced
// gateway) ErrStandby, the status RESERVATION CONFLICT
// ErrReservationConflict, and
// a flush's WRITE ERROR (under HARDWARE or MEDIUM ERROR)
// ErrWriteCacheLost: a target reports so on the
// nexus's first SYNCHRONIZE CACHE after it lost acknowledged writes
// (srpd does after a restart, scsi.WriteCacheLost).
func (e *SCSIError) Unwrap() error {
	if e.Status == SCSIStatusReservationConflict {
		return ErrReservationConflict
	}
	s := e.sense()
	if (s == scsi.SenseCacheLost || s == scsi.SenseWriteError) && e.Op == OpFlush {
		// srpd reports a lost cache under HARDWARE ERROR
		// (scsi.SenseCacheLost); another target's flush that failed
		// to write its cache out lost it as surely.
		return ErrWriteCacheLost
	}
	switch s {
	case scsi.SenseWriteProtected:
		return ErrReadOnly
	case scsi.SenseAccessDenied:
		return ErrAccessDenied
	case scsi.SenseSpaceAllocFailed:
		return ErrNoSpace
	case scsi.SenseInvalidOpcode:
		return errors.ErrUnsupported
	case scsi.SenseLBAOutOfRange:
		return ErrInvalid
	case scsi.SenseStandby, scsi.SenseUnavailable:
		return ErrStandby
	}
	return nil
}

// be is SCSI's and SRP's byte order.
var be = binary.BigEndian
