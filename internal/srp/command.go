package srp

import "fmt"

// Sizes of SRP_CMD's parts.
const (
	// CmdLen is SRP_CMD without additional CDB bytes and descriptors.
	CmdLen = 48
	// CDBLen is the CDB field's size; a longer CDB continues in the
	// ADDITIONAL CDB bytes that follow the fixed part.
	CDBLen = 16
	// MaxAddCDBLen is the most additional CDB bytes the field can say
	// (bits 7:2 of one byte, in 4-byte words).
	MaxAddCDBLen = 252
	// IndirectHeaderLen is an indirect table's header: the table's own
	// descriptor and the total data length (struct srp_indirect_buf).
	IndirectHeaderLen = 20
	// ImmHeaderLen is the immediate data descriptor: its length (struct
	// srp_imm_buf).
	ImmHeaderLen = 4
)

// Task attributes (TASK ATTRIBUTE, SRP r16a table 21; ib_srpt's
// SRP_CMD_*_Q). ib_srp leaves it zero: SIMPLE.
const (
	TaskSimple      uint8 = 0
	TaskHeadOfQueue uint8 = 1
	TaskOrdered     uint8 = 2
	TaskACA         uint8 = 4
)

// DataBuffer is one direction's data buffer descriptor in an SRP_CMD
// (SRP r16a 5.5): nothing, one direct Descriptor, an indirect table, or
// (data-out only, SRP-2) immediate data.
//
// An indirect table lists Table.Len/16 descriptors in the initiator's
// memory at Table.VA; the first Count of them ride in the IU too (the
// partial table: ib_srp sends up to cmd_sg_entries), and the target
// RDMA-READs the rest when Count falls short (srpt_get_desc_tbl
// requires it never does). Total is the sum of all their lengths.
type DataBuffer struct {
	Format Format
	// Direct is the descriptor of FormatDirect.
	Direct Descriptor
	// Table is where an indirect table lives; Total its data length,
	// which for FormatImmediate is the immediate data's length.
	Table Descriptor
	Total uint32
	// Count is how many of the table's descriptors the IU carries: the
	// SRP_CMD's DATA-OUT or DATA-IN DESCRIPTOR COUNT.
	Count uint8
	// partial holds the Count descriptors as they arrived (Decode) or
	// as Partial set them (Encode), 16 bytes each, so decoding copies
	// nothing.
	partial []byte
	// Imm is FormatImmediate's data. After Decode it aliases the IU;
	// Encode does not copy it (the sender gathers it as a second SGE).
	Imm []byte
}

// Len is the number of bytes the buffer describes.
func (d *DataBuffer) Len() uint32 {
	switch d.Format {
	case FormatDirect:
		return d.Direct.Len
	case FormatIndirect, FormatImmediate:
		return d.Total
	}
	return 0
}

// Partial returns the i-th descriptor of the partial table, 0 <= i <
// Count.
func (d *DataBuffer) Partial(i int) Descriptor {
	return getDescriptor(d.partial[i*DescriptorLen:])
}

// SetPartial makes descs the partial table Encode writes (it encodes
// them into scratch, which must hold 16 bytes per descriptor, and keeps
// scratch; no allocation).
func (d *DataBuffer) SetPartial(descs []Descriptor, scratch []byte) error {
	if len(descs) > 255 {
		return fmt.Errorf("%w: partial table of %d descriptors (max 255)", ErrTooLarge, len(descs))
	}
	if len(scratch) < len(descs)*DescriptorLen {
		return fmt.Errorf("%w: %d descriptors need %d bytes of scratch, have %d", ErrTooLarge, len(descs), len(descs)*DescriptorLen, len(scratch))
	}
	for i, x := range descs {
		putDescriptor(scratch[i*DescriptorLen:], x)
	}
	d.Count = uint8(len(descs))
	d.partial = scratch[:len(descs)*DescriptorLen]
	return nil
}

// encodedLen is the descriptor's size in the IU (immediate data not
// counted: it sits at the login's offset).
func (d *DataBuffer) encodedLen() int {
	switch d.Format {
	case FormatDirect:
		return DescriptorLen
	case FormatIndirect:
		return IndirectHeaderLen + int(d.Count)*DescriptorLen
	case FormatImmediate:
		return ImmHeaderLen
	}
	return 0
}

// Cmd is SRP_CMD (SRP r16a 6.8, SRP-2 immediate data): a SCSI command
// for a LUN, with where its data is.
//
//	0  opcode u8 = 0x02
//	1  sol_not u8
//	2  reserved [3]
//	5  buf_fmt u8: DATA-OUT format in bits 7:4, DATA-IN in bits 3:0
//	6  data_out_desc_cnt u8
//	7  data_in_desc_cnt u8
//	8  tag u64
//	16 reserved [4]
//	20 lun [8]
//	28 reserved
//	29 task_attr u8 (bits 2:0)
//	30 reserved
//	31 add_cdb_len u8: bits 7:2 count 4-byte words; bits 1:0 reserved
//	32 cdb [16]
//	48 additional CDB bytes, then the DATA-OUT descriptor, then the
//	   DATA-IN descriptor; immediate data at the login's ImmDataOffset
type Cmd struct {
	// SolNot asks for solicited notification of the response: SCSOLNT
	// (0x02) on success, UCSOLNT (0x04) on failure; the target then sets
	// the SRP_RSP's SOLNT (ib_srp sends neither).
	SolNot   uint8
	Tag      uint64
	LUN      LUN
	TaskAttr uint8
	// CDB is the whole CDB: the 16-byte field and the additional bytes
	// (a multiple of 4 more). After Decode it aliases the IU. Encode
	// writes it zero-padded to 16 bytes and rounds longer ones up to a
	// multiple of 4, as ib_srp's srp_queuecommand does.
	CDB     []byte
	DataOut DataBuffer
	DataIn  DataBuffer
}

// addCDBLen is how many additional CDB bytes Encode writes.
func (c *Cmd) addCDBLen() int {
	if len(c.CDB) <= CDBLen {
		return 0
	}
	return (len(c.CDB) - CDBLen + 3) &^ 3
}

// EncodedLen is the size Encode writes: the IU without immediate data.
func (c *Cmd) EncodedLen() int {
	return CmdLen + c.addCDBLen() + c.DataOut.encodedLen() + c.DataIn.encodedLen()
}

// Encode writes c into b, which must hold EncodedLen bytes. For
// FormatImmediate it writes the descriptor only; the caller sends the
// DataOut.Imm bytes at the offset the login agreed, after zero padding
// from EncodedLen (ib_srp pads to 68 and gathers the data as its own
// SGEs).
func (c *Cmd) Encode(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	n := c.EncodedLen()
	if err := room(b, n, OpCmd); err != nil {
		return 0, err
	}
	b = b[:n]
	add := c.addCDBLen()
	clear(b[:CmdLen+add])
	b[0] = byte(OpCmd)
	b[1] = c.SolNot
	b[5] = byte(c.DataOut.Format)<<4 | byte(c.DataIn.Format)
	if c.DataOut.Format == FormatIndirect {
		b[6] = c.DataOut.Count
	}
	if c.DataIn.Format == FormatIndirect {
		b[7] = c.DataIn.Count
	}
	be.PutUint64(b[8:], c.Tag)
	copy(b[20:28], c.LUN[:])
	b[29] = c.TaskAttr
	b[31] = byte(add)
	copy(b[32:], c.CDB)
	off := CmdLen + add
	off += c.DataOut.encode(b[off:])
	c.DataIn.encode(b[off:])
	return n, nil
}

// check refuses what Encode cannot write or Decode would not take back.
func (c *Cmd) check() error {
	switch {
	case len(c.CDB) > CDBLen+MaxAddCDBLen:
		return fmt.Errorf("%w: CDB of %d bytes (max %d)", ErrTooLarge, len(c.CDB), CDBLen+MaxAddCDBLen)
	case c.TaskAttr > 7:
		return fmt.Errorf("%w: task attribute %d (3 bits)", ErrMalformed, c.TaskAttr)
	case c.DataOut.Format > FormatImmediate:
		return fmt.Errorf("%w: data-out format %d", ErrMalformed, c.DataOut.Format)
	case c.DataIn.Format > FormatIndirect:
		return fmt.Errorf("%w: data-in format %s (immediate data is data-out only)", ErrMalformed, c.DataIn.Format)
	}
	for _, d := range []*DataBuffer{&c.DataOut, &c.DataIn} {
		if d.Format == FormatIndirect && len(d.partial) != int(d.Count)*DescriptorLen {
			return fmt.Errorf("%w: indirect table says %d descriptors inline, has %d bytes of them (use SetPartial)", ErrMalformed, d.Count, len(d.partial))
		}
		if d.Format == FormatImmediate && uint64(len(d.Imm)) != uint64(d.Total) {
			return fmt.Errorf("%w: immediate descriptor says %d bytes, data has %d", ErrMalformed, d.Total, len(d.Imm))
		}
	}
	return nil
}

// encode writes the descriptor at b's start and returns its size.
func (d *DataBuffer) encode(b []byte) int {
	switch d.Format {
	case FormatDirect:
		putDescriptor(b, d.Direct)
	case FormatIndirect:
		putDescriptor(b, d.Table)
		be.PutUint32(b[16:], d.Total)
		copy(b[IndirectHeaderLen:], d.partial)
	case FormatImmediate:
		be.PutUint32(b, d.Total)
	}
	return d.encodedLen()
}

// Decode parses an SRP_CMD of len(b) bytes (the receive completion's
// byte count) into c without allocating: CDB, the partial tables and
// immediate data alias b. immOffset is the ImmDataOffset the login
// accepted, or 0 if it accepted none (then immediate data is an error).
//
// Every length is checked against b, following what ib_srpt's
// srpt_get_desc_tbl checks and more: the descriptors must fit, an
// indirect table's inline part cannot be longer than the table it is
// part of, whose length is whole descriptors, and immediate data must
// start after its descriptor and end within the IU.
func (c *Cmd) Decode(b []byte, immOffset int) error {
	if err := need(b, CmdLen, OpCmd); err != nil {
		return err
	}
	c.SolNot = b[1]
	c.Tag = be.Uint64(b[8:])
	copy(c.LUN[:], b[20:28])
	c.TaskAttr = b[29] & 7
	// The two low bits of ADDITIONAL CDB LENGTH are reserved, so the
	// byte's value, with them masked, is the length in bytes
	// (srpt_get_desc_buf's "& ~3").
	add := int(b[31] &^ 3)
	if CmdLen+add > len(b) {
		return fmt.Errorf("%w: SRP_CMD of %d bytes with %d additional CDB bytes", ErrMalformed, len(b), add)
	}
	c.CDB = b[32 : CmdLen+add]
	out, in := Format(b[5]>>4), Format(b[5]&0xf)
	off := CmdLen + add
	n, err := c.DataOut.decode(b, off, out, b[6], immOffset, "data-out")
	if err != nil {
		return err
	}
	off += n
	if in == FormatImmediate {
		return fmt.Errorf("%w: data-in format immediate (SRP-2 allows it for data-out only)", ErrMalformed)
	}
	if _, err := c.DataIn.decode(b, off, in, b[7], immOffset, "data-in"); err != nil {
		return err
	}
	if c.DataOut.Format == FormatImmediate && immOffset < off+c.DataIn.encodedLen() {
		return fmt.Errorf("%w: immediate data at %d overlaps the data-in descriptor ending at %d", ErrMalformed, immOffset, off+c.DataIn.encodedLen())
	}
	return nil
}

// decode parses one direction's descriptor at b[off:] and returns its
// size in the IU.
func (d *DataBuffer) decode(b []byte, off int, f Format, count uint8, immOffset int, dir string) (int, error) {
	*d = DataBuffer{Format: f}
	rest := len(b) - off
	switch f {
	case FormatNone:
		return 0, nil
	case FormatDirect:
		if rest < DescriptorLen {
			return 0, fmt.Errorf("%w: %s direct descriptor at %d runs past the IU's %d bytes", ErrMalformed, dir, off, len(b))
		}
		d.Direct = getDescriptor(b[off:])
		return DescriptorLen, nil
	case FormatIndirect:
		n := IndirectHeaderLen + int(count)*DescriptorLen
		if rest < n {
			return 0, fmt.Errorf("%w: %s indirect table with %d descriptors inline at %d runs past the IU's %d bytes", ErrMalformed, dir, count, off, len(b))
		}
		d.Table = getDescriptor(b[off:])
		d.Total = be.Uint32(b[off+16:])
		d.Count = count
		d.partial = b[off+IndirectHeaderLen : off+n]
		switch {
		case d.Table.Len%DescriptorLen != 0:
			return 0, fmt.Errorf("%w: %s indirect table of %d bytes is not whole %d-byte descriptors", ErrMalformed, dir, d.Table.Len, DescriptorLen)
		case uint32(count) > d.Table.Len/DescriptorLen:
			return 0, fmt.Errorf("%w: %s indirect table of %d descriptors has %d inline", ErrMalformed, dir, d.Table.Len/DescriptorLen, count)
		}
		return n, nil
	case FormatImmediate:
		if rest < ImmHeaderLen {
			return 0, fmt.Errorf("%w: %s immediate descriptor at %d runs past the IU's %d bytes", ErrMalformed, dir, off, len(b))
		}
		if immOffset == 0 {
			return 0, fmt.Errorf("%w: immediate data, which the login did not accept", ErrMalformed)
		}
		d.Total = be.Uint32(b[off:])
		switch {
		case immOffset < off+ImmHeaderLen:
			return 0, fmt.Errorf("%w: immediate data at %d starts before its descriptor ends at %d", ErrMalformed, immOffset, off+ImmHeaderLen)
		case uint64(immOffset)+uint64(d.Total) > uint64(len(b)):
			return 0, fmt.Errorf("%w: %d bytes of immediate data at %d run past the IU's %d bytes", ErrMalformed, d.Total, immOffset, len(b))
		}
		d.Imm = b[immOffset : immOffset+int(d.Total)]
		return ImmHeaderLen, nil
	}
	return 0, fmt.Errorf("%w: %s descriptor format %d", ErrMalformed, dir, uint8(f))
}
