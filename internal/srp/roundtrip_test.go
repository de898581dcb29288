package srp

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"
)

// cmdIU encodes c as a whole IU: with immediate data, zero padding up to
// imm and the data there, as a sender's scatter/gather list lays it out.
func cmdIU(t testing.TB, c *Cmd, imm int) []byte {
	t.Helper()
	b := make([]byte, c.EncodedLen())
	n, err := c.Encode(b)
	if err != nil {
		t.Fatalf("Encode %+v: %v", c, err)
	}
	b = b[:n]
	if c.DataOut.Format == FormatImmediate {
		b = append(b, make([]byte, imm-n)...)
		b = append(b, c.DataOut.Imm...)
	}
	return b
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func randDesc(r *rand.Rand) Descriptor {
	return Descriptor{VA: r.Uint64(), Key: r.Uint32(), Len: r.Uint32()}
}

func randBuffer(r *rand.Rand, out bool) DataBuffer {
	f := Format(r.IntN(3))
	if out && r.IntN(4) == 0 {
		f = FormatImmediate
	}
	d := DataBuffer{Format: f}
	switch f {
	case FormatDirect:
		d.Direct = randDesc(r)
	case FormatIndirect:
		n := r.IntN(20)
		descs := make([]Descriptor, n)
		for i := range descs {
			descs[i] = randDesc(r)
		}
		d.Table = Descriptor{VA: r.Uint64(), Key: r.Uint32(), Len: uint32(n+r.IntN(5)) * DescriptorLen}
		d.Total = r.Uint32()
		if err := d.SetPartial(descs, make([]byte, n*DescriptorLen)); err != nil {
			panic(err)
		}
	case FormatImmediate:
		d.Imm = randBytes(r, r.IntN(600))
		d.Total = uint32(len(d.Imm))
	}
	return d
}

// TestRoundTrip: for random IUs of every kind, Decode(Encode(x)) == x.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 1))
	var lun LUN
	for i := 0; i < 2000; i++ {
		copy(lun[:], randBytes(r, 8))
		var pid, tid [16]byte
		copy(pid[:], randBytes(r, 16))
		copy(tid[:], randBytes(r, 16))
		lr := LoginRequest{Tag: r.Uint64(), MaxITIULen: r.Uint32(), BufFormats: uint16(r.Uint32()), Flags: uint8(r.Uint32()),
			ImmDataOffset: uint16(r.Uint32()), InitiatorPortID: pid, TargetPortID: tid}
		b := make([]byte, LoginRequestLen)
		var got LoginRequest
		if _, err := lr.EncodeIB(b); err != nil || got.DecodeIB(b) != nil || got != lr {
			t.Fatalf("IB login %+v → %+v", lr, got)
		}
		got = LoginRequest{}
		if _, err := lr.EncodeRDMA(b); err != nil || got.DecodeRDMA(b) != nil || got != lr {
			t.Fatalf("RDMA login %+v → %+v", lr, got)
		}

		sense := randBytes(r, r.IntN(40))
		resp := randBytes(r, r.IntN(3)*4)
		flags := uint8(r.Uint32()) &^ (RspValid | SnsValid | DOOver | DIOver)
		if len(sense) > 0 {
			flags |= SnsValid
		}
		if len(resp) > 0 {
			flags |= RspValid
		}
		values := []struct{ in, out codec }{
			{&LoginResponse{ReqLimDelta: r.Uint32(), Tag: r.Uint64(), MaxITIULen: r.Uint32(), MaxTIIULen: r.Uint32(), BufFormats: uint16(r.Uint32()), Flags: uint8(r.Uint32())}, &LoginResponse{}},
			{&LoginReject{Reason: RejectReason(r.Uint32()), Tag: r.Uint64(), BufFormats: uint16(r.Uint32())}, &LoginReject{}},
			{&ILogout{Tag: r.Uint64()}, &ILogout{}},
			{&TLogout{SolNot: uint8(r.Uint32()), Reason: r.Uint32(), Tag: r.Uint64()}, &TLogout{}},
			{&TaskMgmt{SolNot: uint8(r.Uint32()), Tag: r.Uint64(), LUN: lun, Function: TaskFunc(r.Uint32()), TaskTag: r.Uint64()}, &TaskMgmt{}},
			{&CredReq{SolNot: uint8(r.Uint32()), ReqLimDelta: r.Uint32(), Tag: r.Uint64()}, &CredReq{}},
			{&TargetRsp{Op: []Opcode{OpCredRsp, OpAERRsp}[r.IntN(2)], Tag: r.Uint64()}, &TargetRsp{}},
			{&AERReq{SolNot: uint8(r.Uint32()), ReqLimDelta: r.Uint32(), Tag: r.Uint64(), LUN: lun, Sense: sense}, &AERReq{}},
			{&Rsp{SolNot: uint8(r.Uint32()), ReqLimDelta: r.Uint32(), Tag: r.Uint64(), Flags: flags, Status: uint8(r.Uint32()),
				DataOutResid: r.Uint32(), DataInResid: r.Uint32(), Resp: resp, Sense: sense}, &Rsp{}},
		}
		for _, v := range values {
			b := make([]byte, 128)
			n, err := v.in.Encode(b)
			if err != nil {
				t.Fatalf("Encode %+v: %v", v.in, err)
			}
			if err := v.out.Decode(b[:n]); err != nil || !reflect.DeepEqual(normalize(v.in), normalize(v.out)) {
				t.Fatalf("%+v → %+v, %v", v.in, v.out, err)
			}
		}

		c := Cmd{SolNot: uint8(r.Uint32()), Tag: r.Uint64(), LUN: lun, TaskAttr: uint8(r.IntN(8)),
			CDB: randBytes(r, CDBLen+4*r.IntN(64)), DataOut: randBuffer(r, true), DataIn: randBuffer(r, false)}
		imm := c.EncodedLen() + r.IntN(64)
		var gc Cmd
		if err := gc.Decode(cmdIU(t, &c, imm), imm); err != nil {
			t.Fatalf("Decode %+v: %v", c, err)
		}
		if !reflect.DeepEqual(normalize(&c), normalize(&gc)) {
			t.Fatalf("SRP_CMD %+v → %+v", c, gc)
		}
	}
}

// normalize makes empty slices nil, so a decoded IU (whose slices alias
// the buffer) compares equal to the one encoded.
func normalize(v any) any {
	switch x := v.(type) {
	case *AERReq:
		y := *x
		y.Sense = nilIfEmpty(y.Sense)
		return y
	case *Rsp:
		y := *x
		y.Resp, y.Sense = nilIfEmpty(y.Resp), nilIfEmpty(y.Sense)
		return y
	case *Cmd:
		y := *x
		for _, d := range []*DataBuffer{&y.DataOut, &y.DataIn} {
			d.Imm, d.partial = nilIfEmpty(d.Imm), nilIfEmpty(d.partial)
		}
		return y
	}
	return v
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// TestCmdDecodeAllocs: decoding an SRP_CMD is on the target's hot path
// and must not allocate.
func TestCmdDecodeAllocs(t *testing.T) {
	c := Cmd{CDB: make([]byte, 16), DataOut: DataBuffer{Format: FormatImmediate, Total: 512, Imm: make([]byte, 512)}}
	iu := cmdIU(t, &c, 68)
	var got Cmd
	if n := testing.AllocsPerRun(100, func() {
		if err := got.Decode(iu, 68); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Cmd.Decode allocates %v times", n)
	}
	rsp := Rsp{Tag: 1, ReqLimDelta: 1, Flags: SnsValid, Sense: make([]byte, 18)}
	buf := make([]byte, 64)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := rsp.Encode(buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Rsp.Encode allocates %v times", n)
	}
	if !bytes.Equal(got.DataOut.Imm, c.DataOut.Imm) {
		t.Fatal("immediate data lost")
	}
}
