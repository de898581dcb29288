package srp

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/fieldhex"
	"github.com/gosrp/gosrp/transport"
)

var (
	ipid = [16]byte{0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22}
	tpid = [16]byte{0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44}
	// login is what ib_srp sends (srp_send_req) with immediate data on:
	// DIRECT|INDIRECT, single channel, immediate data at 68.
	login = LoginRequest{Tag: 0x0102030405060708, MaxITIULen: 8260, BufFormats: BufFormatDirect | BufFormatIndirect,
		Flags: MultiChanSingle | ImmediateRequested, ImmDataOffset: 68, InitiatorPortID: ipid, TargetPortID: tpid}
)

func TestLoginRequestIB(t *testing.T) {
	want := fieldhex.Bytes(t,
		"00",                               // 0 opcode SRP_LOGIN_REQ
		"00000000000000",                   // 1 reserved
		"0102030405060708",                 // 8 tag
		"00002044",                         // 16 req_it_iu_len 8260
		"00000000",                         // 20 reserved
		"0006",                             // 24 req_buf_fmt DIRECT|INDIRECT
		"80",                               // 26 req_flags IMMED_REQUESTED, MULTICHAN_SINGLE
		"00",                               // 27 reserved
		"0044",                             // 28 imm_data_offset 68
		"0000",                             // 30 reserved
		"11111111111111112222222222222222", // 32 initiator_port_id
		"33333333333333334444444444444444", // 48 target_port_id
	)
	b := make([]byte, 92) // an IB CM REQ's private data
	n, err := login.EncodeIB(b)
	if err != nil || n != LoginRequestLen || !bytes.Equal(b[:n], want) {
		t.Fatalf("EncodeIB = %d, %v\n% x\nwant\n% x", n, err, b[:n], want)
	}
	var got LoginRequest
	if err := got.DecodeIB(b); err != nil || got != login {
		t.Fatalf("DecodeIB = %+v, %v", got, err)
	}
}

func TestLoginRequestRDMA(t *testing.T) {
	if LoginRequestRDMALen != transport.MaxConnectPrivateData {
		t.Fatalf("the RDMA-CM login is %d bytes, the connect private data %d", LoginRequestRDMALen, transport.MaxConnectPrivateData)
	}
	want := fieldhex.Bytes(t,
		"0102030405060708",                 // 0 tag
		"0006",                             // 8 req_buf_fmt
		"80",                               // 10 req_flags
		"00",                               // 11 opcode SRP_LOGIN_REQ
		"00002044",                         // 12 req_it_iu_len
		"11111111111111112222222222222222", // 16 initiator_port_id
		"33333333333333334444444444444444", // 32 target_port_id
		"0044",                             // 48 imm_data_offset
		"000000000000",                     // 50 reserved
	)
	b := make([]byte, LoginRequestRDMALen)
	n, err := login.EncodeRDMA(b)
	if err != nil || n != LoginRequestRDMALen || !bytes.Equal(b, want) {
		t.Fatalf("EncodeRDMA = %d, %v\n% x\nwant\n% x", n, err, b, want)
	}
	var got LoginRequest
	if err := got.DecodeRDMA(want); err != nil || got != login {
		t.Fatalf("DecodeRDMA = %+v, %v", got, err)
	}
	// A gosrp hello (or anything else) of the same size is no SRP login.
	want[11] = 0x47
	if err := got.DecodeRDMA(want); !errors.Is(err, ErrMalformed) {
		t.Fatalf("DecodeRDMA with opcode 0x47 = %v, want ErrMalformed", err)
	}
}

func TestLoginResponseAndReject(t *testing.T) {
	rsp := LoginResponse{ReqLimDelta: 128, Tag: 7, MaxITIULen: 8260, MaxTIIULen: 292,
		BufFormats: BufFormatDirect | BufFormatIndirect, Flags: MultiChanNoChannel | ImmediateSupported}
	want := fieldhex.Bytes(t,
		"c0",               // 0 opcode SRP_LOGIN_RSP
		"000000",           // 1 reserved
		"00000080",         // 4 req_lim_delta 128
		"0000000000000007", // 8 tag
		"00002044",         // 16 max_it_iu_len
		"00000124",         // 20 max_ti_iu_len 292
		"0006",             // 24 sup_buf_fmt
		"80",               // 26 rsp_flags IMMED_SUPP
		"00000000000000000000000000000000000000000000000000", // 27 reserved [25]
	)
	checkLayout(t, "SRP_LOGIN_RSP", &rsp, want, &LoginResponse{})

	rej := LoginReject{Reason: RejectITIULenTooLarge, Tag: 7, BufFormats: BufFormatDirect | BufFormatIndirect}
	want = fieldhex.Bytes(t,
		"c2",               // 0 opcode SRP_LOGIN_REJ
		"000000",           // 1 reserved
		"00010002",         // 4 reason: it_iu_len too large (ib_srpt's 0x10002)
		"0000000000000007", // 8 tag
		"0000000000000000", // 16 reserved
		"0006",             // 24 sup_buf_fmt
		"000000000000",     // 26 reserved
	)
	checkLayout(t, "SRP_LOGIN_REJ", &rej, want, &LoginReject{})
	if got := rej.Reason.String(); got != "requested maximum initiator to target IU length too large" {
		t.Errorf("reason %q", got)
	}
	if got := RejectReason(0x20000).String(); got != "RejectReason(0x20000)" {
		t.Errorf("unknown reason %q", got)
	}
}

func TestSmallIUs(t *testing.T) {
	lun := LUN{0, 5, 0, 0, 0, 0, 0, 0}
	cases := []struct {
		name string
		iu   codec
		want []byte
		into codec
	}{
		{"SRP_I_LOGOUT", &ILogout{Tag: 9}, fieldhex.Bytes(t,
			"03",               // 0 opcode
			"00000000000000",   // 1 reserved
			"0000000000000009", // 8 tag
		), &ILogout{}},
		{"SRP_T_LOGOUT", &TLogout{SolNot: 1, Reason: 4, Tag: 9}, fieldhex.Bytes(t,
			"80",               // 0 opcode
			"01",               // 1 sol_not
			"0000",             // 2 reserved
			"00000004",         // 4 reason
			"0000000000000009", // 8 tag
		), &TLogout{}},
		{"SRP_TSK_MGMT", &TaskMgmt{Tag: 0x80000001, LUN: lun, Function: TaskAbortTask, TaskTag: 0x2a}, fieldhex.Bytes(t,
			"01",               // 0 opcode
			"00",               // 1 sol_not
			"000000000000",     // 2 reserved
			"0000000080000001", // 8 tag (ib_srp: SRP_TAG_TSK_MGMT set)
			"00000000",         // 16 reserved
			"0005000000000000", // 20 lun 5
			"0000",             // 28 reserved
			"01",               // 30 tsk_mgmt_func ABORT TASK
			"00",               // 31 reserved
			"000000000000002a", // 32 task_tag
			"0000000000000000", // 40 reserved
		), &TaskMgmt{}},
		{"SRP_CRED_REQ", &CredReq{ReqLimDelta: 3, Tag: 9}, fieldhex.Bytes(t,
			"81",               // 0 opcode
			"00",               // 1 sol_not
			"0000",             // 2 reserved
			"00000003",         // 4 req_lim_delta
			"0000000000000009", // 8 tag
		), &CredReq{}},
		{"SRP_CRED_RSP", &TargetRsp{Op: OpCredRsp, Tag: 9}, fieldhex.Bytes(t,
			"41",               // 0 opcode
			"00000000000000",   // 1 reserved
			"0000000000000009", // 8 tag
		), &TargetRsp{}},
		{"SRP_AER_RSP", &TargetRsp{Op: OpAERRsp, Tag: 9}, fieldhex.Bytes(t,
			"42",               // 0 opcode
			"00000000000000",   // 1 reserved
			"0000000000000009", // 8 tag
		), &TargetRsp{}},
		{"SRP_AER_REQ", &AERReq{ReqLimDelta: 1, Tag: 9, LUN: lun, Sense: []byte{0x70, 0, 6}}, fieldhex.Bytes(t,
			"82",               // 0 opcode
			"00",               // 1 sol_not
			"0000",             // 2 reserved
			"00000001",         // 4 req_lim_delta
			"0000000000000009", // 8 tag
			"00000000",         // 16 reserved
			"0005000000000000", // 20 lun
			"00000003",         // 28 sense_data_len
			"00000000",         // 32 reserved
			"700006",           // 36 sense data
		), &AERReq{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkLayout(t, c.name, c.iu, c.want, c.into) })
	}
}

// codec is what every IU here offers.
type codec interface {
	Encode([]byte) (int, error)
	Decode([]byte) error
}

// checkLayout encodes iu, compares with want, decodes want into into and
// encodes that again: the bytes must survive unchanged.
func checkLayout(t *testing.T, name string, iu codec, want []byte, into codec) {
	t.Helper()
	b := make([]byte, len(want)+8)
	n, err := iu.Encode(b)
	if err != nil || !bytes.Equal(b[:n], want) {
		t.Fatalf("%s Encode = %d, %v\n% x\nwant\n% x", name, n, err, b[:n], want)
	}
	if err := into.Decode(want); err != nil {
		t.Fatalf("%s Decode: %v", name, err)
	}
	n, err = into.Encode(b)
	if err != nil || !bytes.Equal(b[:n], want) {
		t.Fatalf("%s Decode then Encode = %d, %v\n% x\nwant\n% x", name, n, err, b[:n], want)
	}
	if _, err := iu.Encode(b[:len(want)-1]); !errors.Is(err, ErrTooLarge) {
		t.Errorf("%s Encode into %d bytes = %v, want ErrTooLarge", name, len(want)-1, err)
	}
	if err := into.Decode(want[:len(want)-1]); !errors.Is(err, ErrMalformed) {
		t.Errorf("%s Decode of %d bytes = %v, want ErrMalformed", name, len(want)-1, err)
	}
}

func TestCmdLayouts(t *testing.T) {
	read10 := []byte{0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0}
	t.Run("direct data-in", func(t *testing.T) {
		// A 4 KiB READ(10) as ib_srp sends it with one registered
		// region: 48 bytes, then one direct descriptor.
		c := Cmd{Tag: 0x11, LUN: LUN{0, 1}, CDB: read10,
			DataIn: DataBuffer{Format: FormatDirect, Direct: Descriptor{VA: 0xffff888012345000, Key: 0x1234, Len: 4096}}}
		want := fieldhex.Bytes(t,
			"02",                               // 0 opcode SRP_CMD
			"00",                               // 1 sol_not
			"000000",                           // 2 reserved
			"01",                               // 5 buf_fmt: data-out none, data-in direct
			"00",                               // 6 data_out_desc_cnt
			"00",                               // 7 data_in_desc_cnt (0 for direct, as ib_srp)
			"0000000000000011",                 // 8 tag
			"00000000",                         // 16 reserved
			"0001000000000000",                 // 20 lun 1
			"00",                               // 28 reserved
			"00",                               // 29 task_attr SIMPLE
			"00",                               // 30 reserved
			"00",                               // 31 add_cdb_len
			"28000000100000000800000000000000", // 32 cdb READ(10), zero-padded
			"ffff888012345000",                 // 48 va
			"00001234",                         // 56 key
			"00001000",                         // 60 len
		)
		got := checkCmd(t, &c, want, 0)
		if !bytes.Equal(got.CDB, append(read10, 0, 0, 0, 0, 0, 0)) || got.DataIn.Len() != 4096 || got.DataOut.Format != FormatNone {
			t.Fatalf("decoded %+v", got)
		}
	})
	t.Run("indirect data-out, partial table", func(t *testing.T) {
		// Three regions, two of them inline (cmd_sg_entries 2): the
		// target fetches the third through Table.
		c := Cmd{Tag: 0x12, CDB: []byte{0x2a, 0, 0, 0, 0, 0, 0, 0, 24, 0}, TaskAttr: TaskOrdered}
		c.DataOut = DataBuffer{Format: FormatIndirect, Table: Descriptor{VA: 0xa000, Key: 0x77, Len: 48}, Total: 12288}
		descs := []Descriptor{{VA: 0x1000, Key: 1, Len: 4096}, {VA: 0x3000, Key: 2, Len: 4096}}
		if err := c.DataOut.SetPartial(descs, make([]byte, 32)); err != nil {
			t.Fatal(err)
		}
		want := fieldhex.Bytes(t,
			"02", "00", "000000",
			"20",               // 5 buf_fmt: data-out indirect
			"02",               // 6 data_out_desc_cnt: 2 inline
			"00",               // 7 data_in_desc_cnt
			"0000000000000012", // 8 tag
			"00000000", "0000000000000000", "00",
			"02",       // 29 task_attr ORDERED
			"00", "00", // 30, 31
			"2a000000000000001800000000000000",         // 32 cdb WRITE(10)
			"000000000000a000", "00000077", "00000030", // 48 table descriptor: 48 bytes = 3 entries
			"00003000",                                 // 64 total length 12288
			"0000000000001000", "00000001", "00001000", // 68 partial[0]
			"0000000000003000", "00000002", "00001000", // 84 partial[1]
		)
		got := checkCmd(t, &c, want, 0)
		if got.DataOut.Count != 2 || got.DataOut.Partial(1) != descs[1] || got.DataOut.Len() != 12288 || got.TaskAttr != TaskOrdered {
			t.Fatalf("decoded %+v", got.DataOut)
		}
	})
	t.Run("immediate data-out, 32-byte CDB", func(t *testing.T) {
		// A 32-byte CDB fills ADDITIONAL CDB with 16 bytes, which is why
		// ib_srp puts immediate data at 48+16+4 = 68.
		cdb := make([]byte, 32)
		cdb[0], cdb[31] = 0x7f, 0xee
		data := []byte("immediate!!!")
		c := Cmd{Tag: 0x13, CDB: cdb, DataOut: DataBuffer{Format: FormatImmediate, Total: uint32(len(data)), Imm: data}}
		want := fieldhex.Bytes(t,
			"02", "00", "000000",
			"30",       // 5 buf_fmt: data-out immediate
			"00", "00", // 6, 7
			"0000000000000013", // 8 tag
			"00000000", "0000000000000000", "00", "00", "00",
			"10",                               // 31 add_cdb_len: 16 bytes (4 words << 2)
			"7f000000000000000000000000000000", // 32 cdb[0:16]
			"000000000000000000000000000000ee", // 48 additional CDB
			"0000000c",                         // 64 immediate descriptor: 12 bytes
		)
		want = append(want, data...) // 68: the data, at the login's offset
		b := make([]byte, 68)
		n, err := c.Encode(b)
		if err != nil || n != 68 || !bytes.Equal(b, want[:68]) {
			t.Fatalf("Encode = %d, %v\n% x\nwant\n% x", n, err, b, want[:68])
		}
		var got Cmd
		if err := got.Decode(want, 68); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.CDB, cdb) || !bytes.Equal(got.DataOut.Imm, data) || got.DataOut.Len() != 12 {
			t.Fatalf("decoded CDB % x, imm %q", got.CDB, got.DataOut.Imm)
		}
	})
}

// checkCmd encodes c, compares with want, decodes want and encodes the
// result again.
func checkCmd(t *testing.T, c *Cmd, want []byte, imm int) *Cmd {
	t.Helper()
	b := make([]byte, c.EncodedLen())
	n, err := c.Encode(b)
	if err != nil || !bytes.Equal(b[:n], want) {
		t.Fatalf("Encode = %d, %v\n% x\nwant\n% x", n, err, b[:n], want)
	}
	var got Cmd
	if err := got.Decode(want, imm); err != nil {
		t.Fatal(err)
	}
	b2 := make([]byte, got.EncodedLen())
	if n, err := got.Encode(b2); err != nil || !bytes.Equal(b2[:n], want) {
		t.Fatalf("Decode then Encode = %d, %v\n% x", n, err, b2[:n])
	}
	return &got
}

func TestRspLayout(t *testing.T) {
	sense := []byte{0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0}
	r := Rsp{ReqLimDelta: 1, Tag: 0x11, Flags: SnsValid | DIUnder, Status: 0x02, DataInResid: 4096, Sense: sense}
	want := fieldhex.Bytes(t,
		"c1",                                    // 0 opcode SRP_RSP
		"00",                                    // 1 sol_not
		"0000",                                  // 2 reserved
		"00000001",                              // 4 req_lim_delta
		"0000000000000011",                      // 8 tag
		"0000",                                  // 16 reserved
		"22",                                    // 18 flags SNSVALID|DIUNDER
		"02",                                    // 19 status CHECK CONDITION
		"00000000",                              // 20 data_out_res_cnt
		"00001000",                              // 24 data_in_res_cnt
		"00000012",                              // 28 sense_data_len 18
		"00000000",                              // 32 resp_data_len
		"700005000000000a000000002400000000 00", // 36 fixed-format sense: ILLEGAL REQUEST, INVALID FIELD IN CDB
	)
	checkLayout(t, "SRP_RSP", &r, want, &Rsp{})

	// A task management answer, as ib_srpt's srpt_build_tskmgmt_rsp.
	tm := Rsp{ReqLimDelta: 1, Tag: 0x80000001, Flags: RspValid, Resp: []byte{0, 0, 0, TaskNotSupported}}
	want = fieldhex.Bytes(t,
		"c1", "00", "0000", "00000001", "0000000080000001", "0000",
		"01",                               // 18 flags RSPVALID
		"00",                               // 19 status
		"00000000", "00000000", "00000000", // 20..31
		"00000004", // 32 resp_data_len
		"00000004", // 36 response data: RSP_CODE in byte 3
	)
	checkLayout(t, "SRP_RSP task management", &tm, want, &Rsp{})
}

func TestDecodeErrors(t *testing.T) {
	cmd := func(edit func(b []byte) []byte) []byte {
		b := make([]byte, 64)
		b[0] = byte(OpCmd)
		b[5] = 0x01 // data-in direct
		return edit(b)
	}
	cases := []struct {
		name   string
		decode func() error
		msg    string
	}{
		{"empty", func() error { _, err := PeekOpcode(nil); return err }, "empty IU"},
		{"short login", func() error { var r LoginRequest; return r.DecodeIB(make([]byte, 63)) }, "want at least 64"},
		{"login opcode", func() error {
			var r LoginRequest
			b := make([]byte, 64)
			b[0] = 0xc1
			return r.DecodeIB(b)
		}, "opcode SRP_RSP where SRP_LOGIN_REQ"},
		{"short rdma login", func() error { var r LoginRequest; return r.DecodeRDMA(make([]byte, 55)) }, "RDMA-CM SRP_LOGIN_REQ of 55 bytes"},
		{"short cmd", func() error { var c Cmd; return c.Decode(make([]byte, 47), 0) }, "want at least 48"},
		{"add cdb past end", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[31] = 20; return b }), 0)
		}, "with 20 additional CDB bytes"},
		{"direct past end", func() error { var c Cmd; return c.Decode(cmd(func(b []byte) []byte { return b[:63] }), 0) }, "data-in direct descriptor at 48 runs past"},
		{"unknown format", func() error { var c Cmd; return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x50; return b }), 0) }, "data-out descriptor format 5"},
		{"data-in immediate", func() error { var c Cmd; return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x03; return b }), 68) }, "data-in format immediate"},
		{"immediate not agreed", func() error { var c Cmd; return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x30; return b }), 0) }, "login did not accept"},
		{"immediate inside descriptor", func() error { var c Cmd; return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x30; return b }), 50) }, "starts before its descriptor ends at 52"},
		{"immediate past end", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x30; b[51] = 1; return append(b, make([]byte, 4)...) }), 68)
		}, "1 bytes of immediate data at 68 run past the IU's 68 bytes"},
		{"immediate over data-in descriptor", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x31; return append(b, make([]byte, 16)...) }), 52)
		}, "overlaps the data-in descriptor"},
		{"indirect count past end", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x02; b[7] = 2; return b }), 0)
		}, "2 descriptors inline at 48 runs past"},
		{"indirect table not whole", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x02; b[63] = 17; return append(b, make([]byte, 4)...) }), 0)
		}, "table of 17 bytes is not whole"},
		{"indirect inline exceeds table", func() error {
			var c Cmd
			return c.Decode(cmd(func(b []byte) []byte { b[5] = 0x02; b[7] = 1; b[63] = 0; return append(b, make([]byte, 20)...) }), 0)
		}, "table of 0 descriptors has 1 inline"},
		{"rsp sense past end", func() error {
			var r Rsp
			b := make([]byte, 40)
			b[0], b[18], b[31] = byte(OpRsp), SnsValid, 5
			return r.Decode(b)
		}, "claims 0 bytes of response data and 5 of sense"},
		{"rsp huge lengths", func() error {
			var r Rsp
			b := make([]byte, 40)
			b[0], b[18] = byte(OpRsp), SnsValid|RspValid
			copy(b[28:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return r.Decode(b)
		}, "claims 4294967295 bytes of response data"},
		{"rsp flag without data", func() error {
			var r Rsp
			b := make([]byte, 36)
			b[0], b[18] = byte(OpRsp), RspValid
			return r.Decode(b)
		}, "RSPVALID true and 0 bytes"},
		{"aer sense past end", func() error {
			var r AERReq
			b := make([]byte, 36)
			b[0], b[31] = byte(OpAERReq), 1
			return r.Decode(b)
		}, "claims 1 bytes of sense data, 0 follow"},
		{"target rsp opcode", func() error { var r TargetRsp; return r.Decode(make([]byte, 16)) }, "SRP_CRED_RSP or SRP_AER_RSP was expected"},
	}
	for _, c := range cases {
		err := c.decode()
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want ErrMalformed saying %q", c.name, err, c.msg)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	cases := []struct {
		name string
		enc  func() error
	}{
		{"CDB too long", func() error { c := Cmd{CDB: make([]byte, 269)}; _, err := c.Encode(make([]byte, 1024)); return err }},
		{"data-in immediate", func() error {
			c := Cmd{CDB: make([]byte, 16), DataIn: DataBuffer{Format: FormatImmediate}}
			_, err := c.Encode(make([]byte, 1024))
			return err
		}},
		{"immediate length mismatch", func() error {
			c := Cmd{CDB: make([]byte, 16), DataOut: DataBuffer{Format: FormatImmediate, Total: 3, Imm: []byte{1}}}
			_, err := c.Encode(make([]byte, 1024))
			return err
		}},
		{"indirect without SetPartial", func() error {
			c := Cmd{CDB: make([]byte, 16), DataIn: DataBuffer{Format: FormatIndirect, Count: 2}}
			_, err := c.Encode(make([]byte, 1024))
			return err
		}},
		{"rsp sense without flag", func() error { r := Rsp{Sense: []byte{0x70}}; _, err := r.Encode(make([]byte, 64)); return err }},
		{"rsp both overflow and underflow", func() error { r := Rsp{Flags: DIOver | DIUnder}; _, err := r.Encode(make([]byte, 64)); return err }},
		{"target rsp opcode", func() error { r := TargetRsp{Op: OpRsp}; _, err := r.Encode(make([]byte, 64)); return err }},
		{"partial too large", func() error { var d DataBuffer; return d.SetPartial(make([]Descriptor, 256), make([]byte, 4096)) }},
		{"partial scratch small", func() error { var d DataBuffer; return d.SetPartial(make([]Descriptor, 2), make([]byte, 31)) }},
	}
	for _, c := range cases {
		if err := c.enc(); err == nil {
			t.Errorf("%s: encoded", c.name)
		}
	}
}

func TestOpcodeNames(t *testing.T) {
	for op, name := range map[Opcode]string{OpLoginReq: "SRP_LOGIN_REQ", OpCmd: "SRP_CMD", OpRsp: "SRP_RSP",
		OpAERReq: "SRP_AER_REQ", OpTLogout: "SRP_T_LOGOUT", 0x99: "Opcode(0x99)"} {
		if op.String() != name {
			t.Errorf("%#x: %q, want %q", uint8(op), op.String(), name)
		}
	}
}
