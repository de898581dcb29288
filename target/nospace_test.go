package target

import (
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/wire"
)

// fullVol refuses writes as a store out of space does.
type fullVol struct{ Volume }

func (v fullVol) WriteAt(p []byte, off int64) (int, error) {
	return 0, fmt.Errorf("block: volume %q: write: %w", "vol0", block.ErrNoSpace)
}

func (v fullVol) WriteAtFUA(p []byte, off int64) (int, error) { return v.WriteAt(p, off) }

// TestNoSpaceSense: a write the volume refuses for space (an error
// matching syscall.ENOSPC) is answered SenseSpaceAllocFailed, not a medium
// error, and reads of the volume still succeed. Before the fix every
// backend error was SenseMediumError.
func TestNoSpaceSense(t *testing.T) {
	r := newRig(t, env{wire: "loop", profile: "strict"}, Config{})
	r.cat.wrap = func(v Volume) Volume { return fullVol{v} }
	c := r.dial(t)
	c.login("ini")
	h := c.open("vol0", false)
	for _, flags := range []uint8{0, wire.FlagFUA} {
		cmd := c.io(wire.OpWrite, h, 0, 0, bs, 1)
		cmd.Flags |= flags
		rsp, _ := c.do(cmd)
		expectSense(t, rsp, wire.SenseSpaceAllocFailed)
	}
	rsp, _ := c.do(c.io(wire.OpRead, h, 0, 0, bs, 1))
	expectGood(t, rsp)
}
