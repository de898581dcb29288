package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCommandRoundTrip(t *testing.T) {
	cases := []Command{
		{Op: OpRead, Tag: 1, Offset: 4096, Length: 8192, Volume: 3, Flags: FlagInvalidate, InvalidateKey: 0x1234_56,
			NDesc: 1, Desc: [MaxDescriptors]Descriptor{{VA: 0x7f00_0000_1000, RKey: 0x1234_56, Len: 8192}}},
		{Op: OpWrite, Flags: FlagFUA, Tag: ^uint64(0), Offset: 1 << 50, Length: 3 * 4096, NDesc: 3,
			Desc: [MaxDescriptors]Descriptor{{VA: 1, RKey: 2, Len: 4096}, {VA: 3, RKey: 4, Len: 4096}, {VA: 5, RKey: 6, Len: 4096}}},
		{Op: OpFlush, Tag: 9},
		{Op: OpDiscard, Tag: 10, Offset: 0, Length: 1 << 30},
		{Op: OpWriteZeroes, Tag: 11, Offset: 512, Length: 512},
	}
	for _, c := range cases {
		t.Run(c.Op.String(), func(t *testing.T) {
			b := make([]byte, MaxCommandLen)
			n, err := c.Encode(b)
			require.NoError(t, err)
			require.Equal(t, c.EncodedLen(), n)
			var got Command
			require.NoError(t, got.Decode(b[:n]))
			require.Equal(t, c, got)
		})
	}
}

func TestCommandDecodeRejects(t *testing.T) {
	good := Command{Op: OpWrite, Tag: 1, Length: 4096, NDesc: 1, Desc: [MaxDescriptors]Descriptor{{VA: 1, RKey: 2, Len: 4096}}}
	enc := func(mut func(b []byte) []byte) []byte {
		b := make([]byte, MaxCommandLen)
		n, _ := good.Encode(b)
		return mut(b[:n])
	}
	cases := map[string][]byte{
		"empty":             {},
		"short":             enc(func(b []byte) []byte { return b[:CommandHeaderLen-1] }),
		"wrong opcode":      enc(func(b []byte) []byte { b[0] = byte(OpResponse); return b }),
		"bad op":            enc(func(b []byte) []byte { b[1] = 99; return b }),
		"bad flags":         enc(func(b []byte) []byte { b[2] = 0x80; return b }),
		"too many desc":     enc(func(b []byte) []byte { b[3] = MaxDescriptors + 1; return b }),
		"desc count vs len": enc(func(b []byte) []byte { b[3] = 2; return b }),
		"reserved":          enc(func(b []byte) []byte { b[35] = 1; return b }),
		"length mismatch":   enc(func(b []byte) []byte { b[24] = 1; return b }),
		"trailing bytes":    enc(func(b []byte) []byte { return append(b, 0) }),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			var c Command
			err := c.Decode(b)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
		})
	}
}

// TestCommandImmediate: a WRITE's immediate data follows the header; Encode
// writes the header alone (the sender gathers the data), Decode hands the
// data back as a view of the IU, and the combinations immediate data
// cannot have are refused both ways.
func TestCommandImmediate(t *testing.T) {
	data := bytes.Repeat([]byte("gosrp..."), 1024)
	c := Command{Op: OpWrite, Flags: FlagImmediate | FlagFUA, Volume: 2, Tag: 77, Offset: 8192, Length: uint32(len(data))}
	b := make([]byte, MaxCommandLen)
	n, err := c.Encode(b)
	require.NoError(t, err)
	require.Equal(t, CommandHeaderLen, n)
	iu := append(b[:n:n], data...)
	var got Command
	require.NoError(t, got.Decode(iu))
	require.Equal(t, data, got.Immediate)
	require.Same(t, &iu[CommandHeaderLen], &got.Immediate[0], "immediate data is a view of the IU, not a copy")
	got.Immediate = nil
	require.Equal(t, c, got)
	// A command without the flag has no immediate data, even when the
	// Command it is decoded into had some before.
	plain := Command{Op: OpFlush, Tag: 1}
	n, _ = plain.Encode(b)
	require.NoError(t, got.Decode(iu))
	require.NoError(t, got.Decode(b[:n]))
	require.Nil(t, got.Immediate)

	bad := map[string]Command{
		"read":       {Op: OpRead, Flags: FlagImmediate, Length: 4096},
		"discard":    {Op: OpDiscard, Flags: FlagImmediate, Length: 4096},
		"descriptor": {Op: OpWrite, Flags: FlagImmediate, Length: 4096, NDesc: 1, Desc: [MaxDescriptors]Descriptor{{Len: 4096}}},
		"invalidate": {Op: OpWrite, Flags: FlagImmediate | FlagInvalidate, Length: 4096, InvalidateKey: 5},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := c.Encode(make([]byte, MaxCommandLen))
			require.ErrorIs(t, err, ErrMalformed)
			// The same header built by hand does not decode either.
			h := make([]byte, CommandHeaderLen+4096)
			good := Command{Op: OpWrite, Flags: FlagImmediate, Length: 4096}
			good.Encode(h)
			h[1], h[2], h[3] = byte(c.Op), c.Flags, byte(c.NDesc)
			require.ErrorIs(t, got.Decode(h), ErrMalformed)
		})
	}
	for name, iu := range map[string][]byte{
		"no data":  iu[:CommandHeaderLen],
		"short":    iu[:len(iu)-1],
		"long":     append(iu[:len(iu):len(iu)], 0),
		"length 0": func() []byte { h := append([]byte(nil), iu[:CommandHeaderLen]...); h[24], h[25] = 0, 0; return h }(),
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, got.Decode(iu), ErrMalformed)
		})
	}
}

func TestResponseRoundTrip(t *testing.T) {
	r := Response{Status: StatusError, Sense: SenseOutOfRange, Credits: 7, Tag: 42, Residual: 4096}
	b := make([]byte, ResponseLen)
	n, err := r.Encode(b)
	require.NoError(t, err)
	var got Response
	require.NoError(t, got.Decode(b[:n]))
	require.Equal(t, r, got)
	b[1] = 200
	require.ErrorIs(t, got.Decode(b), ErrMalformed)
}

// TestResponseNotice: a capacity notice makes the response 32 bytes with
// the new size; a flag without the size, a size without the flag, or an
// unknown flag is malformed (an older initiator, which checks that the
// reserved field is zero, never gets one: the target sends it only when
// asked at login).
func TestResponseNotice(t *testing.T) {
	r := Response{Status: StatusGood, Credits: 1, Tag: 9, Flags: RespCapacityChanged, Size: 3 << 40}
	b := make([]byte, ResponseNoticeLen)
	n, err := r.Encode(b)
	require.NoError(t, err)
	require.Equal(t, ResponseNoticeLen, n)
	var got Response
	require.NoError(t, got.Decode(b[:n]))
	require.Equal(t, r, got)
	require.ErrorIs(t, got.Decode(b[:ResponseLen]), ErrMalformed, "flag without the size")
	b[20] = 0
	require.ErrorIs(t, got.Decode(b), ErrMalformed, "size without the flag")
	b[20] = 2
	require.ErrorIs(t, got.Decode(b), ErrMalformed, "unknown flag")
	_, err = (&Response{Flags: 2}).Encode(b)
	require.ErrorIs(t, err, ErrMalformed)
}

func TestHotPathNoAllocs(t *testing.T) {
	c := Command{Op: OpRead, Tag: 1, Length: 4096, NDesc: 1, Desc: [MaxDescriptors]Descriptor{{VA: 1, RKey: 2, Len: 4096}}}
	r := Response{Tag: 1, Credits: 1}
	b := make([]byte, MaxCommandLen)
	var c2 Command
	var r2 Response
	a := testing.AllocsPerRun(100, func() {
		n, _ := c.Encode(b)
		_ = c2.Decode(b[:n])
		n, _ = r.Encode(b)
		_ = r2.Decode(b[:n])
	})
	require.Zero(t, a)
}

func TestControlRoundTrip(t *testing.T) {
	req := LoginRequest{Version: Version, Initiator: "iqn.host-a", Credits: 32, MaxIU: 296, MaxRecvIU: 4096,
		MaxTransfer: 1 << 20, MaxDesc: 4, RemoteInvalidate: true, Nonce: bytes.Repeat([]byte{7}, 32)}
	b, err := EncodeControl(nil, OpLogin, &req)
	require.NoError(t, err)
	var got LoginRequest
	require.NoError(t, DecodeControl(b, OpLogin, &got))
	require.Equal(t, req, got)
	require.ErrorIs(t, DecodeControl(b, OpControl, &got), ErrMalformed)

	rsp := ControlResponse{Tag: 5, Credits: 1, Volumes: []VolumeInfo{{Name: "vol0", Size: 1 << 30, BlockSize: 4096}}}
	b, err = EncodeControl(nil, OpControlResp, &rsp)
	require.NoError(t, err)
	var got2 ControlResponse
	require.NoError(t, DecodeControl(b, OpControlResp, &got2))
	require.Equal(t, rsp, got2)
}

// TestExtentsFitAnIU: the largest extents answer, every length and flag
// at its widest, fits the 4096-byte receive buffer with room for the
// other fields.
func TestExtentsFitAnIU(t *testing.T) {
	rsp := ControlResponse{Tag: ^uint64(0), Credits: ^uint32(0), Extents: make([]Extent, MaxExtents)}
	for i := range rsp.Extents {
		rsp.Extents[i] = Extent{Length: ^uint64(0), Flags: ^uint32(0)}
	}
	b, err := EncodeControl(nil, OpControlResp, &rsp)
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), 4096-64, "%d bytes", len(b))
	var got ControlResponse
	require.NoError(t, DecodeControl(b, OpControlResp, &got))
	require.Equal(t, rsp, got)
}

// TestLoginInstance: the target's instance rides in the login response,
// a full 64-bit value, and a response without it (an older target) decodes
// as zero, which the initiator takes as "no promise".
func TestLoginInstance(t *testing.T) {
	rsp := LoginResponse{Version: Version, Target: "t", Credits: 8, MaxTransfer: 1 << 20, Instance: 0xfedc_ba98_7654_3210}
	b, err := EncodeControl(nil, OpLoginResponse, &rsp)
	require.NoError(t, err)
	var got LoginResponse
	require.NoError(t, DecodeControl(b, OpLoginResponse, &got))
	require.Equal(t, rsp, got)

	type old struct {
		Version uint16 `msgpack:"v"`
		Target  string `msgpack:"tgt"`
	}
	b, err = EncodeControl(nil, OpLoginResponse, &old{Version: Version, Target: "t"})
	require.NoError(t, err)
	got = LoginResponse{}
	require.NoError(t, DecodeControl(b, OpLoginResponse, &got))
	require.Zero(t, got.Instance)
}

// TestUnknownFieldsIgnored: a newer peer's extra fields do not break an
// older decoder.
func TestUnknownFieldsIgnored(t *testing.T) {
	type future struct {
		LoginRequest
		Extra string `msgpack:"future-field"`
	}
	b, err := EncodeControl(nil, OpLogin, &future{LoginRequest: LoginRequest{Version: 2, Initiator: "x"}, Extra: "y"})
	require.NoError(t, err)
	var got LoginRequest
	require.NoError(t, DecodeControl(b, OpLogin, &got))
	require.Equal(t, "x", got.Initiator)
	require.EqualValues(t, 2, got.Version)
}

func TestHello(t *testing.T) {
	h, err := DecodeHello(append(Hello{Version: 3}.Encode(), make([]byte, 48)...))
	require.NoError(t, err)
	require.EqualValues(t, 3, h.Version)
	_, err = DecodeHello([]byte("GSRX\x01\x00\x00\x00"))
	require.ErrorIs(t, err, ErrMalformed)
}

func TestLoginProof(t *testing.T) {
	a := LoginProofFor([]byte("s3cret"), "initiator", "i", "t", []byte{1}, []byte{2})
	require.Len(t, a, 32)
	require.Equal(t, a, LoginProofFor([]byte("s3cret"), "initiator", "i", "t", []byte{1}, []byte{2}))
	require.NotEqual(t, a, LoginProofFor([]byte("s3cret"), "target", "i", "t", []byte{1}, []byte{2}))
	require.NotEqual(t, a, LoginProofFor([]byte("other"), "initiator", "i", "t", []byte{1}, []byte{2}))
	// Length-prefixed parts: moving a byte between names changes the proof.
	require.NotEqual(t, a, LoginProofFor([]byte("s3cret"), "initiator", "it", "", []byte{1}, []byte{2}))
}

func FuzzCommandDecode(f *testing.F) {
	b := make([]byte, MaxCommandLen)
	c := Command{Op: OpWrite, Length: 8192, NDesc: 2, Desc: [MaxDescriptors]Descriptor{{Len: 4096}, {Len: 4096}}}
	n, _ := c.Encode(b)
	f.Add(b[:n])
	imm := Command{Op: OpWrite, Flags: FlagImmediate | FlagFUA, Length: 16}
	n, _ = imm.Encode(b)
	f.Add(append(b[:n:n], "sixteen bytes..."...))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Command
		if err := c.Decode(data); err != nil {
			return
		}
		out := make([]byte, MaxCommandLen)
		n, err := c.Encode(out)
		if err != nil || !bytes.Equal(append(out[:n], c.Immediate...), data) {
			t.Fatalf("accepted command does not re-encode to its input: %v", err)
		}
	})
}

func FuzzResponseDecode(f *testing.F) {
	b := make([]byte, ResponseLen)
	(&Response{Tag: 1, Credits: 2}).Encode(b)
	f.Add(b)
	b = make([]byte, ResponseNoticeLen)
	(&Response{Tag: 1, Credits: 2, Flags: RespCapacityChanged, Size: 1 << 30}).Encode(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if err := r.Decode(data); err != nil {
			return
		}
		out := make([]byte, ResponseNoticeLen)
		n, _ := r.Encode(out)
		if !bytes.Equal(out[:n], data) {
			t.Fatal("accepted response does not re-encode to its input")
		}
	})
}

func FuzzDecodeControl(f *testing.F) {
	for _, v := range []struct {
		op Opcode
		v  any
	}{
		{OpLogin, &LoginRequest{Initiator: "a", Nonce: []byte{1, 2}}},
		{OpLoginResponse, &LoginResponse{Target: "t", Credits: 3}},
		{OpLoginReject, &LoginReject{Reason: RejectAuthFailed, Message: "no"}},
		{OpControl, &ControlRequest{Op: ControlOpen, Volume: "vol0"}},
		{OpControlResp, &ControlResponse{Volumes: []VolumeInfo{{Name: "v"}}}},
		{OpControl, &ControlRequest{Op: ControlExtents, Handle: 1, Offset: 4096, Length: 1 << 40}},
		{OpControlResp, &ControlResponse{Extents: []Extent{{Length: 4096, Flags: ExtentHole | ExtentZero}, {Length: 1 << 33}}}},
	} {
		b, _ := EncodeControl(nil, v.op, v.v)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		var a LoginRequest
		var b LoginResponse
		var c LoginReject
		var d ControlRequest
		var e ControlResponse
		var g LoginChallenge
		var h LoginProof
		_ = DecodeControl(data, OpLogin, &a)
		_ = DecodeControl(data, OpLoginResponse, &b)
		_ = DecodeControl(data, OpLoginReject, &c)
		_ = DecodeControl(data, OpControl, &d)
		_ = DecodeControl(data, OpControlResp, &e)
		_ = DecodeControl(data, OpLoginChallenge, &g)
		_ = DecodeControl(data, OpLoginProof, &h)
		_, _ = DecodeHello(data)
	})
}
