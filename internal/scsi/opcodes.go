package scsi

// REPORT SUPPORTED OPERATION CODES (SPC-4 6.35): the commands the model
// serves, so that an initiator need not probe. Linux asks it before it
// uses WRITE SAME for zeroing (sd_read_write_same asks about INQUIRY
// first, to learn whether the command is there at all, then about WRITE
// SAME(16) and WRITE SAME(10)).

const (
	opMaintenanceIn  = 0xA3 // MAINTENANCE IN; REPORT SUPPORTED OPERATION CODES is service action 0x0C
	saReportOpcodes  = 0x0C
	timeoutsDescLen  = 12 // a command timeouts descriptor (SPC-4 6.35.4)
	commandDescLen   = 8  // an all-commands command descriptor without it
	oneCommandHdrLen = 4
)

// opcode is one command the model serves, with its CDB usage data (SPC-4
// 6.35.3): the operation code, then one bit per CDB bit the model
// evaluates. Bits it ignores, or only checks to be zero as reserved
// (protection information, ANCHOR), are zero there.
type opcode struct {
	op    byte
	sa    uint16
	hasSA bool // the command is an operation code and a service action
	usage []byte
	// discard: served only when the unit deallocates (UNMAP).
	discard bool
	// alua: served only with a PortGroup (the TARGET PORT GROUPS
	// commands).
	alua bool
}

// opcodes are the commands Execute serves, in operation code order.
var opcodes = []opcode{
	{op: opTestUnitReady, usage: []byte{0x00, 0, 0, 0, 0, 0}},
	{op: opRequestSense, usage: []byte{0x03, 0x01, 0, 0, 0xff, 0}},     // DESC, allocation length
	{op: opInquiry, usage: []byte{0x12, 0x01, 0xff, 0xff, 0xff, 0}},    // EVPD, page, allocation length
	{op: opModeSense6, usage: []byte{0x1A, 0x08, 0xff, 0xff, 0xff, 0}}, // DBD, PC and page, subpage, allocation length
	{op: opReadCapacity10, usage: []byte{0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0}},
	{op: opRead10, usage: []byte{0x28, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0}},  // FUA, LBA, length
	{op: opWrite10, usage: []byte{0x2A, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0}}, // FUA, LBA, length
	{op: opSyncCache10, usage: []byte{0x35, 0, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0}},
	{op: opWriteSame10, usage: []byte{0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0}}, // UNMAP, LBA, blocks
	{op: opUnmap, usage: []byte{0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0}, discard: true},       // parameter list length
	{op: opModeSense10, usage: []byte{0x5A, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0}},       // LLBAA, DBD, ...
	// PERSISTENT RESERVE IN: READ KEYS, READ RESERVATION, REPORT
	// CAPABILITIES; the allocation length.
	{op: opPersistIn, sa: prReadKeys, hasSA: true, usage: []byte{0x5E, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0}},
	{op: opPersistIn, sa: prReadReservation, hasSA: true, usage: []byte{0x5E, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0}},
	{op: opPersistIn, sa: prReportCaps, hasSA: true, usage: []byte{0x5E, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0}},
	// PERSISTENT RESERVE OUT, each service action but REGISTER AND
	// MOVE: scope and type, the parameter list length.
	{op: opPersistOut, sa: 0, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 1, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 2, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 3, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 4, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 5, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opPersistOut, sa: 6, hasSA: true, usage: []byte{0x5F, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0}},
	{op: opRead16, usage: []byte{0x88, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	{op: opWrite16, usage: []byte{0x8A, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	{op: opSyncCache16, usage: []byte{0x91, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	// WRITE SAME(16): UNMAP and NDOB, LBA, blocks.
	{op: opWriteSame16, usage: []byte{0x93, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	// READ CAPACITY(16): the service action and the allocation length
	// (the obsolete LBA and PMI are ignored).
	{op: opServiceIn16, sa: saReadCapacity16, hasSA: true, usage: []byte{0x9E, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	{op: opReportLUNs, usage: []byte{0xA0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0}}, // SELECT REPORT, allocation length
	// REPORT SUPPORTED OPERATION CODES: RCTD and REPORTING OPTIONS, the
	// requested operation code and service action, allocation length.
	{op: opMaintenanceIn, sa: saReportOpcodes, hasSA: true, usage: []byte{0xA3, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	// REPORT TARGET PORT GROUPS: PARAMETER DATA FORMAT, allocation length.
	{op: opMaintenanceIn, sa: saPortGroups, hasSA: true, alua: true, usage: []byte{0xA3, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0}},
	// SET TARGET PORT GROUPS: parameter list length.
	{op: opMaintenanceOut, sa: saPortGroups, hasSA: true, alua: true, usage: []byte{0xA4, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0}},
}

// served reports whether the unit serves x.
func (d *Device) served(x *opcode) bool {
	return (!x.discard || d.Discard) && (!x.alua || d.PortGroup != 0)
}

// reportOpcodes: REPORT SUPPORTED OPERATION CODES (SPC-4 6.35),
// MAINTENANCE IN with service action 0x0C. CDB (12 bytes): byte 2 RCTD
// (bit 7: add command timeouts descriptors) and REPORTING OPTIONS (bits
// 2:0), byte 3 the requested operation code, bytes 4-5 the requested
// service action, bytes 6-9 the allocation length.
//
// Reporting options 000b list every command (all_commands parameter
// data: a 4-byte length, then an 8-byte descriptor per command, 20 with
// RCTD). 001b reports one operation code, and is INVALID FIELD IN CDB
// for one that has service actions; 010b one operation code and service
// action, INVALID FIELD IN CDB for one that has none; 011b either
// (SPC-4 r37). The one_command data: byte 1 CTDP (bit 7) and SUPPORT
// (bits 2:0: 001b not supported, 011b supported as the standard says),
// bytes 2-3 the CDB size, then the CDB usage data. The timeouts
// descriptors say 0: no timeout is specified.
func (d *Device) reportOpcodes(cdb []byte) Action {
	rctd := cdb[2]&0x80 != 0
	opts, reqOp, reqSA := cdb[2]&0x07, cdb[3], be.Uint16(cdb[4:])
	alloc := int(be.Uint32(cdb[6:]))
	var b []byte
	switch opts {
	case 0:
		n := commandDescLen
		if rctd {
			n += timeoutsDescLen
		}
		b = make([]byte, 4, 4+len(opcodes)*n)
		for i := range opcodes {
			x := &opcodes[i]
			if !d.served(x) {
				continue
			}
			var c [commandDescLen + timeoutsDescLen]byte
			c[0] = x.op
			if x.hasSA {
				be.PutUint16(c[2:], x.sa)
				c[5] |= 0x01 // SERVACTV
			}
			be.PutUint16(c[6:], uint16(len(x.usage)))
			if rctd {
				c[5] |= 0x02 // CTDP
				be.PutUint16(c[commandDescLen:], timeoutsDescLen-2)
			}
			b = append(b, c[:n]...)
		}
		be.PutUint32(b, uint32(len(b)-4))
	case 1, 2, 3:
		hasSA := false
		var found *opcode
		for i := range opcodes {
			x := &opcodes[i]
			if x.op != reqOp {
				continue
			}
			if !d.served(x) {
				continue
			}
			hasSA = x.hasSA
			if !x.hasSA || x.sa == reqSA {
				found = x
			}
		}
		if (opts == 1 && hasSA) || (opts == 2 && !hasSA) {
			return check(SenseInvalidField)
		}
		b = make([]byte, oneCommandHdrLen, oneCommandHdrLen+16+timeoutsDescLen)
		b[1] = 0x01 // not supported
		if found != nil {
			b[1] = 0x03 // supported, as the standard says
			be.PutUint16(b[2:], uint16(len(found.usage)))
			b = append(b, found.usage...)
			if rctd {
				b[1] |= 0x80 // CTDP
				var t [timeoutsDescLen]byte
				be.PutUint16(t[:], timeoutsDescLen-2)
				b = append(b, t[:]...)
			}
		}
	default:
		return check(SenseInvalidField)
	}
	return data(b, alloc)
}
