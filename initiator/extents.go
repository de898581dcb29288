package initiator

import (
	"context"
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
)

// Extent is a run of a volume with one allocation state, as Extents
// reports it.
type Extent struct {
	Offset, Length int64
	// Hole: the target stores nothing for the run (writing it takes
	// space). Zero: the run reads as zeros. Neither: allocated, contents
	// unknown.
	Hole, Zero bool
}

// Extents reports which parts of [off, off+n) hold data, so that a copy
// or a map can skip the rest: consecutive extents from off, covering a
// prefix of the range of at least one byte. The target bounds one answer
// (wire.MaxExtents extents, and the work of its store), so a caller that
// wants the whole range asks again from the end of the last extent. The
// range need not be block aligned. A target that predates the request has
// the whole range reported allocated, which is never wrong, only slower
// to copy.
func (v *Volume) Extents(ctx context.Context, off, n int64) ([]Extent, error) {
	if size := v.Size(); n <= 0 || off < 0 || off > size || n > size-off {
		return nil, fmt.Errorf("initiator: extents of %d bytes at %d of %q (%d bytes): %w", n, off, v.name, size, ErrInvalid)
	}
	r := &Request{Op: opControl, vol: v,
		ctrl: &wire.ControlRequest{Op: wire.ControlExtents, Offset: uint64(off), Length: uint64(n)}}
	rsp, err := v.s.controlReq(ctx, v.s.pick(), r)
	if err != nil {
		return nil, fmt.Errorf("initiator: extents of %q: %w", v.name, err)
	}
	exts, err := decodeExtents(rsp, off, n)
	if err != nil {
		return nil, fmt.Errorf("initiator: extents of %q: %w", v.name, err)
	}
	return exts, nil
}

// decodeExtents turns a target's answer about [off, off+n) into Extents
// from off, checking it: at least one extent and at most
// wire.MaxExtents, none empty, none beyond the range asked. A target that
// does not know the request (SenseUnsupported) has the range reported
// allocated.
func decodeExtents(rsp *wire.ControlResponse, off, n int64) ([]Extent, error) {
	if rsp.Error != "" {
		if rsp.Sense == wire.SenseUnsupported {
			return []Extent{{Offset: off, Length: n}}, nil
		}
		return nil, fmt.Errorf("%s: %w", rsp.Error, errNoVolume(rsp.Sense))
	}
	in := rsp.Extents
	if len(in) == 0 || len(in) > wire.MaxExtents {
		return nil, fmt.Errorf("initiator: %d extents in an answer (1 to %d): %w", len(in), wire.MaxExtents, ErrProtocol)
	}
	out := make([]Extent, len(in))
	pos := off
	for i, e := range in {
		if e.Length == 0 || e.Length > uint64(off+n-pos) {
			return nil, fmt.Errorf("initiator: extent of %d bytes at %d, in an answer for %d bytes at %d: %w", e.Length, pos, n, off, ErrProtocol)
		}
		out[i] = Extent{Offset: pos, Length: int64(e.Length), Hole: e.Flags&wire.ExtentHole != 0, Zero: e.Flags&wire.ExtentZero != 0}
		pos += int64(e.Length)
	}
	return out, nil
}
