package target

// The core's block commands: from a received command IU through the RDMA
// READs of its data, the backend job and the RDMA WRITEs, to the response.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// assign decodes the IU in receive buffer idx into slot s, reposts the
// buffer and starts the request.
func (c *core) assign(s *slot, idx int32, n uint32, at int64) {
	if c.srp != nil {
		c.srpAssign(s, idx, n, at)
		return
	}
	buf := c.recvBuf(idx, n)
	s.start = at
	c.setSlot(s, slotReceived)
	s.busy = false
	s.ov = nil
	if wire.Opcode(buf[0]) == wire.OpCommand {
		s.control = false
		err := s.cmd.Decode(buf)
		if err == nil && s.cmd.Immediate != nil {
			// The data arrived with the command: take it out of the
			// receive buffer before the buffer is posted again.
			if n := len(s.cmd.Immediate); n > int(c.maxImm) {
				err = fmt.Errorf("%d bytes of immediate data, %d granted at login", n, c.maxImm)
			} else {
				copy(s.data, s.cmd.Immediate)
			}
			s.cmd.Immediate = nil
		}
		c.repost(idx)
		if err != nil {
			c.close("malformed command: "+err.Error(), true)
			return
		}
		if c.tagInFlight(s, s.cmd.Tag) {
			return
		}
		c.startCommand(s)
		return
	}
	s.control = true
	s.ctl = wire.ControlRequest{}
	err := wire.DecodeControl(buf, wire.OpControl, &s.ctl)
	c.repost(idx)
	if err != nil {
		c.close("malformed control request: "+err.Error(), true)
		return
	}
	if c.tagInFlight(s, s.ctl.Tag) {
		return
	}
	c.startControl(s)
}

// tagInFlight ends the connection if another request not yet answered
// carries tag, and reports whether it did. The initiator names each
// request in flight by its own tag, and its answer goes back under it:
// two at once would get two answers it cannot tell apart, and SAM-5
// calls a second command under a tag in use an overlapped command. Our
// initiator never sends one; a NIC that replays a request at ERR
// (transport.Quirks.ReplayOnErr, rxe on Linux 6.12.95) does, and this
// ends the connection at the first copy instead of executing them all.
// A request whose answer is posted no longer counts (slot.holdsTag).
// The SRP personality answers an overlapped command as SAM-5 says
// instead (srpOverlapped): it has task management to abort the
// nexus's commands with.
func (c *core) tagInFlight(s *slot, tag uint64) bool {
	for i := range c.slots {
		o := &c.slots[i]
		if o == s || !o.holdsTag() {
			continue
		}
		if (o.control && o.ctl.Tag == tag) || (!o.control && o.cmd.Tag == tag) {
			c.close(fmt.Sprintf("tag %#x of a request not yet answered", tag), true)
			return true
		}
	}
	return false
}

func (c *core) lookup(h uint32) *openVol {
	if h == 0 || int(h) > len(c.handles) {
		return nil
	}
	return c.handles[h-1]
}

func (c *core) startCommand(s *slot) {
	cmd := &s.cmd
	if c.state == connDraining {
		s.busy = true
		c.respond(s, wire.StatusBusy, wire.SenseNone)
		return
	}
	ov := c.lookup(cmd.Volume)
	if ov == nil {
		c.respond(s, wire.StatusError, wire.SenseNoSuchVolume)
		return
	}
	s.ov = ov
	if ov.revoked {
		c.respond(s, wire.StatusError, wire.SenseAccessDenied)
		return
	}
	switch cmd.Op {
	case wire.OpRead, wire.OpWrite:
		if cmd.Length == 0 || cmd.Length > c.maxXfer || cmd.NDesc > c.maxDesc {
			c.respond(s, wire.StatusError, wire.SenseInvalidField)
			return
		}
	case wire.OpDiscard, wire.OpWriteZeroes:
		if cmd.Length == 0 {
			c.respond(s, wire.StatusError, wire.SenseInvalidField)
			return
		}
	}
	if cmd.Op != wire.OpRead && cmd.Op != wire.OpFlush && ov.ro {
		c.respond(s, wire.StatusError, wire.SenseWriteProtected)
		return
	}
	if !c.reservationAllows(ov, cmd.Op) {
		c.respond(s, wire.StatusError, wire.SenseReservationConflict)
		return
	}
	if cmd.Op != wire.OpFlush {
		switch {
		case cmd.Offset%uint64(ov.bs) != 0 || uint64(cmd.Length)%uint64(ov.bs) != 0:
			c.respond(s, wire.StatusError, wire.SenseMisaligned)
			return
		case cmd.Offset > uint64(ov.size) || uint64(cmd.Length) > uint64(ov.size)-cmd.Offset:
			c.respond(s, wire.StatusError, wire.SenseOutOfRange)
			return
		}
	}
	switch cmd.Op {
	case wire.OpWrite:
		if cmd.Flags&wire.FlagImmediate != 0 {
			c.dispatchWrite(s) // the data came with the command
		} else {
			c.postReads(s)
		}
	case wire.OpRead:
		c.dispatch(s, jobRead)
	case wire.OpFlush:
		c.dispatch(s, jobFlush)
	case wire.OpDiscard:
		c.dispatch(s, jobDiscard)
	case wire.OpWriteZeroes:
		c.dispatch(s, jobWriteZeroes)
	}
}

// sqReserve accounts for n more send WRs; false means the send queue
// would overflow (a bug: slots are sized so it cannot happen).
func (c *core) sqReserve(n int) bool {
	if c.sqPosted+uint64(n)-c.sqDone > uint64(c.p.sqDepth) {
		c.close(fmt.Sprintf("send queue would overflow: %d in use + %d > %d", c.sqPosted-c.sqDone, n, c.p.sqDepth), false)
		return false
	}
	c.sqPosted += uint64(n)
	return true
}

// reclaim records that the signaled WR at sequence seq completed, which
// frees its SQ entry and every one before it (docs/verbs.md#completions).
func (c *core) reclaim(seq uint64) {
	if seq > c.sqDone {
		c.sqDone = seq
	}
}

func (c *core) nonEmptyDesc(s *slot) int {
	n := 0
	for i := 0; i < s.cmd.NDesc; i++ {
		if s.cmd.Desc[i].Len > 0 {
			n++
		}
	}
	return n
}

// appendRDMA queues one unsignaled RDMA READ or WRITE per non-empty
// descriptor of the slot's command, between the slot's data buffer and
// the initiator's memory, and returns how many.
func (c *core) appendRDMA(s *slot, kind wrKind, op transport.Opcode) int {
	var off uint64
	k := 0
	for i := 0; i < s.cmd.NDesc; i++ {
		d := &s.cmd.Desc[i]
		if d.Len == 0 {
			continue
		}
		s.sges[k] = transport.SGE{Addr: s.dataAddr + off, Length: d.Len, LKey: c.p.dataLKey}
		c.acts.send = append(c.acts.send, transport.SendWR{
			ID: makeWRID(c.p.gen, kind, int(s.idx)), Opcode: op,
			SGL: s.sges[k : k+1], RemoteAddr: d.VA, RKey: transport.Key(d.RKey),
		})
		off += uint64(d.Len)
		k++
	}
	return k
}

// postReads fetches a WRITE's data: one RDMA READ per descriptor into the
// slot's data buffer, the last one signaled.
func (c *core) postReads(s *slot) {
	if c.srp != nil && s.srp.isLong() {
		c.srpReadRound(s) // core_srp_table.go
		return
	}
	n := c.nonEmptyDesc(s)
	if !c.sqReserve(n) {
		return
	}
	c.appendRDMA(s, kindRead, transport.OpRDMARead)
	c.acts.send[len(c.acts.send)-1].Flags = transport.FlagSignaled
	s.sigSeq = c.sqPosted
	c.setSlot(s, slotReadingData)
}

// dispatchWrite hands a WRITE whose data is in the slot's buffer to the
// backend, unless the policy changed while its data was on the way.
func (c *core) dispatchWrite(s *slot) {
	if c.srp != nil && s.srp.aborted {
		c.srpAbortDone(s) // its data came, its job never runs
		return
	}
	switch {
	case s.ov.revoked:
		c.respond(s, wire.StatusError, wire.SenseAccessDenied)
		return
	case s.ov.ro && (c.srp == nil || s.srp.act.Op != scsi.OpSetPortGroups && s.srp.act.Op != scsi.OpReserveOut):
		// A SET TARGET PORT GROUPS's or PERSISTENT RESERVE OUT's data
		// is its parameter list, not the volume's: a read-only host
		// may ask for a takeover, as an OPEN with Takeover may
		// (docs/gateways.md), or reserve, as its gosrp requests may.
		c.respond(s, wire.StatusError, wire.SenseWriteProtected)
		return
	}
	if c.srp != nil && s.srp.act.Op != scsi.OpNone {
		c.srpFetched(s) // an UNMAP's parameter list, a WRITE SAME's block
		return
	}
	if s.cmd.Flags&wire.FlagFUA != 0 {
		c.dispatch(s, jobWriteFUA)
	} else {
		c.dispatch(s, jobWrite)
	}
}

func (c *core) dispatch(s *slot, j jobKind) {
	if s.ov != nil && !s.control && s.ov.pr != nil && isWriteJob(j) {
		// Counted before the check, which PREEMPT AND ABORT relies on
		// (prVolume.fence): a write it does not count checks the new
		// reservation. The check also catches a host preempted while
		// a WRITE's data was on its way.
		s.ov.writes.Add(1)
		if !c.reservationAllows(s.ov, s.cmd.Op) {
			s.ov.writeDone()
			c.respond(s, wire.StatusError, wire.SenseReservationConflict)
			return
		}
	}
	s.job = j
	s.err = nil
	c.setSlot(s, slotBackend)
	if s.ov != nil && !s.control {
		s.ov.inflight.Add(1)
	}
	c.jobsInFlight++
	c.acts.jobs = append(c.acts.jobs, s.idx)
}

// respondRead pushes a READ's data with unsignaled RDMA WRITEs chained in
// front of the response SEND: RC ordering places the data first, and the
// SEND's completion proves the WRITEs are done too.
func (c *core) respondRead(s *slot) {
	if c.srp != nil && s.srp.isLong() {
		c.srpWriteRound(s) // core_srp_table.go
		return
	}
	n := c.nonEmptyDesc(s)
	if !c.sqReserve(n + 1) {
		return
	}
	k := c.appendRDMA(s, kindWrite, transport.OpRDMAWrite)
	c.postResponse(s, wire.StatusGood, wire.SenseNone, k)
	c.setSlot(s, slotWritingData)
}

// respond answers a command with no data to move.
func (c *core) respond(s *slot, st wire.Status, sense wire.Sense) {
	if !c.sqReserve(1) {
		return
	}
	c.postResponse(s, st, sense, 0)
	c.setSlot(s, slotResponding)
}

// postResponse encodes the Response into the slot's send buffer and
// appends its SEND (SQ space already reserved), using sges[k].
func (c *core) postResponse(s *slot, st wire.Status, sense wire.Sense, k int) {
	if c.srp != nil {
		c.srpRespond(s, st, sense, k)
		return
	}
	cmd := &s.cmd
	r := wire.Response{Status: st, Sense: sense, Credits: 1, Tag: cmd.Tag}
	if st != wire.StatusGood && cmd.Op.HasData() {
		r.Residual = cmd.Length
	}
	if s.ov != nil && s.ov.resized {
		s.ov.resized = false
		r.Flags, r.Size = wire.RespCapacityChanged, uint64(s.ov.size)
	}
	n, _ := r.Encode(s.send) // the buffer holds iuSize bytes, and the flags are known
	s.sges[k] = transport.SGE{Addr: s.sendAddr, Length: uint32(n), LKey: c.p.iuLKey}
	wr := transport.SendWR{ID: makeWRID(c.p.gen, kindResp, int(s.idx)), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: s.sges[k : k+1]}
	// Remote invalidation only when both sides agreed and the command asked
	// for it. Never with an RDMA READ of that MR outstanding: a WRITE's
	// response is posted only after its READs completed.
	if cmd.Flags&wire.FlagInvalidate != 0 && c.remoteInv {
		wr.Opcode = transport.OpSendWithInv
		wr.InvalidateKey = transport.Key(cmd.InvalidateKey)
	}
	c.sent(s, wr, st != wire.StatusGood)
}

// sent appends a response SEND of slot s and accounts for it: the credit
// it returns and the command's statistics.
func (c *core) sent(s *slot, wr transport.SendWR, failed bool) {
	c.acts.send = append(c.acts.send, wr)
	s.sigSeq = c.sqPosted
	c.outstanding--
	lat := c.now - s.start
	c.p.connStats.record(s.cmd.Op, s.cmd.Length, failed, lat)
	if s.ov != nil {
		s.ov.stats.record(s.cmd.Op, s.cmd.Length, failed, lat)
	}
}
