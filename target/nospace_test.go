package target

import (
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
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

// TestSRPNoSpaceSense: the same full volume seen by an SRP initiator (the
// kernel's ib_srp): a WRITE with data by RDMA READ, an immediate-data
// WRITE with FUA and a WRITE(16) are CHECK CONDITION DATA PROTECT, SPACE
// ALLOCATION FAILED WRITE PROTECT (SBC-3's answer of a thin device out of
// space, which Linux reports as a space allocation error rather than a
// medium error), and a READ of the LUN is still GOOD.
func TestSRPNoSpaceSense(t *testing.T) {
	r := newRig(t, env{wire: "tcp", profile: "rxe"}, Config{})
	r.cat.wrap = func(v Volume) Volume { return fullVol{v} }
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	const n = 64 << 10
	lun := scsi.EncodeLUN(lunVol0)
	c.checkSense("WRITE(10) by RDMA READ", c.do(c.out(srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, n/bs, false)}, 0, n)), scsi.SenseSpaceAllocFailed)
	imm := srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 1, true),
		DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: bs, Imm: make([]byte, bs)}}
	c.checkSense("WRITE(10) FUA, immediate data", c.do(imm), scsi.SenseSpaceAllocFailed)
	c.checkSense("WRITE(16)", c.do(c.out(srp.Cmd{LUN: lun, CDB: rw16(0x8A, 8, 1)}, 0, bs)), scsi.SenseSpaceAllocFailed)
	c.good("READ(10)", c.do(c.in(srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 1, false)}, 0, bs)), 0)
}
