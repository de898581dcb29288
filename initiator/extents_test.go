package initiator

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// TestDecodeExtents: what a target answers an extents request with, from
// an old target's "unsupported" to hostile answers, which never pass.
func TestDecodeExtents(t *testing.T) {
	const off, n = 4096, 1 << 20
	hz := wire.ExtentHole | wire.ExtentZero
	many := make([]wire.Extent, wire.MaxExtents+1)
	for i := range many {
		many[i].Length = 1
	}
	cases := []struct {
		name string
		rsp  wire.ControlResponse
		want []Extent
		err  error
	}{
		{"holes and data", wire.ControlResponse{Extents: []wire.Extent{{Length: 8192, Flags: hz}, {Length: 4096}}},
			[]Extent{{Offset: off, Length: 8192, Hole: true, Zero: true}, {Offset: off + 8192, Length: 4096}}, nil},
		{"the whole range", wire.ControlResponse{Extents: []wire.Extent{{Length: n, Flags: wire.ExtentZero}}},
			[]Extent{{Offset: off, Length: n, Zero: true}}, nil},
		{"an old target", wire.ControlResponse{Sense: wire.SenseUnsupported, Error: `unknown control operation "extents"`},
			[]Extent{{Offset: off, Length: n}}, nil},
		{"a refusal", wire.ControlResponse{Sense: wire.SenseNoSuchVolume, Error: "no open volume"}, nil, ErrInvalid},
		{"no extent", wire.ControlResponse{}, nil, ErrProtocol},
		{"too many", wire.ControlResponse{Extents: many}, nil, ErrProtocol},
		{"an empty extent", wire.ControlResponse{Extents: []wire.Extent{{Length: 4096}, {Length: 0}}}, nil, ErrProtocol},
		{"beyond the range", wire.ControlResponse{Extents: []wire.Extent{{Length: n - 10}, {Length: 11}}}, nil, ErrProtocol},
		{"a huge length", wire.ControlResponse{Extents: []wire.Extent{{Length: ^uint64(0)}}}, nil, ErrProtocol},
	}
	for _, c := range cases {
		got, err := decodeExtents(&c.rsp, off, n)
		if !reflect.DeepEqual(got, c.want) || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, err, c.want, c.err)
		}
	}
}
