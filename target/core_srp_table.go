package target

// An SRP command's data buffer in the core: its descriptors taken into
// the slot, an indirect table fetched when only part of it rode in the
// IU, and tables of more descriptors than a slot's share of the send
// queue (maxDesc, 16 by default). Each descriptor is one RDMA READ or
// WRITE, and the send queue is sized for maxDesc + 1 work requests per
// slot, so such a command moves its data in rounds: at most maxDesc
// operations, the last signaled, and the next round once it completed
// (for data-in, the SRP_RSP rides in the last round, behind its WRITEs).
// ib_srp sends such tables when cmd_sg_entries or indirect_sg_entries
// are raised (up to 2048, its SG_MAX_SEGMENTS), inline up to what the
// login's max_it_iu_len holds and fetched by RDMA READ beyond that
// (allow_ext_sg).
//
// The descriptors live in the slot's long list, kept across requests,
// so a slot allocates it once (at most srpMaxDesc entries: 32 KiB) and
// the steady state allocates nothing. A table of more than srpMaxDesc
// descriptors, or one whose fetched bytes would not fit the slot's data
// buffer, is refused with CHECK CONDITION, INVALID FIELD IN CDB before
// anything moves.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// srpMaxDesc bounds the descriptors of one SRP command: ib_srp's largest
// indirect_sg_entries (SG_MAX_SEGMENTS). Per connection that bounds the
// long lists at credits × 2048 × 16 bytes (2 MiB at 64 credits).
const srpMaxDesc = 2048

// srpLongCap is the most descriptors a table of slot buffers of maxXfer
// bytes may have: srpMaxDesc, and few enough that the table, fetched
// into the slot's data buffer, fits it.
func srpLongCap(maxXfer uint32) int { return min(srpMaxDesc, int(maxXfer)/srp.DescriptorLen) }

// isLong reports whether the slot's command moves its data through its
// long list rather than cmd.Desc.
func (x *srpSlot) isLong() bool { return x.long != nil && x.nlong > 0 }

// srpLongReset empties the slot's long list, keeping its capacity.
func (s *slot) srpLongReset() {
	s.srp.long = s.srp.long[:0]
	s.srp.nlong, s.srp.next, s.srp.off, s.srp.pushing = 0, 0, 0, false
}

// srpLongAppend adds d to the slot's long list (its capacity grows only
// on a slot's first long table: the steady state allocates nothing).
func (s *slot) srpLongAppend(d srp.Descriptor) {
	if s.srp.long == nil {
		s.srp.long = make([]wire.Descriptor, 0, srpMaxDesc)
	}
	s.srp.long = append(s.srp.long, wire.Descriptor{VA: d.VA, RKey: d.Key, Len: d.Len})
	s.srp.nlong = len(s.srp.long)
}

// srpLongTrim cuts the long list to the first n bytes it describes (n at
// most their total), as trimDescriptors does cmd.Desc.
func (s *slot) srpLongTrim(n uint32) {
	l := s.srp.long
	for i := range l {
		if l[i].Len >= n {
			l[i].Len = n
			s.srp.long = l[:i+1]
			s.srp.nlong = i + 1
			return
		}
		n -= l[i].Len
	}
}

// srpRound appends the next round of RDMA operations of kind and op
// over the long list, at most max of them (zero-length descriptors move
// nothing and take none), and returns how many. It uses sges from 0.
func (c *core) srpRound(s *slot, kind wrKind, op transport.Opcode, max int) int {
	x := &s.srp
	k := 0
	for ; x.next < x.nlong && k < max; x.next++ {
		d := &x.long[x.next]
		if d.Len == 0 {
			continue
		}
		s.sges[k] = transport.SGE{Addr: s.dataAddr + x.off, Length: d.Len, LKey: c.p.dataLKey}
		c.acts.send = append(c.acts.send, transport.SendWR{
			ID: makeWRID(c.p.gen, kind, int(s.idx)), Opcode: op,
			SGL: s.sges[k : k+1], RemoteAddr: d.VA, RKey: transport.Key(d.RKey),
		})
		x.off += uint64(d.Len)
		k++
	}
	return k
}

// srpLongLeft counts the non-empty descriptors the long list has yet to
// move.
func (x *srpSlot) srpLongLeft() int {
	n := 0
	for _, d := range x.long[x.next:x.nlong] {
		if d.Len > 0 {
			n++
		}
	}
	return n
}

// srpReadRound fetches the next round of a long WRITE's data: at most
// maxDesc RDMA READs, the last signaled; when the last round completed
// the write goes on (completion, kindRead, in READING_DATA).
func (c *core) srpReadRound(s *slot) {
	n := min(s.srp.srpLongLeft(), c.maxDesc)
	if n == 0 {
		c.dispatchWrite(s) // only zero-length descriptors were left
		return
	}
	if !c.sqReserve(n) {
		return
	}
	c.srpRound(s, kindRead, transport.OpRDMARead, n)
	c.acts.send[len(c.acts.send)-1].Flags = transport.FlagSignaled
	s.sigSeq = c.sqPosted
	if s.state != slotReadingData { // later rounds stay in it
		c.setSlot(s, slotReadingData)
	}
}

// srpReadDone goes on with a long WRITE whose round of RDMA READs
// completed: the next round, or the write once all its data came.
func (c *core) srpReadDone(s *slot) {
	if s.srp.srpLongLeft() == 0 {
		c.dispatchWrite(s)
		return
	}
	if s.srp.aborted {
		c.srpAbortDone(s)
		return
	}
	c.srpReadRound(s)
}

// srpWriteRound pushes the next round of a long data-in: the SRP_RSP
// behind the last WRITEs when they fit in one round, else maxDesc
// WRITEs, the last signaled (completion kindWrite, srpWriteDone).
func (c *core) srpWriteRound(s *slot) {
	left := s.srp.srpLongLeft()
	if left <= c.maxDesc {
		if !c.sqReserve(left + 1) {
			return
		}
		s.srp.pushing = false
		k := c.srpRound(s, kindWrite, transport.OpRDMAWrite, left)
		c.postResponse(s, wire.StatusGood, wire.SenseNone, k)
		if s.state != slotWritingData {
			c.setSlot(s, slotWritingData)
		}
		return
	}
	if !c.sqReserve(c.maxDesc) {
		return
	}
	s.srp.pushing = true
	c.srpRound(s, kindWrite, transport.OpRDMAWrite, c.maxDesc)
	c.acts.send[len(c.acts.send)-1].Flags = transport.FlagSignaled
	s.sigSeq = c.sqPosted
	if s.state != slotWritingData { // later rounds stay in it
		c.setSlot(s, slotWritingData)
	}
}

// srpWriteDone goes on with a long data-in whose round of RDMA WRITEs
// completed; a command aborted meanwhile stops here, unanswered.
func (c *core) srpWriteDone(s *slot) {
	if s.srp.aborted {
		c.srpAbortDone(s)
		return
	}
	c.srpWriteRound(s)
}

// srpDescriptors takes the command's data buffer into the slot: direct
// and indirect descriptors become slot.cmd's descriptors, bounded by the
// negotiated descriptor count; immediate data is copied to the slot's
// data buffer, bounded by what the login granted. A command moving data
// both ways is refused. An indirect table not wholly inline (ib_srp
// sends one beyond cmd_sg_entries descriptors, with allow_ext_sg) is
// marked for srpFetchTable: its inline part is taken, its total
// trusted only once the whole table is fetched and checked.
func (c *core) srpDescriptors(s *slot, cmd *srp.Cmd) bool {
	out, in := &cmd.DataOut, &cmd.DataIn
	if out.Format != srp.FormatNone && in.Format != srp.FormatNone {
		return false
	}
	d := out
	if in.Format != srp.FormatNone {
		d = in
	}
	var total uint64
	switch d.Format {
	case srp.FormatNone:
		return true
	case srp.FormatDirect:
		s.cmd.Desc[0] = wire.Descriptor{VA: d.Direct.VA, RKey: d.Direct.Key, Len: d.Direct.Len}
		s.cmd.NDesc = 1
		total = uint64(d.Direct.Len)
	case srp.FormatIndirect:
		// Each descriptor becomes one RDMA READ or WRITE, and the send
		// queue holds maxDesc of them per slot: a table of more moves
		// its data in rounds from the slot's long list
		// (core_srp_table.go), up to srpLongCap descriptors; beyond, it
		// is refused, inline or not (ib_srpt takes no table it would
		// have to fetch at all, srpt_get_desc_tbl). Decode checked that
		// Count fits the table.
		n := int(d.Table.Len / srp.DescriptorLen)
		if n > srpLongCap(c.maxXfer) {
			return false
		}
		long := n > c.maxDesc
		if long {
			s.srpLongReset()
		}
		for i := 0; i < int(d.Count); i++ {
			x := d.Partial(i)
			if long {
				s.srpLongAppend(x)
			} else {
				s.cmd.Desc[i] = wire.Descriptor{VA: x.VA, RKey: x.Key, Len: x.Len}
			}
			total += uint64(x.Len)
		}
		if !long {
			s.cmd.NDesc = int(d.Count)
		}
		if n > int(d.Count) { // SRP r16a 5.5.2: the rest is in the initiator's memory
			s.srp.table, s.srp.tableN, s.srp.inline = d.Table, n, int(d.Count)
			total = uint64(d.Total)
		} else if total != uint64(d.Total) {
			return false
		}
	case srp.FormatImmediate:
		if len(d.Imm) > int(c.maxImm) {
			return false
		}
		copy(s.data, d.Imm)
		s.cmd.Flags |= wire.FlagImmediate
		total = uint64(len(d.Imm))
	}
	if d == in {
		s.srp.inLen = uint32(total)
	} else {
		s.srp.outLen = uint32(total)
	}
	return true
}

// srpFetchTable reads the whole indirect table of slot s's command
// from the initiator's memory into the slot's data buffer (one RDMA READ
// with the table descriptor's key; srpLongCap × 16 bytes at most, inside
// the buffer), keeping the LUN and CDB of cmd, which aliases the
// receive buffer, for srpTableFetched. A WRITE's data lands in the same
// buffer afterwards.
func (c *core) srpFetchTable(s *slot, cmd *srp.Cmd) {
	x := &s.srp
	x.lunRaw = cmd.LUN
	x.cdbLen = copy(x.cdb[:], cmd.CDB)
	if lun, err := scsi.DecodeLUN(cmd.LUN); err == nil {
		x.lun = lun // for task management while the table is on its way
	}
	if !c.sqReserve(1) {
		return
	}
	s.sges[0] = transport.SGE{Addr: s.dataAddr, Length: x.table.Len, LKey: c.p.dataLKey}
	c.acts.send = append(c.acts.send, transport.SendWR{
		ID: makeWRID(c.p.gen, kindRead, int(s.idx)), Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL: s.sges[:1], RemoteAddr: x.table.VA, RKey: transport.Key(x.table.Key),
	})
	s.sigSeq = c.sqPosted
	c.setSlot(s, slotFetchingTable)
}

// srpTableFetched goes on with a command whose indirect table is in the
// slot's data buffer. The table is hostile input like the IU: it must
// decode within the bound, sum to the command's total, and begin with
// the descriptors that rode inline (the partial table is a copy of the
// table's first entries, SRP r16a 5.5.2); else CHECK CONDITION, INVALID
// FIELD IN CDB, with nothing moved. A command aborted meanwhile stops
// here; one that met a drain is answered BUSY.
func (c *core) srpTableFetched(s *slot) {
	x := &s.srp
	if x.aborted {
		c.srpAbortDone(s)
		return
	}
	total := x.inLen
	if total == 0 {
		total = x.outLen
	}
	var short [wire.MaxDescriptors]srp.Descriptor
	tbl, inline := short[:c.maxDesc], s.cmd.Desc[:x.inline]
	if x.tableN > c.maxDesc { // a long table: its inline part is in the long list
		if c.srp.tbl == nil {
			c.srp.tbl = make([]srp.Descriptor, srpMaxDesc)
		}
		tbl, inline = c.srp.tbl[:srpLongCap(c.maxXfer)], x.long[:x.inline]
	}
	n, err := srp.DecodeTable(s.data[:x.table.Len], total, tbl)
	if err == nil {
		for i := range inline {
			if d := &inline[i]; tbl[i].VA != d.VA || tbl[i].Key != d.RKey || tbl[i].Len != d.Len {
				err = fmt.Errorf("descriptor %d differs from its inline copy", i)
			}
		}
	}
	if err != nil {
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("slot %d tag=%d: fetched indirect table refused: %v", s.idx, x.tag, err))
		}
		c.srpAnswer(s, scsi.StatusCheckCondition, scsi.SenseInvalidField)
		return
	}
	if x.tableN > c.maxDesc {
		s.srpLongReset()
		for _, d := range tbl[:n] {
			s.srpLongAppend(d)
		}
	} else {
		for i, d := range tbl[:n] {
			s.cmd.Desc[i] = wire.Descriptor{VA: d.VA, RKey: d.Key, Len: d.Len}
		}
		s.cmd.NDesc = n
	}
	if c.state == connDraining {
		s.busy = true
		c.srpAnswer(s, scsi.StatusBusy, scsi.SenseNone)
		return
	}
	c.srpExecute(s, x.lunRaw, x.cdb[:x.cdbLen])
}

// srpTrim cuts slot s's descriptors, in cmd.Desc or the long list, to
// the first n bytes they describe.
func (c *core) srpTrim(s *slot, n uint32) {
	if s.srp.isLong() {
		s.srpLongTrim(n)
		return
	}
	trimDescriptors(&s.cmd, n)
}

// trimDescriptors cuts cmd's descriptors to the first n bytes they
// describe (n at most their total).
func trimDescriptors(cmd *wire.Command, n uint32) {
	for i := 0; i < cmd.NDesc; i++ {
		d := &cmd.Desc[i]
		if d.Len >= n {
			d.Len = n
			cmd.NDesc = i + 1
			return
		}
		n -= d.Len
	}
}
