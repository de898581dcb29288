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
// 5 s loss timeout), and the channel reconnected about 300 times a
// second. Now an I/O re-issued across ended connections for LossTimeout
// fails, with ErrConnectionLost wrapping what ended the last one; each
// reconnect after a connection that broke the protocol before answering
// anything waits, longer each time (a handful of connections in the
// second, not hundreds); and the next I/O fails with ErrConnectionLost
// too, while the channel is down past its loss timeout.
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
			_, err := v.ReadAt(buf, 0)
			if !errors.Is(err, initiator.ErrConnectionLost) || !errors.Is(err, initiator.ErrProtocol) {
				t.Fatalf("a read from a target that breaks every answer: %v, want ErrConnectionLost wrapping ErrProtocol", err)
			}
			lost := s.Stats().ConnectionsLost
			t.Logf("read: %v (%d connections lost)", err, lost)
			if lost < 2 || lost > 20 {
				t.Fatalf("%d connections lost in the read's LossTimeout of 1 s: want it re-issued, and no reconnect storm", lost)
			}
			if _, err := v.WriteAt(buf, 16384); !errors.Is(err, initiator.ErrConnectionLost) {
				t.Fatalf("a write after it: %v, want ErrConnectionLost", err)
			}
		})
	}
}
