package initiator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
)

// TestSRPVolumeReplacedAcrossRestart is TestVolumeReplacedAcrossRestart
// over T10 SRP, which has no OPEN to answer with the volume's identity:
// the target restarts and, in one case, the volume behind LUN 0 is
// another one now (deleted and created again under its name). The
// session must read the unit's identity again after the re-login
// (VPD 0x83): the same unit takes the session's I/O as before; another
// fails every request of the Volume with ErrVolumeReplaced and is left
// as it was. The re-login once addressed LUN 0 blindly: the writes went
// on into the new volume, the flush succeeded, and `srpc --protocol srp
// import` exited 0 over a volume whose first 11 MiB were zeros.
func TestSRPVolumeReplacedAcrossRestart(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		for _, ch := range []int{1, 2} {
			t.Run(fmt.Sprintf("replaced=%t/channels=%d", replaced, ch), func(t *testing.T) {
				const size = 8 << 20
				r := newCrashRig(t, size)
				cfg := initiator.Config{Channels: ch, ReplayBuffer: 4 << 20, Protocol: initiator.ProtocolSRP,
					Provider: r.p, Addr: r.addr, Name: "srp-crash-test",
					IOTimeout: 2 * time.Second, ConnectTimeout: 2 * time.Second, LossTimeout: 20 * time.Second}
				s := dial(t, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				v := openNamed(t, ctx, s, "lun0")
				model := make([]byte, size)
				writeModel(t, v, model, 0, 64, 16, 1)
				if err := v.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				if replaced {
					writeModel(t, v, model, 64, 128, 16, 1) // acknowledged, in the ring
				}

				r.crash()
				old := r.disk
				if replaced {
					r.disk = &durableDisk{data: make([]byte, size), bs: 4096, id: 2}
				}
				r.start()

				if !replaced {
					writeModel(t, v, model, 64, 128, 16, 2)
					if err := v.Flush(ctx); err != nil {
						t.Fatalf("flush after a restart of the same volume: %v", err)
					}
					r.checkFlushed(t, v, model)
					return
				}
				checkReplaced(t, r, s, v, old, model, "lun0", false)
			})
		}
	}
}
