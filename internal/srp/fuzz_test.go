package srp

import (
	"bytes"
	"testing"
)

// Each decoder has a fuzz target: whatever the bytes, Decode returns an
// error or a value that encodes, and what it encodes decodes and encodes
// again to the same bytes (decoding is a function of the bytes it reads).

// stable checks the encode/decode/encode property for one decoded value.
func stable(t *testing.T, v codec, fresh func() codec) {
	t.Helper()
	b := make([]byte, 4096)
	n, err := v.Encode(b)
	if err != nil {
		t.Fatalf("decoded %+v does not encode: %v", v, err)
	}
	w := fresh()
	if err := w.Decode(b[:n]); err != nil {
		t.Fatalf("re-encoded %+v does not decode: %v", v, err)
	}
	b2 := make([]byte, 4096)
	n2, err := w.Encode(b2)
	if err != nil || !bytes.Equal(b[:n], b2[:n2]) {
		t.Fatalf("encode(decode(encode(x))) differs: %v\n% x\n% x", err, b[:n], b2[:n2])
	}
}

func fuzzCodec(f *testing.F, fresh func() codec, seeds ...codec) {
	for _, s := range seeds {
		b := make([]byte, 256)
		n, err := s.Encode(b)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:n])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v := fresh()
		if v.Decode(b) != nil {
			return
		}
		stable(t, v, fresh)
	})
}

// ibLogin and rdmaLogin give the two layouts of SRP_LOGIN_REQ the codec
// methods the other IUs have.
type (
	ibLogin   struct{ LoginRequest }
	rdmaLogin struct{ LoginRequest }
)

func (l *ibLogin) Encode(b []byte) (int, error)   { return l.EncodeIB(b) }
func (l *ibLogin) Decode(b []byte) error          { return l.DecodeIB(b) }
func (l *rdmaLogin) Encode(b []byte) (int, error) { return l.EncodeRDMA(b) }
func (l *rdmaLogin) Decode(b []byte) error        { return l.DecodeRDMA(b) }

func FuzzLoginRequestIB(f *testing.F) {
	fuzzCodec(f, func() codec { return &ibLogin{} }, &ibLogin{login})
}

func FuzzLoginRequestRDMA(f *testing.F) {
	fuzzCodec(f, func() codec { return &rdmaLogin{} }, &rdmaLogin{login})
}

func FuzzLoginResponse(f *testing.F) {
	fuzzCodec(f, func() codec { return &LoginResponse{} }, &LoginResponse{ReqLimDelta: 64, MaxITIULen: 8260, Flags: ImmediateSupported})
}

func FuzzLoginReject(f *testing.F) {
	fuzzCodec(f, func() codec { return &LoginReject{} }, &LoginReject{Reason: RejectChannelLimit})
}

func FuzzILogout(f *testing.F) {
	fuzzCodec(f, func() codec { return &ILogout{} }, &ILogout{Tag: 1})
}

func FuzzTLogout(f *testing.F) {
	fuzzCodec(f, func() codec { return &TLogout{} }, &TLogout{Reason: 4})
}

func FuzzTaskMgmt(f *testing.F) {
	fuzzCodec(f, func() codec { return &TaskMgmt{} }, &TaskMgmt{Function: TaskLUNReset, TaskTag: ^uint64(0)})
}

func FuzzCredReq(f *testing.F) {
	fuzzCodec(f, func() codec { return &CredReq{} }, &CredReq{ReqLimDelta: 4})
}

func FuzzTargetRsp(f *testing.F) {
	fuzzCodec(f, func() codec { return &TargetRsp{} }, &TargetRsp{Op: OpCredRsp}, &TargetRsp{Op: OpAERRsp})
}

func FuzzAERReq(f *testing.F) {
	fuzzCodec(f, func() codec { return &AERReq{} }, &AERReq{Sense: []byte{0x70, 0, 6, 0, 0, 0, 0, 10}})
}

func FuzzRsp(f *testing.F) {
	fuzzCodec(f, func() codec { return &Rsp{} },
		&Rsp{Tag: 1, Flags: SnsValid | DIUnder, Status: 2, DataInResid: 512, Sense: make([]byte, 18)},
		&Rsp{Tag: 2, Flags: RspValid, Resp: []byte{0, 0, 0, 4}})
}

func FuzzCmd(f *testing.F) {
	seeds := []Cmd{
		{CDB: []byte{0x28, 0, 0, 0, 0, 1, 0, 0, 8, 0}, DataIn: DataBuffer{Format: FormatDirect, Direct: Descriptor{VA: 1, Key: 2, Len: 4096}}},
		{CDB: make([]byte, 32), DataOut: DataBuffer{Format: FormatImmediate, Total: 8, Imm: []byte("12345678")}},
	}
	ind := Cmd{CDB: make([]byte, 16), DataIn: DataBuffer{Format: FormatIndirect, Table: Descriptor{Len: 48}, Total: 3}}
	if err := ind.DataIn.SetPartial([]Descriptor{{Len: 1}, {Len: 2}}, make([]byte, 32)); err != nil {
		f.Fatal(err)
	}
	seeds = append(seeds, ind)
	for i := range seeds {
		f.Add(cmdIU(f, &seeds[i], 68), uint16(68))
	}
	f.Fuzz(func(t *testing.T, b []byte, imm uint16) {
		var c Cmd
		if c.Decode(b, int(imm)) != nil {
			return
		}
		if c.DataOut.Format == FormatImmediate && int(imm) < c.EncodedLen() {
			t.Fatalf("immediate data at %d inside the %d-byte command", imm, c.EncodedLen())
		}
		iu := cmdIU(t, &c, int(imm))
		var c2 Cmd
		if err := c2.Decode(iu, int(imm)); err != nil {
			t.Fatalf("re-encoded %+v: %v", c, err)
		}
		if !bytes.Equal(cmdIU(t, &c2, int(imm)), iu) {
			t.Fatal("encode(decode(encode(x))) differs")
		}
	})
}
