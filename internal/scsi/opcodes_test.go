package scsi

import (
	"bytes"
	"testing"

	"github.com/gosrp/gosrp/internal/fieldhex"
)

// rsoc is a REPORT SUPPORTED OPERATION CODES CDB (SPC-4 6.35.1):
// MAINTENANCE IN, service action 0x0C, byte 2 RCTD and REPORTING
// OPTIONS, the requested operation code and service action, the
// allocation length.
func rsoc(opts byte, op byte, sa uint16, alloc uint32) []byte {
	c := []byte{0xA3, 0x0C, opts, op, 0, 0, 0, 0, 0, 0, 0, 0}
	be.PutUint16(c[4:], sa)
	be.PutUint32(c[6:], alloc)
	return c
}

// TestReportOpcodes: REPORT SUPPORTED OPERATION CODES answers in SPC-4's
// layouts: the one_command parameter data (SUPPORT, CDB size, CDB usage
// data, and a timeouts descriptor with RCTD) for the forms Linux sends
// (001b, and 011b with a service action), the all_commands list, and
// INVALID FIELD IN CDB where SPC-4 asks for it.
func TestReportOpcodes(t *testing.T) {
	thick := disk()
	thick.Discard, thick.DiscardZeroes = false, false
	for _, tc := range []struct {
		name string
		dev  *Device
		cdb  []byte
		want []byte
	}{
		{"WRITE SAME(16), as sd_read_write_same asks", disk(), rsoc(1, 0x93, 0, 512), fieldhex.Bytes(t,
			"00",                           // 0 reserved
			"03",                           // 1 CTDP 0, SUPPORT 011b: supported as the standard says
			"0010",                         // 2 CDB size 16
			"93",                           // 4 CDB usage data: the operation code,
			"09",                           // 5 UNMAP, NDOB
			"ffffffffffffffff", "ffffffff", // 6 LBA, 14 number of blocks
			"00", "00", // group number, control: ignored
		)},
		{"INQUIRY", disk(), rsoc(1, 0x12, 0, 512), fieldhex.Bytes(t, "00", "03", "0006", "12", "01", "ff", "ffff", "00")},
		{"UNMAP on a thin unit", disk(), rsoc(1, 0x42, 0, 512), fieldhex.Bytes(t, "00", "03", "000a", "42", "000000000000", "ffff", "00")},
		{"UNMAP on a thick unit", thick, rsoc(1, 0x42, 0, 512), fieldhex.Bytes(t, "00", "01", "0000")},
		{"an opcode not served", disk(), rsoc(1, 0xC0, 0, 512), fieldhex.Bytes(t, "00", "01", "0000")},
		{"READ CAPACITY(16), 010b", disk(), rsoc(2, 0x9E, 0x10, 512), fieldhex.Bytes(t,
			"00", "03", "0010", "9e", "1f", fieldhex.Zeros(8), "ffffffff", "00", "00")},
		{"READ CAPACITY(16), 011b as Linux asks with a service action", disk(), rsoc(3, 0x9E, 0x10, 512), fieldhex.Bytes(t,
			"00", "03", "0010", "9e", "1f", fieldhex.Zeros(8), "ffffffff", "00", "00")},
		{"SERVICE ACTION IN(16) of another service action", disk(), rsoc(2, 0x9E, 0x11, 512), fieldhex.Bytes(t, "00", "01", "0000")},
		{"011b without a service action", disk(), rsoc(3, 0x28, 0, 512), fieldhex.Bytes(t,
			"00", "03", "000a", "28", "08", "ffffffff", "00", "ffff", "00")},
		{"RCTD: a timeouts descriptor", disk(), rsoc(0x81, 0x00, 0, 512), fieldhex.Bytes(t,
			"00", "83", "0006", "000000000000", // CTDP, TEST UNIT READY's usage
			"000a", "00", "00", "00000000", "00000000", // descriptor length 10, no timeouts given
		)},
		{"cut to the allocation length", disk(), rsoc(1, 0x93, 0, 4), fieldhex.Bytes(t, "00", "03", "0010")},
		{"all commands, thick: UNMAP left out", thick, rsoc(0, 0, 0, 4096), fieldhex.Bytes(t,
			"000000d8",                             // 0 command data length: 27 descriptors of 8 bytes
			"00", "00", "0000", "00", "00", "0006", // TEST UNIT READY: opcode, reserved, SA, reserved, flags, CDB length
			"03000000 00000006", "12000000 00000006", "1a000000 00000006",
			"25000000 0000000a", "28000000 0000000a", "2a000000 0000000a", "35000000 0000000a", "41000000 0000000a",
			"5a000000 0000000a",
			"5e000000 0001000a", "5e000001 0001000a", "5e000002 0001000a", // PERSISTENT RESERVE IN, SERVACTV
			"5f000000 0001000a", "5f000001 0001000a", "5f000002 0001000a", "5f000003 0001000a",
			"5f000004 0001000a", "5f000005 0001000a", "5f000006 0001000a", // PERSISTENT RESERVE OUT
			"88000000 00000010", "8a000000 00000010", "91000000 00000010", "93000000 00000010",
			"9e", "00", "0010", "00", "01", "0010", // READ CAPACITY(16): SA 0x10, SERVACTV
			"a0000000 0000000c",
			"a300000c 0001000c", // REPORT SUPPORTED OPERATION CODES itself
		)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.dev.Execute(&Nexus{}, tc.cdb, nil)
			if a.Status != StatusGood || a.Op != OpNone || !bytes.Equal(a.Data, tc.want) {
				t.Fatalf("%v %v\n% x\nwant\n% x", a.Status, a.Sense, a.Data, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		cdb  []byte
	}{
		{"001b for an opcode with service actions", rsoc(1, 0x9E, 0x10, 512)},
		{"010b for an opcode without", rsoc(2, 0x28, 0, 512)},
		{"reporting options 100b", rsoc(4, 0x28, 0, 512)},
		{"MAINTENANCE IN, REPORT TARGET PORT GROUPS", []byte{0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0}},
	} {
		if a := disk().Execute(&Nexus{}, tc.cdb, nil); a.Status != StatusCheckCondition || a.Sense != SenseInvalidField {
			t.Errorf("%s: %v %v, want INVALID FIELD IN CDB", tc.name, a.Status, a.Sense)
		}
	}
}

// TestReportOpcodesTruth: what REPORT SUPPORTED OPERATION CODES says is
// what Execute does: every operation code Execute does not refuse as
// INVALID COMMAND OPERATION CODE is reported supported, with a CDB
// usage map as long as its CDB, and every other one not supported, on a
// thin and a thick unit.
func TestReportOpcodesTruth(t *testing.T) {
	thick := disk()
	thick.Discard = false
	alua := disk()
	alua.PortGroup = 3
	for _, dev := range []*Device{disk(), thick, alua} {
		for op := 0; op < 256; op++ {
			c := make([]byte, 16)
			c[0] = byte(op)
			opts, sa := byte(1), uint16(0)
			switch byte(op) {
			case opServiceIn16:
				c[1], opts, sa = saReadCapacity16, 3, saReadCapacity16
			case opMaintenanceIn:
				c[1], opts, sa = saReportOpcodes, 3, saReportOpcodes
			case opMaintenanceOut:
				c[1], opts, sa = saPortGroups, 3, saPortGroups
			case opPersistIn, opPersistOut:
				opts = 3 // service action 0: READ KEYS, REGISTER
			}
			a := dev.Execute(&Nexus{}, c, nil)
			served := !(a.Status == StatusCheckCondition && a.Sense == SenseInvalidOpcode)
			r := dev.Execute(&Nexus{}, rsoc(opts, byte(op), sa, 512), nil)
			if r.Status != StatusGood || len(r.Data) < 4 {
				t.Fatalf("opcode %#02x: REPORT SUPPORTED OPERATION CODES %v %v", op, r.Status, r.Sense)
			}
			if got := r.Data[1]&7 == 3; got != served {
				t.Errorf("opcode %#02x (discard %t, port group %d): reported supported %t, Execute serves it %t", op, dev.Discard, dev.PortGroup, got, served)
			}
			if served && (int(be.Uint16(r.Data[2:])) != cdbLen(byte(op)) || len(r.Data) != 4+cdbLen(byte(op)) || r.Data[4] != byte(op)) {
				t.Errorf("opcode %#02x: CDB usage data % x for a %d-byte CDB", op, r.Data[4:], cdbLen(byte(op)))
			}
		}
	}
}
