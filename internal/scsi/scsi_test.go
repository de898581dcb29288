package scsi

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/fieldhex"
	"github.com/gosrp/gosrp/internal/wire"
)

// disk is a 1 GiB thin volume of 4 KiB blocks with a volatile cache.
func disk() *Device {
	return &Device{BlockSize: 4096, Blocks: 262144, WriteCache: true, Discard: true, DiscardZeroes: true,
		ID: 0x0123456789abcdef, Serial: "vol-0001"}
}

func cdb(b ...byte) []byte {
	c := make([]byte, 16)
	copy(c, b)
	return c
}

func TestDataIn(t *testing.T) {
	ro := disk()
	ro.ReadOnly, ro.WriteCache, ro.Discard = true, false, false
	big := disk()
	big.Blocks = 1 << 33
	gw := disk()
	gw.PortGroup = 0x0102
	inc := disk()
	inc.Incarnation = 0xcafef00d
	cases := []struct {
		name string
		dev  *Device
		cdb  []byte
		want []byte
	}{
		{"standard INQUIRY", disk(), cdb(0x12, 0, 0, 0, 96), fieldhex.Bytes(t,
			"00",       // 0 qualifier 0, type 0: direct access block device
			"00",       // 1 not removable
			"06",       // 2 SPC-4
			"12",       // 3 HISUP, response data format 2
			"1f",       // 4 additional length 31
			"00", "00", // 5, 6
			"02",                               // 7 CMDQUE
			"474f535250202020",                 // 8 "GOSRP   "
			"7372706420766f6c756d652020202020", // 16 "srpd volume     "
			"30303031",                         // 32 "0001"
		)},
		{"INQUIRY cut to allocation length", disk(), cdb(0x12, 0, 0, 0, 5), fieldhex.Bytes(t, "000006121f")},
		{"VPD 0x00", disk(), cdb(0x12, 1, 0x00, 0, 255), fieldhex.Bytes(t,
			"00", "00", "0006", // 0 type, page 0x00, page length 6
			"00 80 83 b0 b1 b2", // 4 supported pages
		)},
		{"VPD 0x80 serial", disk(), cdb(0x12, 1, 0x80, 0, 255), fieldhex.Bytes(t,
			"00", "80", "0008",
			"766f6c2d30303031", // 4 "vol-0001"
		)},
		{"VPD 0x83 identification", disk(), cdb(0x12, 1, 0x83, 0, 255), fieldhex.Bytes(t,
			"00", "83", "0020", // page length 32
			"01", "03", "00", "08", // 4 binary, LU, NAA, length 8
			"3123456789abcdef",     // 8 NAA 3h locally assigned, low 60 bits of the ID
			"02", "01", "00", "10", // 16 ASCII, LU, T10 vendor ID, length 16
			"474f535250202020", // 20 "GOSRP   "
			"766f6c2d30303031", // 28 "vol-0001"
		)},
		{"VPD 0x83 of a unit with an incarnation", inc, cdb(0x12, 1, 0x83, 0, 255), fieldhex.Bytes(t,
			"00", "83", "002c", // page length 44
			"01", "03", "00", "08", "3123456789abcdef",
			"02", "01", "00", "10", "474f535250202020", "766f6c2d30303031",
			"01", "00", "00", "08", // 36 binary, LU, vendor specific, length 8
			"00000000cafef00d", // 40 the incarnation
		)},
		{"standard INQUIRY of a gateway's unit", gw, cdb(0x12, 0, 0, 0, 8), fieldhex.Bytes(t,
			"00", "00", "06", "12", "1f",
			"30",       // 5 TPGS 11b: implicit and explicit ALUA
			"00", "02", // 6, 7 CMDQUE
		)},
		{"VPD 0x83 of a gateway's unit", gw, cdb(0x12, 1, 0x83, 0, 255), fieldhex.Bytes(t,
			"00", "83", "0030", // page length 48
			"01", "03", "00", "08", "3123456789abcdef",
			"02", "01", "00", "10", "474f535250202020", "766f6c2d30303031",
			"01", "14", "00", "04", "0000", "0102", // 36 binary, target port, relative target port 0x0102
			"01", "15", "00", "04", "0000", "0102", // 44 binary, target port, target port group 0x0102
		)},
		{"REPORT TARGET PORT GROUPS, length header", gw, cdb(0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0), fieldhex.Bytes(t,
			"0000000c", // 0 return data length 12
			"00",       // 4 PREF 0, active/optimized
			"0d",       // 5 U_SUP, S_SUP, AO_SUP
			"0102",     // 6 target port group
			"00", "00", // 8 reserved, 9 status: none
			"00", "01", // 10 vendor specific, 11 target port count
			"0000", "0102", // 12 the target port's relative identifier
		)},
		{"REPORT TARGET PORT GROUPS, extended header", gw, cdb(0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0), fieldhex.Bytes(t,
			"00000010",         // 0 return data length 16
			"10", "0a", "0000", // 4 format type 001b, implicit transition time 10 s
			"00", "0d", "0102", "00", "00", "00", "01", "0000", "0102",
		)},
		{"VPD 0xB0 limits", disk(), cdb(0x12, 1, 0xb0, 0, 255), fieldhex.Bytes(t,
			"00", "b0", "003c",
			"01",         // 4 WSNZ
			"00", "0000", // 5 compare and write, 6 transfer granularity
			"00000800",         // 8 maximum transfer length: 8 MiB / 4 KiB
			"00000000",         // 12 optimal transfer length
			"00000000",         // 16 maximum prefetch length
			"00400000",         // 20 maximum unmap LBA count
			"00000100",         // 24 maximum unmap block descriptor count 256
			"00000001",         // 28 optimal unmap granularity
			"00000000",         // 32 unmap granularity alignment
			"0000000000400000", // 36 maximum write same length
			fieldhex.Zeros(20), // 44..63
		)},
		{"VPD 0xB1 non-rotating", disk(), cdb(0x12, 1, 0xb1, 0, 255), append(fieldhex.Bytes(t, "00", "b1", "003c", "0001"), make([]byte, 58)...)},
		{"VPD 0xB2 thin, UNMAP and WRITE SAME", disk(), cdb(0x12, 1, 0xb2, 0, 255), fieldhex.Bytes(t,
			"00", "b2", "0004",
			"00", // 4 threshold exponent
			"e4", // 5 LBPU, LBPWS, LBPWS10, LBPRZ
			"02", // 6 provisioning type: thin
			"00",
		)},
		{"VPD 0xB2 full", ro, cdb(0x12, 1, 0xb2, 0, 255), fieldhex.Bytes(t, "00b20004", "00000000")},
		{"READ CAPACITY(10)", disk(), cdb(0x25), fieldhex.Bytes(t,
			"0003ffff", // 0 last LBA 262143
			"00001000", // 4 block length 4096
		)},
		{"READ CAPACITY(10) beyond 32 bits", big, cdb(0x25), fieldhex.Bytes(t, "ffffffff", "00001000")},
		{"READ CAPACITY(16)", disk(), cdb(0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32), fieldhex.Bytes(t,
			"000000000003ffff", // 0 last LBA
			"00001000",         // 8 block length
			"00",               // 12 no protection
			"00",               // 13 one logical block per physical block
			"c0",               // 14 LBPME, LBPRZ
			"00",
			fieldhex.Zeros(16), // 16..31
		)},
		{"MODE SENSE(6) all pages", disk(), cdb(0x1a, 0, 0x3f, 0, 192), fieldhex.Bytes(t,
			"2b",           // 0 mode data length 43
			"00",           // 1 medium type
			"10",           // 2 DPOFUA, not WP
			"08",           // 3 block descriptor length
			"00040000",     // 4 blocks 262144
			"00", "001000", // 8 reserved, 9 block length
			"0812", "04", // 12 caching page: WCE
			fieldhex.Zeros(17), // 15..31
			"0a0a", "20", "10", // 32 control page: TST 001b, queue algorithm modifier 1
			"00", "40", // 36 TAS
			"000000000000", // 38..43
		)},
		{"MODE SENSE(6) read-only caching page, no block descriptor", ro, cdb(0x1a, 0x08, 0x08, 0, 255), fieldhex.Bytes(t,
			"17", "00", "90", "00", // length 23, WP|DPOFUA, no descriptor
			"0812", "00", fieldhex.Zeros(17), // no WCE
		)},
		{"MODE SENSE(10) long LBA", big, cdb(0x5a, 0x10, 0x0a, 0, 0, 0, 0, 0, 255), fieldhex.Bytes(t,
			"0022",     // 0 mode data length 34
			"00", "10", // 2 medium type, DPOFUA
			"01", "00", // 4 LONGLBA
			"0010",                     // 6 block descriptor length 16
			"0000000200000000",         // 8 blocks 2^33
			"00000000",                 // 16 reserved
			"00001000",                 // 20 block length
			"0a0a20100040000000000000", // 24 control page: TST 001b, TAS
		)},
		{"MODE SENSE(6) changeable values", disk(), cdb(0x1a, 0x08, 0x48, 0, 255), append(fieldhex.Bytes(t, "17001000", "0812"), make([]byte, 18)...)},
		{"REQUEST SENSE, nothing pending", disk(), cdb(0x03, 0, 0, 0, 18), fieldhex.Bytes(t, "70", "00", "00", "00000000", "0a", "00000000", "00", "00", "00000000")},
		{"REQUEST SENSE descriptor format", disk(), cdb(0x03, 1, 0, 0, 18), fieldhex.Bytes(t, "72000000", "00000000")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.dev.Execute(&Nexus{}, c.cdb, []uint16{0})
			if a.Status != StatusGood || a.Op != OpNone || !bytes.Equal(a.Data, c.want) {
				t.Fatalf("%v %v %v\n% x\nwant\n% x", a.Status, a.Sense, a.Op, a.Data, c.want)
			}
		})
	}
}

// TestLongSerial: a serial number longer than a designator can say is
// cut there, and the pages stay consistent.
func TestLongSerial(t *testing.T) {
	d := disk()
	d.Serial = strings.Repeat("s", 300) + "\x01"
	a := d.Execute(&Nexus{}, cdb(0x12, 1, 0x80, 0x01, 0x40), nil)
	if len(a.Data) != 4+301 || a.Data[len(a.Data)-1] != ' ' {
		t.Fatalf("VPD 0x80 of %d bytes ending %q", len(a.Data), a.Data[len(a.Data)-1])
	}
	a = d.Execute(&Nexus{}, cdb(0x12, 1, 0x83, 0x01, 0x40), nil)
	if n := int(be.Uint16(a.Data[2:])); n != len(a.Data)-4 || a.Data[4+12+3] != 255 || len(a.Data) != 4+12+4+255 {
		t.Fatalf("VPD 0x83: page length %d, %d bytes, T10 designator length %d", n, len(a.Data), a.Data[4+12+3])
	}
}

func TestReportLUNs(t *testing.T) {
	want := fieldhex.Bytes(t,
		"00000018",         // 0 LUN list length: 3 LUNs
		"00000000",         // 4 reserved
		"0000000000000000", // 8 LUN 0
		"0007000000000000", // 16 LUN 7, peripheral device addressing
		"412c000000000000", // 24 LUN 300, flat space addressing
	)
	rl := cdb(0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0)
	for _, a := range []Action{disk().Execute(&Nexus{}, rl, []uint16{300, 7, 0, 7}), NoUnit(rl, []uint16{0, 7, 300})} {
		if a.Status != StatusGood || !bytes.Equal(a.Data, want) {
			t.Fatalf("%v %v\n% x\nwant\n% x", a.Status, a.Sense, a.Data, want)
		}
	}
	for _, lun := range []uint16{0, 1, 255, 256, 300, MaxLUN} {
		got, err := DecodeLUN(EncodeLUN(lun))
		if err != nil || got != lun {
			t.Errorf("LUN %d → % x → %d, %v", lun, EncodeLUN(lun), got, err)
		}
	}
	for _, bad := range [][8]byte{{0, 1, 0, 1}, {0x80, 1}, {0x01, 1}, {0xc0}} {
		if _, err := DecodeLUN(bad); err == nil {
			t.Errorf("DecodeLUN(% x) accepted", bad[:])
		}
	}
	if a := NoUnit(cdb(0x12, 0, 0, 0, 36), nil); a.Status != StatusGood || a.Data[0] != 0x7f {
		t.Errorf("INQUIRY of no unit: %v % x", a.Status, a.Data)
	}
	if a := NoUnit(cdb(0x28, 0, 0, 0, 0, 0, 0, 0, 1), nil); a.Sense != SenseLUNotSupported {
		t.Errorf("READ of no unit: %v", a.Sense)
	}
	// A unit becoming ready: qualifier 001b, NOT READY 04h/01h for the
	// rest (a VPD page, which it cannot describe yet, too), and the same
	// LUN inventory.
	for _, tc := range []struct {
		name  string
		cdb   []byte
		sense Sense
		data  []byte // the first bytes of the data, for GOOD
	}{
		{"INQUIRY", cdb(0x12, 0, 0, 0, 36), SenseNone, []byte{0x20, 0, 0x06, 0x12, 31}},
		{"INQUIRY VPD 0x83", cdb(0x12, 1, 0x83, 0, 255), SenseBecomingReady, nil},
		{"INQUIRY page without EVPD", cdb(0x12, 0, 0x83, 0, 255), SenseInvalidField, nil},
		{"TEST UNIT READY", cdb(0, 0, 0, 0, 0), SenseBecomingReady, nil},
		{"READ(10)", cdb(0x28, 0, 0, 0, 0, 0, 0, 0, 1), SenseBecomingReady, nil},
		{"REQUEST SENSE", cdb(0x03, 0, 0, 0, 18), SenseNone, []byte{0x70, 0, 0x02}},
		{"REPORT LUNS", rl, SenseNone, want[:8]},
	} {
		a := BecomingReady(tc.cdb, []uint16{0, 7, 300})
		switch {
		case tc.sense != SenseNone && (a.Status != StatusCheckCondition || a.Sense != tc.sense):
			t.Errorf("%s of a unit becoming ready: %v %v, want CHECK CONDITION %v", tc.name, a.Status, a.Sense, tc.sense)
		case tc.sense == SenseNone && (a.Status != StatusGood || !bytes.HasPrefix(a.Data, tc.data)):
			t.Errorf("%s of a unit becoming ready: %v % x, want GOOD % x...", tc.name, a.Status, a.Data, tc.data)
		}
	}
	if a := NoUnit(cdb(0x03, 0, 0, 0, 18), nil); a.Status != StatusGood || a.Data[12] != 0x25 {
		t.Errorf("REQUEST SENSE of no unit: % x", a.Data)
	}
}

func TestBlockActions(t *testing.T) {
	ro := disk()
	ro.ReadOnly = true
	nodiscard := disk()
	nodiscard.Discard = false
	cases := []struct {
		name string
		dev  *Device
		cdb  []byte
		want Action
	}{
		{"READ(10)", disk(), cdb(0x28, 0, 0, 0, 0x10, 0, 0, 0, 8), Action{Op: OpRead, LBA: 0x1000, Blocks: 8}},
		{"READ(16) last block", disk(), cdb(0x88, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0, 0, 0, 1), Action{Op: OpRead, LBA: 262143, Blocks: 1}},
		{"READ(16) past the end", disk(), cdb(0x88, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0, 0, 0, 2), check(SenseLBAOutOfRange)},
		{"READ(16) LBA wraps", disk(), cdb(0x88, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 2), check(SenseLBAOutOfRange)},
		{"READ(10) zero blocks", disk(), cdb(0x28, 0, 0, 0, 0, 5), good()},
		{"READ(10) RDPROTECT", disk(), cdb(0x28, 0x20, 0, 0, 0, 0, 0, 0, 1), check(SenseInvalidField)},
		{"READ(10) FUA is just a read", disk(), cdb(0x28, 0x08, 0, 0, 0, 0, 0, 0, 1), Action{Op: OpRead, Blocks: 1}},
		{"READ(16) longer than the maximum", disk(), cdb(0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x01), check(SenseInvalidField)},
		{"WRITE(10) FUA", disk(), cdb(0x2a, 0x08, 0, 0, 0, 1, 0, 0, 2), Action{Op: OpWrite, LBA: 1, Blocks: 2, FUA: true, DataOut: 8192}},
		{"WRITE(16)", disk(), cdb(0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1), Action{Op: OpWrite, LBA: 9, Blocks: 1, DataOut: 4096}},
		{"WRITE(10) read-only", ro, cdb(0x2a, 0, 0, 0, 0, 1, 0, 0, 2), check(SenseWriteProtected)},
		{"SYNCHRONIZE CACHE(10)", disk(), cdb(0x35), Action{Op: OpFlush}},
		{"SYNCHRONIZE CACHE(16) past the end", disk(), cdb(0x91, 0, 0, 0, 0, 0, 0, 4, 0, 0), check(SenseLBAOutOfRange)},
		{"WRITE SAME(16) UNMAP", disk(), cdb(0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0), Action{Op: OpWriteSame, Blocks: 256, Unmap: true, DataOut: 4096}},
		{"WRITE SAME(16) NDOB", disk(), cdb(0x93, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0), Action{Op: OpWriteSame, Blocks: 256, NoData: true}},
		{"WRITE SAME(16) UNMAP without discard writes", nodiscard, cdb(0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1), Action{Op: OpWriteSame, Blocks: 1, DataOut: 4096}},
		{"WRITE SAME(10)", disk(), cdb(0x41, 0x08, 0, 0, 0, 2, 0, 0, 4), Action{Op: OpWriteSame, LBA: 2, Blocks: 4, Unmap: true, DataOut: 4096}},
		{"WRITE SAME(10) NDOB is not a (10) bit", disk(), cdb(0x41, 0x01, 0, 0, 0, 2, 0, 0, 4), check(SenseInvalidField)},
		{"WRITE SAME zero blocks", disk(), cdb(0x93, 0x08), check(SenseInvalidField)},
		{"WRITE SAME ANCHOR", disk(), cdb(0x93, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1), check(SenseInvalidField)},
		{"WRITE SAME read-only", ro, cdb(0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1), check(SenseWriteProtected)},
		{"UNMAP", disk(), cdb(0x42, 0, 0, 0, 0, 0, 0, 0, 24), Action{Op: OpUnmap, DataOut: 24}},
		{"UNMAP empty list", disk(), cdb(0x42), good()},
		{"UNMAP short list", disk(), cdb(0x42, 0, 0, 0, 0, 0, 0, 0, 7), check(SenseParamListLength)},
		{"UNMAP ANCHOR", disk(), cdb(0x42, 1, 0, 0, 0, 0, 0, 0, 24), check(SenseInvalidField)},
		{"UNMAP without discard", nodiscard, cdb(0x42, 0, 0, 0, 0, 0, 0, 0, 24), check(SenseInvalidOpcode)},
		{"UNMAP read-only", ro, cdb(0x42, 0, 0, 0, 0, 0, 0, 0, 24), check(SenseWriteProtected)},
		{"TEST UNIT READY", disk(), cdb(0x00), good()},
		{"unknown opcode", disk(), cdb(0xc0), check(SenseInvalidOpcode)},
		{"READ(6) is not offered", disk(), cdb(0x08, 0, 0, 1, 1), check(SenseInvalidOpcode)},
		{"vendor-specific group", disk(), cdb(0xc0), check(SenseInvalidOpcode)},
		{"SERVICE ACTION IN other than READ CAPACITY", disk(), cdb(0x9e, 0x12), check(SenseInvalidField)},
		{"INQUIRY page code without EVPD", disk(), cdb(0x12, 0, 0x80, 0, 255), check(SenseInvalidField)},
		{"INQUIRY CMDDT", disk(), cdb(0x12, 2, 0, 0, 255), check(SenseInvalidField)},
		{"INQUIRY unknown page", disk(), cdb(0x12, 1, 0x89, 0, 255), check(SenseInvalidField)},
		{"READ CAPACITY(10) LBA without PMI", disk(), cdb(0x25, 0, 0, 0, 0, 1), check(SenseInvalidField)},
		{"MODE SENSE saved values", disk(), cdb(0x1a, 0, 0xc8, 0, 255), check(SenseSavingUnsupported)},
		{"MODE SENSE unknown page", disk(), cdb(0x1a, 0, 0x1c, 0, 255), check(SenseInvalidField)},
		{"MODE SENSE subpage", disk(), cdb(0x5a, 0, 0x0a, 0x05, 0, 0, 0, 0, 255), check(SenseInvalidField)},
		{"REPORT LUNS allocation below 16", disk(), cdb(0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 15), check(SenseInvalidField)},
		{"REPORT LUNS select report 0x10", disk(), cdb(0xa0, 0, 0x10, 0, 0, 0, 0, 0, 1, 0), check(SenseInvalidField)},
		{"empty CDB", disk(), nil, check(SenseInvalidField)},
		{"short CDB", disk(), []byte{0x88, 0, 0, 0}, check(SenseInvalidField)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.dev.Execute(&Nexus{}, c.cdb, nil)
			want := c.want
			if a.Status != want.Status || a.Sense != want.Sense || a.Op != want.Op || a.LBA != want.LBA ||
				a.Blocks != want.Blocks || a.FUA != want.FUA || a.Unmap != want.Unmap || a.NoData != want.NoData || a.DataOut != want.DataOut {
				t.Fatalf("got  %+v\nwant %+v", a, want)
			}
		})
	}
}

func TestUnmapList(t *testing.T) {
	d := disk()
	d.MaxUnmapDescriptors, d.MaxUnmapBlocks = 3, 1000
	list := func(descs ...[2]uint64) []byte {
		b := make([]byte, 8, 8+16*len(descs))
		be.PutUint16(b, uint16(6+16*len(descs)))
		be.PutUint16(b[2:], uint16(16*len(descs)))
		for _, x := range descs {
			b = be.AppendUint64(b, x[0])
			b = be.AppendUint32(b, uint32(x[1]))
			b = append(b, 0, 0, 0, 0)
		}
		return b
	}
	cases := []struct {
		name   string
		params []byte
		want   []Extent
		sense  Sense
	}{
		{"two extents", fieldhex.Bytes(t,
			"0026",             // 0 unmap data length 38
			"0020",             // 2 block descriptor data length 32
			"00000000",         // 4 reserved
			"0000000000000010", // 8 LBA 16
			"00000008",         // 16 blocks 8
			"00000000",         // 20 reserved
			"000000000003fff0", // 24 LBA 262128
			"00000010",         // 32 blocks 16: to the last block
			"00000000",
		), []Extent{{16, 8}, {262128, 16}}, SenseNone},
		{"zero-block descriptors skipped", list([2]uint64{5, 0}, [2]uint64{6, 1}), []Extent{{6, 1}}, SenseNone},
		{"partial last descriptor ignored", list([2]uint64{1, 1}, [2]uint64{2, 2})[:8+16+10], []Extent{{1, 1}}, SenseNone},
		{"lengths claiming less than arrived", func() []byte { b := list([2]uint64{1, 1}, [2]uint64{2, 2}); b[3] = 16; return b }(), []Extent{{1, 1}}, SenseNone},
		{"too many descriptors", list([2]uint64{1, 1}, [2]uint64{2, 1}, [2]uint64{3, 1}, [2]uint64{4, 1}), nil, SenseInvalidParam},
		{"too many blocks", list([2]uint64{1, 600}, [2]uint64{2000, 600}), nil, SenseInvalidParam},
		{"past the end", list([2]uint64{262143, 2}), nil, SenseLBAOutOfRange},
		{"short header", []byte{0, 6, 0, 0}, nil, SenseParamListLength},
	}
	for _, c := range cases {
		got, a := d.Unmap(c.params, make([]Extent, 0, 4))
		if c.sense != SenseNone {
			if a.Status != StatusCheckCondition || a.Sense != c.sense || len(got) != 0 {
				t.Errorf("%s: %v %v, extents %v", c.name, a.Status, a.Sense, got)
			}
			continue
		}
		if a.Status != StatusGood || a.Op != OpUnmap || len(got) != len(c.want) {
			t.Errorf("%s: %v %v %v, want %v", c.name, a.Status, a.Sense, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: extents %v, want %v", c.name, got, c.want)
			}
		}
	}
}

func TestSense(t *testing.T) {
	fixed := SenseInvalidField.AppendFixed(nil)
	want := fieldhex.Bytes(t,
		"70",       // 0 current error, fixed format
		"00",       // 1 obsolete
		"05",       // 2 ILLEGAL REQUEST
		"00000000", // 3 information
		"0a",       // 7 additional sense length 10
		"00000000", // 8 command-specific information
		"24", "00", // 12 ASC, ASCQ: INVALID FIELD IN CDB
		"00", "000000", // 14 FRU code, sense-key specific
	)
	if !bytes.Equal(fixed, want) {
		t.Fatalf("fixed sense\n% x\nwant\n% x", fixed, want)
	}
	desc := SenseCapacityChanged.AppendDescriptor(nil)
	if !bytes.Equal(desc, fieldhex.Bytes(t, "72", "06", "2a", "09", "000000", "00")) {
		t.Fatalf("descriptor sense % x", desc)
	}
	for _, b := range [][]byte{fixed, desc} {
		if _, err := ParseSense(b); err != nil {
			t.Errorf("ParseSense(% x): %v", b, err)
		}
	}
	if s, _ := ParseSense(desc); s != SenseCapacityChanged {
		t.Errorf("ParseSense descriptor = %v", s)
	}
	for _, bad := range [][]byte{nil, {0x70, 0, 5}, {0x72, 0}, {0x7f, 0, 0, 0}} {
		if _, err := ParseSense(bad); err == nil {
			t.Errorf("ParseSense(% x) accepted", bad)
		}
	}
	if got := SenseInvalidField.String(); got != "ILLEGAL REQUEST: INVALID FIELD IN CDB (24/00)" {
		t.Errorf("String = %q", got)
	}
}

// TestFromWire: every gosrp sense has a SCSI sense, and the ones an
// initiator acts on are the standard ones.
func TestFromWire(t *testing.T) {
	cases := []struct {
		in   wire.Sense
		op   Op
		want Sense
	}{
		{wire.SenseNone, OpRead, SenseNone},
		{wire.SenseInvalidField, OpWrite, SenseInvalidField},
		{wire.SenseOutOfRange, OpRead, SenseLBAOutOfRange},
		{wire.SenseMisaligned, OpWrite, SenseInvalidField},
		{wire.SenseWriteProtected, OpWrite, SenseWriteProtected},
		{wire.SenseUnsupported, OpUnmap, SenseInvalidOpcode},
		{wire.SenseMediumError, OpRead, SenseReadError},
		{wire.SenseMediumError, OpWrite, SenseWriteError},
		{wire.SenseMediumError, OpFlush, SenseWriteError},
		{wire.SenseNoSuchVolume, OpRead, SenseLUNotSupported},
		{wire.SenseDataTransfer, OpWrite, SenseDataPhaseError},
		{wire.SenseInternal, OpRead, SenseInternalFailure},
		{wire.SenseAccessDenied, OpWrite, SenseAccessDenied},
		{wire.SenseSpaceAllocFailed, OpWrite, SenseSpaceAllocFailed},
		{wire.SenseNotActive, OpWrite, SenseStandby},
		{wire.SenseBecomingReady, OpRead, SenseBecomingReady},
		{wire.Sense(999), OpRead, SenseInternalFailure},
	}
	for _, c := range cases {
		if got := FromWire(c.in, c.op); got != c.want {
			t.Errorf("FromWire(%v, %v) = %v, want %v", c.in, c.op, got, c.want)
		}
	}
}

// TestReadWriteAllocs: READ and WRITE are the hot path and allocate
// nothing.
func TestReadWriteAllocs(t *testing.T) {
	d, n := disk(), &Nexus{}
	r, w := cdb(0x28, 0, 0, 0, 0, 1, 0, 0, 8), cdb(0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 8)
	if allocs := testing.AllocsPerRun(100, func() {
		if d.Execute(n, r, nil).Op != OpRead || d.Execute(n, w, nil).Op != OpWrite {
			t.Fatal("not a read and a write")
		}
	}); allocs != 0 {
		t.Fatalf("READ and WRITE allocate %v times", allocs)
	}
}

// TestNexusIdle: a nexus is idle only with nothing to report, neither a
// unit attention nor a lost write cache's failures, which outlive the
// unit attention until a flush and a FUA write took them.
func TestNexusIdle(t *testing.T) {
	dev := disk()
	dev.WriteCache = true
	var n Nexus
	steps := []struct {
		do   func()
		idle bool
	}{
		{func() {}, true},
		{func() { n.Raise(CapacityChanged) }, false},
		{func() { dev.Execute(&n, []byte{0, 0, 0, 0, 0, 0}, nil) }, true},
		{func() { n.Raise(WriteCacheLost) }, false},
		{func() { dev.Execute(&n, []byte{0, 0, 0, 0, 0, 0}, nil) }, false}, // flush and FUA still owed
		{func() { dev.Execute(&n, []byte{0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil) }, false},
		{func() { dev.Execute(&n, []byte{0x2A, 0x08, 0, 0, 0, 0, 0, 0, 1, 0}, nil) }, true},
	}
	for i, s := range steps {
		s.do()
		if n.Idle() != s.idle {
			t.Fatalf("step %d: Idle %t, want %t (pending %s, owes loss %t)", i, n.Idle(), s.idle, n.Pending(), n.OwesLoss())
		}
	}
}
