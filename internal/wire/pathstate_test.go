package wire

import (
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
