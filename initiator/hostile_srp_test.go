package initiator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
)

// TestHostileStaleDescriptorsSRP is TestHostileStaleDescriptors in the
// SRP personality, which has no remote invalidation: the initiator's own
// LOCAL_INV after each I/O (and the key bump at each registration) is
// all that stands between a target that remembers every descriptor and
// the application's memory. While each read's response is on its way,
// every earlier descriptor is fired as an RDMA WRITE; across three key
// wraps not one may be served, and the live one must be.
func TestHostileStaleDescriptorsSRP(t *testing.T) {
	const reads = 800
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		for _, mech := range mechanisms {
			t.Run(profile+"/"+mech.String(), func(t *testing.T) {
				var p staleProbe
				var reading atomic.Bool
				script := targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
					if reading.Load() {
						p.fire(rsp)
					}
					return targettest.Pass
				}}
				p.r = newHostileRigWith(t, profile, script, target.Config{SRPTargetPortID: srpPort})
				s := dial(t, initiator.Config{Provider: p.r.ip, Addr: p.r.addr, Name: "victim", Logger: quiet,
					Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Mechanism: mech, Credits: 4})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 4096)
				reading.Store(true)
				for i := 0; i < reads; i++ {
					if _, err := v.ReadAt(buf, int64(i%64)*4096); err != nil {
						t.Fatalf("read %d: %v", i, err)
					}
				}
				reading.Store(false)
				p.check(t, s, reads)
			})
		}
	}
}
