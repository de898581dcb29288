package target

// The extents control request: which parts of a range of an open volume
// hold data. The core checks it and answers; a worker asks the volume
// (volumeExtents).

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
)

// startExtents checks an extents request (an open, unrevoked handle, a
// non-empty range inside the volume) and hands it to a worker.
func (c *core) startExtents(s *slot) {
	req := &s.ctl
	ov := c.usableHandle(s)
	switch {
	case ov == nil:
		return
	case req.Length == 0 || req.Offset > uint64(ov.size) || req.Length > uint64(ov.size)-req.Offset:
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseOutOfRange,
			Error: fmt.Sprintf("extents of %d bytes at %d: volume %q has %d bytes", req.Length, req.Offset, ov.name, ov.size)})
		return
	}
	s.ov = ov
	// Counted like I/O: a close or a revocation waits for the job before
	// it closes the volume under it.
	ov.inflight.Add(1)
	c.dispatch(s, jobExtents)
}

// usableHandle returns the open, unrevoked volume a control request
// names by its handle, or answers the request and returns nil.
func (c *core) usableHandle(s *slot) *openVol {
	ov := c.lookup(s.ctl.Handle)
	switch {
	case ov == nil:
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseNoSuchVolume,
			Error: fmt.Sprintf("no open volume with handle %d", s.ctl.Handle)})
		return nil
	case ov.revoked:
		c.controlRespond(s, c.deniedOpen(ov.name))
		return nil
	}
	return ov
}

func (c *core) finishExtents(s *slot) {
	s.ov = nil
	exts := s.extents
	s.extents = nil
	if s.err != nil {
		c.controlRespond(s, &wire.ControlResponse{Sense: senseOf(s.err), Error: "extents: " + s.err.Error()})
		return
	}
	c.controlRespond(s, &wire.ControlResponse{Extents: exts})
}

// volumeExtents describes [off, off+n) of ov's volume as at most limit
// consecutive extents from off, at least one. Runs the volume reports out
// of order or outside the range are an error, never trusted; a volume
// that describes nothing, or is no Allocator, has the range reported
// allocated. It runs on a worker and ends ov's in-flight count.
func volumeExtents(ov *openVol, off, n int64, limit int) ([]wire.Extent, error) {
	defer ov.inflight.Done()
	all := []wire.Extent{{Length: uint64(n)}}
	al, ok := ov.vol.(Allocator)
	if !ok {
		return all, nil
	}
	var out []wire.Extent
	pos, end := off, off+n
	var bad error
	full := false // out holds limit extents: the answer is a prefix
	add := func(l int64, flags uint32) bool {
		if k := len(out) - 1; k >= 0 && out[k].Flags == flags {
			out[k].Length += uint64(l)
		} else if len(out) == limit {
			return false
		} else {
			out = append(out, wire.Extent{Length: uint64(l), Flags: flags})
		}
		pos += l
		return true
	}
	described, err := al.Allocated(off, n, func(o, l int64) bool {
		if o < pos || l <= 0 || o > end || l > end-o {
			bad = fmt.Errorf("volume reported a run of %d bytes at %d, after %d, in a request for %d bytes at %d", l, o, pos, n, off)
			return false
		}
		if (o > pos && !add(o-pos, wire.ExtentHole|wire.ExtentZero)) || !add(l, 0) {
			full = true
			return false
		}
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case bad != nil:
		return nil, bad
	case len(out) == 0 && described <= off:
		return all, nil
	}
	if !full && described > pos && described <= end {
		add(described-pos, wire.ExtentHole|wire.ExtentZero)
	}
	if len(out) == 0 {
		return all, nil
	}
	return out, nil
}
