package target

// The core's SRP mode: a connection whose request carried a T10
// SRP_LOGIN_REQ instead of a gosrp hello (docs/srp.md). The login is
// decided here, in the CM exchange; the volumes are the session's LUNs;
// and each SRP_CMD runs through the scsi model onto the same slots, jobs
// and RDMA posting as a gosrp command.

import (
	"encoding/binary"
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

const (
	// srpImmOffset is where ib_srp puts an SRP_CMD's immediate data
	// (srp_imm_data_offset: the 48-byte SRP_CMD, 16 bytes of additional
	// CDB, the 4-byte immediate descriptor); the receive buffers hold it
	// plus maxImmediate.
	srpImmOffset = srp.CmdLen + 16 + srp.ImmHeaderLen
	// srpMinITIU is the smallest initiator IU length a login may ask
	// for: an SRP_CMD with one direct descriptor (ib_srpt's lower bound
	// is 64 too, srpt_cm_req_recv).
	srpMinITIU = 64
	// srpMaxTIIU is the largest IU the target sends: an SRP_RSP with
	// response data and fixed-format sense, with room to spare.
	srpMaxTIIU = 256
	// srpMaxLUNs bounds the LUNs of a session (each is an open volume).
	srpMaxLUNs = maxHandles
	// srpFormats are the buffer formats the target takes.
	srpFormats = srp.BufFormatDirect | srp.BufFormatIndirect
)

// srpSession is what an SRP login established: the I_T nexus, the
// immediate data agreement and the logical units.
type srpSession struct {
	port, tport [16]byte
	// immOffset is where immediate data starts in an SRP_CMD; 0 when the
	// login did not agree to immediate data.
	immOffset int
	// names and access are the LUNs as the login saw the catalog, by LUN
	// number: what the shell opens ("" for none), and how.
	names  []string
	access []Access
	luns   []srpLUN
	// attached are the handles srpAttachLUN made since the shell last
	// took them (srpTakeAttached), to count as writers (countWriters).
	attached []*openVol
	// cmd is the decoding scratch of the request being assigned; tbl
	// that of a long fetched table (core_srp_table.go), made on first use.
	cmd srp.Cmd
	tbl []srp.Descriptor
	// owed is the credits of aborted commands, which got no SRP_RSP:
	// the next SRP_RSP returns them, or an SRP_CRED_REQ (cred) when no
	// SRP_RSP is coming (core_srp_credit.go).
	owed uint32
	cred srpCredit
	// nx is the I_T nexus the channel belongs to, whose unit attention
	// state its channels share (srp_nexus.go); idle is the scratch
	// nexus commands run against while their unit has nothing pending.
	nx   *srpNexus
	idle scsi.Nexus
}

// srpLUN is one logical unit: an open volume, its SCSI model and the
// I_T nexus's state of it, shared with the nexus's other channels.
type srpLUN struct {
	ov   *openVol
	dev  scsi.Device
	unit *srpUnit
	// opening says, with ov nil, that the LUN's volume is still being
	// opened (conn_srp_open.go): its commands are answered NOT READY,
	// becoming ready, which hosts retry, not LOGICAL UNIT NOT SUPPORTED,
	// which they fail.
	opening bool
}

// srpSlot is what a slot holds of an SRP request besides the gosrp
// command the data path runs (slot.cmd: volume offset, length, the
// descriptors of the one direction that moves data).
type srpSlot struct {
	tag uint64
	op  scsi.Op // the block operation, for the sense of its failure
	// decided: the answer was settled before any job (status, sense).
	decided bool
	status  scsi.Status
	sense   scsi.Sense
	// inLen and outLen are the data-in and data-out descriptor totals;
	// flags, inResid and outResid the residuals of a GOOD answer (a
	// failed command moved nothing: its residuals are the totals).
	inLen, outLen     uint32
	flags             uint8
	inResid, outResid uint32
	// tmf: the request was task management; resp is its response data,
	// and waiting counts the commands it aborted that have not stopped
	// (core_srp_tmf.go).
	tmf     bool
	resp    [4]byte
	waiting int
	// overlap: the command came under the tag of one in flight; it
	// waits, as a task management function does, for the commands it
	// aborted (srpOverlapped).
	overlap bool
	// peers: the function waits for the nexus's other channels too
	// (one of waiting); peer is the other channel's function that
	// aborted this command, if one did (core_srp_tmf.go).
	peers bool
	peer  *srpPeerAbort
	// lun is the command's LUN; aborted says a task management function
	// (in slot abortBy) aborted it: it gets no SRP_RSP, unless tas says
	// another I_T nexus's reset did (TASK ABORTED, core_srp_tmf.go).
	lun      uint16
	aborted  bool
	tas      bool
	abortBy  int32
	senseBuf [scsi.FixedSenseLen]byte
	// For UNMAP and WRITE SAME, whose data-out is a parameter list or a
	// pattern block rather than the blocks to write: the unit, the
	// model's Action, and UNMAP's extents (kept across requests, so the
	// slot decodes lists without allocating after its first).
	lu  *srpLUN
	act scsi.Action
	ext []scsi.Extent
	// For an indirect table not wholly inline, fetched by RDMA READ
	// into the slot's data buffer before the command runs (the receive
	// buffer is reposted meanwhile, so the LUN and CDB are kept here):
	// where the table is, how many descriptors it holds, and how many
	// of them rode inline (in slot.cmd.Desc, to check the fetched copy
	// against).
	table  srp.Descriptor
	tableN int
	inline int
	lunRaw srp.LUN
	cdb    [srp.CDBLen + srp.MaxAddCDBLen]byte
	cdbLen int
	// For a table of more than maxDesc descriptors, moved in rounds
	// (core_srp_table.go): the descriptors (nlong of them; the capacity
	// kept across requests), the next to move and its offset in the
	// data buffer, and pushing while a data-in round that is not the
	// last is on the way.
	long    []wire.Descriptor
	nlong   int
	next    int
	off     uint64
	pushing bool
}

// srpClassify says what an IU of an SRP session is: a request that costs
// a credit (SRP_CMD, SRP_TSK_MGMT), a logout, the answer to a target
// request (SRP_CRED_RSP; the target sends no SRP_AER_REQ, so an
// SRP_AER_RSP is never expected), or none of these.
func srpClassify(buf []byte) iuClass {
	switch srp.Opcode(buf[0]) {
	case srp.OpCmd, srp.OpTaskMgmt:
		return iuRequest
	case srp.OpILogout:
		return iuLogout
	case srp.OpCredRsp:
		return iuAnswer
	}
	return iuOther
}

// srpAssign decodes the SRP request in receive buffer idx into slot s,
// reposts the buffer and starts the request. An IU too short to carry
// its tag ends the connection; any other malformed request is answered
// CHECK CONDITION, INVALID FIELD IN CDB (as ib_srpt answers a bad
// descriptor) and touches neither the volume nor the initiator's memory.
func (c *core) srpAssign(s *slot, idx int32, n uint32, at int64) {
	buf := c.recvBuf(idx, n)
	s.start = at
	c.setSlot(s, slotReceived)
	s.busy, s.ov, s.control = false, nil, false
	s.cmd = wire.Command{}
	s.srp = srpSlot{ext: s.srp.ext[:0], long: s.srp.long[:0]}
	defer c.repost(idx) // every use of buf is done within this call
	if srp.Opcode(buf[0]) == srp.OpTaskMgmt {
		var tm srp.TaskMgmt
		if err := tm.Decode(buf); err != nil {
			c.close("malformed SRP_TSK_MGMT: "+err.Error(), true)
			return
		}
		c.srpTaskMgmt(s, &tm)
		return
	}
	cmd := &c.srp.cmd
	if n < srp.CmdLen {
		c.close(fmt.Sprintf("SRP_CMD of %d bytes (at least %d)", n, srp.CmdLen), true)
		return
	}
	s.srp.tag = binary.BigEndian.Uint64(buf[8:]) // SRP is big-endian (SRP r16a 5.1)
	if c.srpTagInUse(s) {
		if c.p.replays {
			c.srpReplayed(s)
			return
		}
		c.srpOverlapped(s)
		return
	}
	if err := cmd.Decode(buf, c.srp.immOffset); err != nil {
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
		return
	}
	if !c.srpDescriptors(s, cmd) {
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
		return
	}
	if c.state == connDraining {
		s.busy = true
		c.srpAnswer(s, scsi.StatusBusy, scsi.SenseNone)
		return
	}
	if s.srp.tableN > 0 {
		c.srpFetchTable(s, cmd)
		return
	}
	c.srpExecute(s, cmd.LUN, cmd.CDB)
}

// srpLUNList is the LUN inventory for REPORT LUNS (nil for any other
// command: the model reads it for REPORT LUNS only).
func (c *core) srpLUNList(cdb []byte) []uint16 {
	if len(cdb) == 0 || cdb[0] != 0xA0 {
		return nil
	}
	var l []uint16
	for i, lu := range c.srp.luns {
		if lu.ov != nil && !lu.ov.revoked {
			l = append(l, uint16(i))
		}
	}
	return l
}

// srpExecute runs the CDB for the LUN through the LUN's model and
// carries out its Action.
func (c *core) srpExecute(s *slot, rawLUN srp.LUN, cdb []byte) {
	var lu *srpLUN
	opening := false
	if lun, err := scsi.DecodeLUN(rawLUN); err == nil {
		s.srp.lun = lun
		if int(lun) < len(c.srp.luns) {
			if x := &c.srp.luns[lun]; x.ov != nil && !x.ov.revoked {
				lu = x
			} else {
				opening = x.opening
			}
		}
	}
	var a scsi.Action
	switch {
	case opening:
		a = scsi.BecomingReady(cdb, c.srpLUNList(cdb))
	case lu == nil:
		a = scsi.NoUnit(cdb, c.srpLUNList(cdb))
	default:
		lu.dev.ReadOnly = lu.ov.ro // a policy change may have narrowed it
		var told bool
		a, told = lu.unit.execute(&lu.dev, &c.srp.idle, cdb, c.srpLUNList(cdb))
		if told {
			c.acts.lossTold = append(c.acts.lossTold, lu.ov.name)
		}
	}
	s.srp.op = a.Op
	if (a.Op == scsi.OpReserveIn || a.Op == scsi.OpReserveOut) && lu.ov.pr == nil {
		a = scsi.Action{Status: scsi.StatusCheckCondition, Sense: scsi.SenseInvalidOpcode} // a target keeping none
	}
	if a.Status != scsi.StatusGood {
		c.srpAnswer(s, a.Status, a.Sense)
		return
	}
	// Reads and flushes are checked against the reservations here, as a
	// gosrp command is at its arrival (neither counts as a write there);
	// writes as they are handed to the store (dispatch).
	if (a.Op == scsi.OpRead || a.Op == scsi.OpFlush) && !c.reservationAllows(lu.ov, wire.OpRead) {
		c.srpAnswer(s, scsi.StatusResvConflict, scsi.SenseNone)
		return
	}
	switch a.Op {
	case scsi.OpNone:
		c.srpDataIn(s, a.Data)
	case scsi.OpFlush:
		s.ov = lu.ov
		s.cmd.Op = wire.OpFlush
		c.dispatch(s, jobFlush)
	case scsi.OpRead:
		n := a.Blocks * lu.dev.BlockSize
		if !c.srpTransfer(s, lu, wire.OpRead, a.LBA, n, s.srp.inLen, srp.DIUnder, &s.srp.inResid) {
			return
		}
		c.dispatch(s, jobRead)
	case scsi.OpWrite:
		if !c.srpTransfer(s, lu, wire.OpWrite, a.LBA, a.DataOut, s.srp.outLen, srp.DOUnder, &s.srp.outResid) {
			return
		}
		if a.FUA {
			s.cmd.Flags |= wire.FlagFUA
		}
		if s.cmd.Flags&wire.FlagImmediate != 0 {
			c.dispatchWrite(s) // the data came with the command
		} else {
			c.postReads(s)
		}
	case scsi.OpReserveIn:
		s.srp.act, s.ov, s.prIni = a, lu.ov, c.initiator
		c.dispatch(s, jobReport)
	case scsi.OpUnmap, scsi.OpWriteSame, scsi.OpSetPortGroups, scsi.OpReserveOut:
		s.srp.lu, s.srp.act = lu, a
		if a.DataOut > c.maxXfer { // an UNMAP list beyond a slot's buffer
			c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
			return
		}
		if a.NoData { // WRITE SAME with NDOB: the block is zeros
			c.srpWriteSame(s, true)
			return
		}
		if !c.srpTransfer(s, lu, wire.OpWrite, 0, a.DataOut, s.srp.outLen, srp.DOUnder, &s.srp.outResid) {
			return
		}
		if s.cmd.Flags&wire.FlagImmediate != 0 {
			c.dispatchWrite(s)
		} else {
			c.postReads(s)
		}
	default:
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidOpcode)
	}
}

// srpMaxWriteSame is the WRITE SAME limit of a unit with blocks of bs
// bytes (VPD 0xB0 MAXIMUM WRITE SAME LENGTH): the model's default, cut
// so that one WRITE SAME's bytes fit the 32-bit length of the job.
func srpMaxWriteSame(bs int64) uint32 {
	return uint32(min(scsi.DefaultMaxWriteSameBlocks, int64(^uint32(0))/bs))
}

// srpFetched goes on with an UNMAP or WRITE SAME once its data-out (the
// parameter list, the pattern block) is in the slot's data buffer:
// dispatchWrite in SRP mode for anything but a WRITE.
func (c *core) srpFetched(s *slot) {
	a := &s.srp.act
	switch a.Op {
	case scsi.OpUnmap:
		ext, res := s.srp.lu.dev.Unmap(s.data[:s.cmd.Length], s.srp.ext[:0])
		s.srp.ext = ext
		if res.Status != scsi.StatusGood {
			c.srpAnswer(s, res.Status, res.Sense)
			return
		}
		if len(ext) == 0 {
			c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
			return
		}
		var n uint64
		for _, e := range ext {
			n += uint64(e.Blocks) * uint64(s.srp.lu.dev.BlockSize)
		}
		s.cmd.Op, s.cmd.Offset, s.cmd.Length = wire.OpDiscard, ext[0].LBA*uint64(s.srp.lu.dev.BlockSize), uint32(min(n, uint64(^uint32(0))))
		c.dispatch(s, jobUnmap)
	case scsi.OpWriteSame:
		c.srpWriteSame(s, allZero(s.data[:s.srp.lu.dev.BlockSize]))
	case scsi.OpSetPortGroups:
		c.srpSetPortGroups(s)
	case scsi.OpReserveOut:
		c.srpReserveOut(s)
	default:
		c.noteBug(fmt.Errorf("target: SRP data-out fetched for %s", a.Op))
		c.close("internal error: "+c.bug.Error(), false)
	}
}

// srpWriteSame runs a WRITE SAME whose block is in the slot's data
// buffer (zero: it is all zeros). A zero block becomes a Discard when
// the CDB set UNMAP and the unit deallocates (SBC-3 5.42: the blocks
// then read as the block did, since deallocated blocks read as zeros)
// and a WriteZeroes otherwise; any other block is repeated in the data
// buffer and written, which bounds such a WRITE SAME to the largest
// transfer (beyond it INVALID FIELD IN CDB: Linux sends only zeros).
func (c *core) srpWriteSame(s *slot, zero bool) {
	a, lu := &s.srp.act, s.srp.lu
	bs := lu.dev.BlockSize
	n := a.Blocks * bs // srpMaxWriteSame keeps it in 32 bits
	s.ov = lu.ov
	s.cmd.Offset, s.cmd.Length, s.cmd.NDesc = a.LBA*uint64(bs), n, 0
	switch {
	case zero && a.Unmap:
		s.cmd.Op = wire.OpDiscard
		c.dispatch(s, jobDiscard)
	case zero:
		s.cmd.Op = wire.OpWriteZeroes
		c.dispatch(s, jobWriteZeroes)
	case n > c.maxXfer:
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
	default:
		for i := bs; i < n; i *= 2 {
			copy(s.data[i:n], s.data[:i])
		}
		s.cmd.Op = wire.OpWrite
		c.dispatch(s, jobWrite)
	}
}

// allZero reports whether b is all zeros.
func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// srpUnmap is a jobUnmap: it discards the slot's UNMAP extents in turn
// (on a worker; the first failure ends it).
func srpUnmap(s *slot) error {
	for _, e := range s.srp.ext {
		if err := s.ov.vol.Discard(int64(e.LBA)*s.ov.bs, int64(e.Blocks)*s.ov.bs); err != nil {
			return fmt.Errorf("unmap %d blocks at LBA %d: %w", e.Blocks, e.LBA, err)
		}
	}
	return nil
}

// srpTransfer makes slot s's gosrp command the block transfer of n
// bytes at lba: the descriptors (of total have bytes) cut to n, the
// residual under set when they describe more. Descriptors that describe
// less than the CDB asks for are refused before any data moves (CHECK
// CONDITION, INVALID FIELD IN CDB): the target never reads or writes
// past what the initiator advertised, and never moves part of a
// transfer. It reports whether the command goes on.
func (c *core) srpTransfer(s *slot, lu *srpLUN, op wire.Op, lba uint64, n, have uint32, under uint8, resid *uint32) bool {
	if n > have {
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
		return false
	}
	if have > n {
		s.srp.flags, *resid = under, have-n
	}
	c.srpTrim(s, n)
	s.ov = lu.ov
	s.cmd.Op, s.cmd.Offset, s.cmd.Length = op, lba*uint64(lu.dev.BlockSize), n
	return true
}

// srpDataIn returns a command's data-in (INQUIRY, READ CAPACITY, ...):
// as much as the descriptors take, by RDMA WRITE ahead of the SRP_RSP,
// with the residual SAM-5 asks for either way (DIUNDER when the
// descriptors were larger, DIOVER when the data was).
func (c *core) srpDataIn(s *slot, data []byte) {
	have := uint32(len(data))
	if have > s.srp.inLen {
		s.srp.flags, s.srp.inResid = srp.DIOver, have-s.srp.inLen
	} else if have < s.srp.inLen {
		s.srp.flags, s.srp.inResid = srp.DIUnder, s.srp.inLen-have
	}
	m := min(have, s.srp.inLen, c.maxXfer)
	if m == 0 {
		c.srpAnswer(s, scsi.StatusGood, scsi.SenseNone)
		return
	}
	copy(s.data, data[:m])
	c.srpTrim(s, m)
	c.respondRead(s)
}

// srpAnswer answers a request whose outcome is settled without a job.
func (c *core) srpAnswer(s *slot, st scsi.Status, sense scsi.Sense) {
	s.srp.decided, s.srp.status, s.srp.sense = true, st, sense
	c.respond(s, wire.StatusGood, wire.SenseNone)
}

// srpRespond encodes the SRP_RSP into the slot's send buffer and appends
// its SEND (SQ space reserved), using sges[k]: postResponse in SRP mode.
// The SCSI status and sense are the settled answer, or the job's outcome
// (st, sense: GOOD, BUSY, or a failure as scsi.FromWire maps it). A plain
// SEND: SRP has no remote invalidation (ib_srp invalidates its own keys).
func (c *core) srpRespond(s *slot, st wire.Status, sense wire.Sense, k int) {
	x := &s.srp
	r := srp.Rsp{Tag: x.tag, ReqLimDelta: 1 + c.srp.owed}
	c.srp.owed = 0
	var sns scsi.Sense
	switch {
	case x.decided:
		r.Status, sns = uint8(x.status), x.sense
	case st == wire.StatusGood:
	case st == wire.StatusBusy:
		r.Status = uint8(scsi.StatusBusy)
	case sense == wire.SenseReservationConflict:
		// A status of its own, with no sense data (SPC-4 5.13.1):
		// Linux fails it as BLK_STS_NEXUS, which dm-multipath does not
		// take for a path failure, where a CHECK CONDITION would be.
		r.Status = uint8(scsi.StatusResvConflict)
	default:
		r.Status, sns = uint8(scsi.StatusCheckCondition), scsi.FromWire(sense, x.op)
	}
	if r.Status == uint8(scsi.StatusGood) {
		r.Flags = x.flags
		r.DataInResid, r.DataOutResid = x.inResid, x.outResid
	} else {
		// Nothing moved.
		if x.inLen > 0 {
			r.Flags, r.DataInResid = r.Flags|srp.DIUnder, x.inLen
		}
		if x.outLen > 0 {
			r.Flags, r.DataOutResid = r.Flags|srp.DOUnder, x.outLen
		}
	}
	if r.Status == uint8(scsi.StatusCheckCondition) {
		r.Sense = sns.AppendFixed(x.senseBuf[:0])
		r.Flags |= srp.SnsValid
	}
	if x.tmf {
		r.Resp = x.resp[:]
		r.Flags |= srp.RspValid
	}
	n, err := r.Encode(s.send)
	if err != nil {
		c.noteBug(fmt.Errorf("target: encode SRP_RSP: %w", err))
		c.close("internal error: "+err.Error(), false)
		return
	}
	s.sges[k] = transport.SGE{Addr: s.sendAddr, Length: uint32(n), LKey: c.p.iuLKey}
	c.sent(s, transport.SendWR{ID: makeWRID(c.p.gen, kindResp, int(s.idx)), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: s.sges[k : k+1]}, r.Status != uint8(scsi.StatusGood))
}

// srpSetPortGroups goes on with a SET TARGET PORT GROUPS once its
// parameter list is in: a list asking for this gateway's group to be
// active starts a takeover (jobTakeOver, a no-op where the volume is
// served already), anything else is answered now.
func (c *core) srpSetPortGroups(s *slot) {
	lu := s.srp.lu
	activate, a := lu.dev.SetPortGroups(s.data[:s.cmd.Length])
	if !activate {
		c.srpAnswer(s, a.Status, a.Sense)
		return
	}
	lu.unit.takeOver(1, false)
	s.ov = lu.ov
	c.dispatch(s, jobTakeOver)
}

// srpTakeOverDone ends slot s's takeover: the unit is active from now
// on for a takeover that succeeded, and the nexus, which asked for it,
// is not told of the change.
func (c *core) srpTakeOverDone(s *slot) {
	if s.srp.lu == nil {
		return
	}
	s.srp.lu.unit.takeOver(-1, s.err == nil)
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("LUN %d %s: takeover done (err %v)", s.srp.lun, s.srp.lu.ov.name, s.err))
	}
}

// srpPathChanged gives the units of the volume named name, where ALUA
// is on, their new state at this gateway: ASYMMETRIC ACCESS STATE
// CHANGED for each I_T nexus, once (srpUnit.setState).
func (c *core) srpPathChanged(name string, st gwState) {
	for i := range c.srp.luns {
		lu := &c.srp.luns[i]
		if lu.ov == nil || lu.ov.revoked || lu.ov.name != name || lu.dev.PortGroup == 0 {
			continue
		}
		if lu.unit.setState(st) && c.p.trace != nil {
			c.p.trace(fmt.Sprintf("LUN %d %s: state %d, unit attention %s", i, name, st, lu.unit.pending()))
		}
	}
}

// srpResized gives the LUN of the volume named name its new size of size
// bytes and raises CAPACITY DATA HAS CHANGED on the session's nexus for
// it (SBC-3 4.6; Linux rereads the capacity on it), once for the I_T
// nexus: the first of its channels to hear of the resize raises it, for
// all of them. A size that is not a whole number of blocks is cut to
// one (the store refuses such sizes).
func (c *core) srpResized(name string, size int64) {
	for i := range c.srp.luns {
		lu := &c.srp.luns[i]
		if lu.ov == nil || lu.ov.revoked || lu.ov.name != name || lu.dev.BlockSize == 0 {
			continue
		}
		blocks := uint64(size) / uint64(lu.dev.BlockSize)
		if blocks == lu.dev.Blocks {
			continue
		}
		lu.dev.Blocks = blocks
		if lu.unit.resize(blocks) && c.p.trace != nil {
			c.p.trace(fmt.Sprintf("LUN %d %s: %d blocks, unit attention %s", i, name, blocks, lu.unit.pending()))
		}
	}
}
