package wire

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// TestReservationRoundTrip: a reservation request and a full report
// (MaxRegistrants names of MaxReportName bytes, and the holder's and
// exclusive holder's) survive encoding, and the report fits one IU.
func TestReservationRoundTrip(t *testing.T) {
	req := &ControlRequest{Tag: 7, Op: ControlReserveOut, Handle: 3, Action: ActionPreemptAbort, Key: 1 << 63, NewKey: 2, Type: ResExclusiveAccessRegistrants}
	b, err := EncodeControl(nil, OpControl, req)
	if err != nil {
		t.Fatal(err)
	}
	var got ControlRequest
	if err := DecodeControl(b, OpControl, &got); err != nil || !reflect.DeepEqual(&got, req) {
		t.Fatalf("request: %+v, %v; want %+v", got, err, req)
	}
	name := strings.Repeat("n", MaxReportName)
	rsp := &ControlResponse{Tag: 1, Credits: 1, Generation: 1<<32 - 1, Holder: name, HolderKey: ^uint64(0),
		ResType: ResWriteExclusive, ExclusiveHolder: name}
	for i := range MaxRegistrants {
		rsp.Registrants = append(rsp.Registrants, Registrant{Initiator: name, Key: ^uint64(0) - uint64(i)})
	}
	if b, err = EncodeControl(nil, OpControlResp, rsp); err != nil {
		t.Fatal(err)
	}
	if len(b) > 4096 {
		t.Fatalf("a full report takes %d bytes, more than a 4096-byte IU", len(b))
	}
	var back ControlResponse
	if err := DecodeControl(b, OpControlResp, &back); err != nil || !reflect.DeepEqual(&back, rsp) {
		t.Fatalf("report: %+v, %v", back, err)
	}
}

// TestReservationNames: every action and type has a name, the names
// parse back, and codes out of range print as numbers, never panic.
func TestReservationNames(t *testing.T) {
	for a := ActionNone + 1; a < actionEnd; a++ {
		if !a.Valid() || strings.Contains(a.String(), "(") {
			t.Errorf("action %d: %q", a, a)
		}
	}
	if ReserveAction(200).Valid() || ReserveAction(200).String() != "ReserveAction(200)" || ActionNone.Valid() {
		t.Error("an undefined action is valid or named")
	}
	for _, rt := range []ReservationType{ResWriteExclusive, ResExclusiveAccess, ResWriteExclusiveRegistrants, ResExclusiveAccessRegistrants} {
		if p, err := ParseReservationType(rt.String()); err != nil || p != rt || !rt.Valid() {
			t.Errorf("type %d: %q parses as %d, %v", rt, rt, p, err)
		}
	}
	if _, err := ParseReservationType("shared"); err == nil || ReservationType(2).Valid() || ResNone.Valid() {
		t.Error("an undefined type parses or is valid")
	}
}

// FuzzReservationDecode feeds arbitrary bodies to the decoder of
// reservation requests and reports: it never panics, whatever decodes
// re-encodes to the same bytes, and the codes it yields are
// bounded by Valid.
func FuzzReservationDecode(f *testing.F) {
	for _, v := range []any{
		&ControlRequest{Op: ControlReserveOut, Handle: 1, Action: ActionRegister, NewKey: 0xabc},
		&ControlRequest{Op: ControlReserveOut, Handle: 1, Action: ActionPreempt, Key: 1, NewKey: 2, Type: ResWriteExclusive},
		&ControlRequest{Op: ControlOpen, Volume: "v", Exclusive: true},
		&ControlResponse{Generation: 3, Holder: "h", HolderKey: 9, ResType: ResExclusiveAccess,
			Registrants: []Registrant{{"h", 9}, {"g", 8}}, ExclusiveHolder: "x"},
	} {
		b, _ := EncodeControl(nil, OpControl, v)
		f.Add(b[1:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		controlRoundTrip(t, body, func(req *ControlRequest) {
			_ = req.Action.Valid() && req.Type.Valid()
			_ = req.Action.String() + req.Type.String()
		}, func(rsp *ControlResponse) {
			if len(rsp.Registrants) > len(body) {
				t.Fatalf("%d registrants from %d bytes", len(rsp.Registrants), len(body))
			}
		})
	})
}

// controlRoundTrip decodes body (at most 4096 bytes) as a control
// request and as a control response; whatever decodes is checked by its
// func and must re-encode to the same bytes.
func controlRoundTrip(t *testing.T, body []byte, onReq func(*ControlRequest), onRsp func(*ControlResponse)) {
	if len(body) > 4096 {
		return
	}
	iu := append([]byte{byte(OpControl)}, body...)
	var req ControlRequest
	if DecodeControl(iu, OpControl, &req) == nil {
		onReq(&req)
		roundTrip(t, &req, &ControlRequest{})
	}
	var rsp ControlResponse
	if DecodeControl(iu, OpControl, &rsp) == nil {
		onRsp(&rsp)
		roundTrip(t, &rsp, &ControlResponse{})
	}
}

func roundTrip(t *testing.T, v, into any) {
	b, err := EncodeControl(nil, OpControl, v)
	if err != nil {
		t.Fatalf("re-encode %+v: %v", v, err)
	}
	if err := DecodeControl(b, OpControl, into); err != nil {
		t.Fatalf("decode of the re-encoding: %v", err)
	}
	// Compared by encoding: an empty list decodes as an empty slice and
	// encodes (omitempty) as nothing, which decodes as nil.
	again, err := EncodeControl(nil, OpControl, into)
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("round trip: %+v became %+v (%v)", v, into, err)
	}
}
