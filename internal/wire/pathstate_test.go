package wire

import (
	"errors"
	"testing"
)

// TestPathStateWire checks the open's Takeover and the answer's
// PathState travel, that an answer without the field (an older target)
// reads as active, and that unknown states are not Valid.
func TestPathStateWire(t *testing.T) {
	b, err := EncodeControl(nil, OpControl, &ControlRequest{Tag: 1, Op: ControlOpen, Volume: "v", Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	var req ControlRequest
	if err := DecodeControl(b, OpControl, &req); err != nil || !req.Takeover {
		t.Fatalf("takeover open decoded as %+v, %v", req, err)
	}
	b, _ = EncodeControl(nil, OpControlResp, &ControlResponse{Handle: 1, PathState: PathStandby})
	var rsp ControlResponse
	if err := DecodeControl(b, OpControlResp, &rsp); err != nil || rsp.PathState != PathStandby {
		t.Fatalf("standby answer decoded as %+v, %v", rsp, err)
	}
	b, _ = EncodeControl(nil, OpControlResp, &struct {
		Handle uint32 `msgpack:"h"`
	}{1})
	rsp = ControlResponse{}
	if err := DecodeControl(b, OpControlResp, &rsp); err != nil || rsp.PathState != PathActive {
		t.Fatalf("an answer without a path state decoded as %v, %v; want active", rsp.PathState, err)
	}
	if !PathStandby.Valid() || PathState(2).Valid() || PathState(2).String() != "PathState(2)" || PathStandby.String() != "standby" {
		t.Error("PathState's Valid or String is wrong")
	}
	if SenseNotActive.String() != "path not active" {
		t.Errorf("SenseNotActive prints %q", SenseNotActive)
	}
}

// FuzzPathStateDecode feeds arbitrary bodies to the decoders of opens
// and their answers: nothing panics, whatever decodes re-encodes to the
// same bytes, and a decoded state prints whatever its value.
func FuzzPathStateDecode(f *testing.F) {
	for _, v := range []any{
		&ControlRequest{Op: ControlOpen, Volume: "vol0", Takeover: true},
		&ControlRequest{Op: ControlOpen, Volume: "vol0", Takeover: true, Exclusive: true},
		&ControlResponse{Handle: 2, Size: 1 << 30, BlockSize: 4096, PathState: PathStandby},
		&ControlResponse{Handle: 2, PathState: 7},
	} {
		b, _ := EncodeControl(nil, OpControl, v)
		f.Add(b[1:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		controlRoundTrip(t, body, func(*ControlRequest) {}, func(rsp *ControlResponse) {
			if rsp.PathState.Valid() != (rsp.PathState <= PathStandby) || rsp.PathState.String() == "" {
				t.Fatalf("state %d: Valid %v, String %q", rsp.PathState, rsp.PathState.Valid(), rsp.PathState)
			}
		})
	})
}

// TestPathNotice checks a notice's round trip, that one without a handle
// or under another opcode is refused, and that a later field is ignored.
func TestPathNotice(t *testing.T) {
	b, err := (&PathNotice{Handle: 3, State: PathStandby}).Encode(nil)
	if err != nil || Opcode(b[0]) != OpPathNotice || OpPathNotice.String() != "PATH_NOTICE" {
		t.Fatalf("encode: %x, %v", b, err)
	}
	if n, err := DecodePathNotice(b); err != nil || n != (PathNotice{Handle: 3, State: PathStandby}) {
		t.Fatalf("decoded %+v, %v", n, err)
	}
	b, _ = (&PathNotice{State: PathActive}).Encode(nil)
	if _, err := DecodePathNotice(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("a notice without a handle: %v, want ErrMalformed", err)
	}
	b, _ = EncodeControl(nil, OpControlResp, &PathNotice{Handle: 1})
	if _, err := DecodePathNotice(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("a control response read as a notice: %v, want ErrMalformed", err)
	}
	b, _ = EncodeControl(nil, OpPathNotice, &struct {
		Handle uint32 `msgpack:"h"`
		Later  string `msgpack:"later"`
	}{Handle: 1, Later: "x"})
	if n, err := DecodePathNotice(b); err != nil || n.Handle != 1 || n.State != PathActive {
		t.Errorf("a notice with a later field: %+v, %v", n, err)
	}
}

// FuzzPathNoticeDecode feeds arbitrary IUs to DecodePathNotice: nothing
// panics, and whatever decodes has a handle and re-encodes to an IU that
// decodes to the same notice.
func FuzzPathNoticeDecode(f *testing.F) {
	for _, n := range []PathNotice{{Handle: 1}, {Handle: 7, State: PathStandby}, {Handle: 1 << 31, State: 9}} {
		b, _ := n.Encode(nil)
		f.Add(b)
	}
	f.Add([]byte{byte(OpPathNotice)})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodePathNotice(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if n.Handle == 0 {
			t.Fatal("decoded a notice without a handle")
		}
		again, err := n.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := DecodePathNotice(again); err != nil || m != n {
			t.Fatalf("%+v re-encoded as %x, decoded %+v, %v", n, again, m, err)
		}
		_ = n.State.String()
	})
}
