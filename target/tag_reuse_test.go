package target

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// TestTagInFlightOverWire: a hostile initiator sends a second request
// under the tag of a READ still at the volume (an overlapped command,
// SAM-5 5.9.4; what a NIC replaying receives at ERR delivers too). The
// target ends the connection at the second request and never runs it:
// the WRITE's data never reaches the volume, the open never happens.
// The core's rule is tagInFlight (core_command.go); its trace is
// testdata/core/hostile.
func TestTagInFlightOverWire(t *testing.T) {
	for _, dup := range []string{"write", "control"} {
		t.Run(dup, func(t *testing.T) {
			forEnvs(t, func(t *testing.T, e env) {
				r := newRig(t, e, Config{})
				var vol1Opens atomic.Int32
				r.cat.opening = func(name string) {
					if name == "vol1" {
						vol1Opens.Add(1)
					}
				}
				gate, entered := r.gateReads()
				c := r.dial(t)
				c.login("ini")
				h := c.open("vol0", false)
				before := r.tgt.Stats().Violations

				rd := c.io(wire.OpRead, h, 0, 0, bs, 1)
				c.postCommand(&rd)
				<-entered // the READ is at the volume: its tag is in flight

				switch dup {
				case "write":
					copy(c.data(bs, bs), pattern(bs, 7))
					wr := c.io(wire.OpWrite, h, bs, bs, bs, 1)
					wr.Tag = rd.Tag
					var b [wire.MaxCommandLen]byte
					n, err := wr.Encode(b[:])
					if err != nil {
						t.Fatal(err)
					}
					if err := c.sendIU(b[:n]); err != nil {
						t.Fatal(err)
					}
				case "control":
					c.send(wire.OpControl, &wire.ControlRequest{Tag: rd.Tag, Op: wire.ControlOpen, Volume: "vol1"})
				}
				c.expectDisconnect()
				close(gate)
				waitFor(t, "the connection to end", func() bool {
					s := r.tgt.Stats()
					return len(s.Conns) == 0 && s.Violations == before+1
				})
				got := make([]byte, bs)
				if _, err := r.openVol(t, "vol0").ReadAt(got, bs); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, make([]byte, bs)) {
					t.Fatal("the WRITE under a tag in flight reached the volume")
				}
				if n := vol1Opens.Load(); n != 0 {
					t.Fatal("the open under a tag in flight ran")
				}
			})
		})
	}
}
