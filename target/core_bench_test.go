package target

import (
	"testing"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
)

// BenchmarkCoreIO is the core's CPU cost of one 4 KiB command, from its
// receive to its response's completion, for gosrp's protocol and for
// SRP side by side (the NIC and the volume played by the harness, the
// volume a slice), so that a cost of the SRP personality shows apart
// from the wire's and the scheduler's.
func BenchmarkCoreIO(b *testing.B) {
	d := srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: 0x9000, Key: 0x1234, Len: 4096}}
	srpRead := srpIU(b, srp.Cmd{Tag: 2, CDB: rw10(0x28, 2, 1, false), DataIn: d})
	srpWrite := srpIU(b, srp.Cmd{Tag: 1, CDB: rw10(0x2A, 2, 1, false), DataOut: d})
	srpImm := srpIU(b, srp.Cmd{Tag: 3, CDB: rw10(0x2A, 1, 1, false),
		DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 4096, Imm: make([]byte, 4096)}})
	gosrp := func(op wire.Op, flags uint8) []byte {
		c := wire.Command{Op: op, Volume: 1, Offset: 8192, Length: 4096, NDesc: 1, Flags: flags | wire.FlagInvalidate, InvalidateKey: 0x1234}
		c.Desc[0] = wire.Descriptor{VA: 0x9000, RKey: 0x1234, Len: 4096}
		buf := make([]byte, wire.CommandHeaderLen+4096)
		if flags&wire.FlagImmediate != 0 {
			c.NDesc, c.Flags = 0, wire.FlagImmediate
		}
		n, _ := c.Encode(buf)
		if flags&wire.FlagImmediate == 0 {
			buf = buf[:n]
		}
		return buf
	}
	for _, bc := range []struct {
		name string
		srp  bool
		iu   []byte
	}{
		{"gosrp/read", false, gosrp(wire.OpRead, 0)},
		{"srp/read", true, srpRead},
		{"gosrp/write", false, gosrp(wire.OpWrite, 0)},
		{"srp/write", true, srpWrite},
		{"gosrp/immediate", false, gosrp(wire.OpWrite, wire.FlagImmediate)},
		{"srp/immediate", true, srpImm},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var h *coreHarness
			if bc.srp {
				h = newSRPCoreHarness(b, 4)
			} else {
				h = newCoreHarness(b, 4)
				h.loginOpen(b)
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				h.deliver(i%h.c.p.nrecv, bc.iu)
				i++
				h.step()
			}
		})
	}
}
