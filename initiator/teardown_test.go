package initiator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target/targettest"
)

// TestTeardownReleasesWindows: a connection cut while an I/O's window is
// bound must still end with its QP destroyed. On rxe a type-2 window
// holds the QP it was bound through until it is invalidated or
// deallocated, and destroying the QP first stalled every reconnect in the
// test VM for ~50 s with a kernel warning (rxe_destroy_qp in
// __rxe_cleanup); the emulator's strict and rxe profiles refuse that
// destroy with ErrBusy, so the initiator must replace the windows it can
// no longer vouch for before it destroys the QP, on every cut and on
// Close. A QP left behind shows in the NIC's list of live QPs.
func TestTeardownReleasesWindows(t *testing.T) {
	for _, profile := range []string{"strict", "rxe", "ib"} {
		for _, mech := range mechanisms {
			for _, local := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/local-inv=%v", profile, mech, local), func(t *testing.T) {
					const cuts = 3
					r := newHostileRig(t, profile, targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
						if !rsp.Login && rsp.N%25 == 0 && rsp.N <= 25*cuts {
							return targettest.Disconnect
						}
						return targettest.Pass
					}})
					s, v := r.dial(t, initiator.Config{Mechanism: mech, Credits: 4, NoRemoteInvalidate: local,
						LossTimeout: 20 * time.Second})
					buf := make([]byte, 16384) // above the immediate-data limit: registered
					for i := 0; i < 120; i++ {
						off := int64(i%32) * 16384
						var err error
						if i%2 == 0 {
							_, err = v.WriteAt(buf, off)
						} else {
							_, err = v.ReadAt(buf, off)
						}
						if err != nil {
							t.Fatalf("I/O %d: %v", i, err)
						}
					}
					if st := s.Stats(); st.ConnectionsLost != cuts {
						t.Fatalf("%d connections lost for %d cuts", st.ConnectionsLost, cuts)
					}
					if qps := r.ip.QPs(); len(qps) != 1 {
						t.Fatalf("%d live QPs after %d cuts, want the connected one: a lost connection's QP was not destroyed", len(qps), cuts)
					}
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					if qps := r.ip.QPs(); len(qps) != 0 {
						t.Fatalf("%d live QPs after Close", len(qps))
					}
				})
			}
		}
	}
}
