package initiator_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
)

// TestHostileBreaksEveryAnswer: a target that answers every I/O in a way
// that ends the connection (here an invalidation the initiator did not
// ask for) but accepts every login again. The connection's loss timeout
// never runs out, since every reconnect succeeds, and the I/O timeout
// never fires, since every command is answered; each I/O used to be
// re-issued for ever, its caller blocked (a read hung past 90 s with a
// 5 s loss timeout). Now an I/O re-issued across ended connections for
// LossTimeout fails, with ErrConnectionLost wrapping what ended the last
// one, and the next I/O gets its own LossTimeout.
func TestHostileBreaksEveryAnswer(t *testing.T) {
	for _, tc := range []struct {
		profile string
		mech    frmr.Mechanism
		local   bool // ask for no remote invalidation (implied on rxe)
	}{
		{"rxe", frmr.FRMR, false},
		{"rxe", frmr.MW, false},
		{"strict", frmr.FRMR, true},
	} {
		t.Run(tc.profile+"/"+tc.mech.String(), func(t *testing.T) {
			r := newHostileRig(t, tc.profile, targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
				if ds := rsp.Descriptors; !rsp.Login && rsp.Key == 0 && rsp.Fresh {
					rsp.WR.Opcode, rsp.WR.InvalidateKey = transport.OpSendWithInv, ds[len(ds)-1].RKey
				}
				return targettest.Pass
			}})
			s, v := r.dial(t, initiator.Config{Mechanism: tc.mech, Credits: 4, ImmediateData: -1, NoRemoteInvalidate: tc.local,
				LossTimeout: time.Second, IOTimeout: 2 * time.Second})
			buf := make([]byte, 16384)
			lost := uint64(0)
			for i, op := range []func() error{
				func() error { _, err := v.ReadAt(buf, 0); return err },
				func() error { _, err := v.WriteAt(buf, 16384); return err },
			} {
				err := op()
				if !errors.Is(err, initiator.ErrConnectionLost) || !errors.Is(err, initiator.ErrProtocol) {
					t.Fatalf("I/O %d against a target that breaks every answer: %v, want ErrConnectionLost wrapping ErrProtocol", i, err)
				}
				if now := s.Stats().ConnectionsLost; now < lost+2 {
					t.Fatalf("I/O %d: %d connections lost for it: it failed without being re-issued (%v)", i, now-lost, err)
				} else {
					lost = now
				}
				t.Logf("I/O %d: %v", i, err)
			}
		})
	}
}
