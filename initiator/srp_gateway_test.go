package initiator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
)

// TestSRPStandbyGateway: a host that speaks SRP to the standby gateway of
// a volume has its I/O refused with NOT READY, LOGICAL UNIT NOT
// ACCESSIBLE, TARGET PORT IN STANDBY STATE (SPC-4 5.15.2.4.4), which
// Linux takes as a path error and dm-multipath retries on another path,
// and which this package reports as ErrStandby; the active gateway
// serves the same LUN. Before, the standby answered INTERNAL TARGET
// FAILURE, a HARDWARE ERROR that Linux fails on every path.
func TestSRPStandbyGateway(t *testing.T) {
	r := newGatewayRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.open(t, ctx) // gateway 0 takes vol0's lock; gateway 1 is standby for it
	buf := make([]byte, 4096)
	pattern(buf, 0, 1, 1)
	for i, want := range []error{nil, initiator.ErrStandby} {
		s := dial(t, initiator.Config{Provider: r.ip, Addr: r.addrs[i], Name: "srp-host", Protocol: initiator.ProtocolSRP, Credits: 4})
		v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
		if err != nil {
			t.Fatalf("gateway %d: open lun0: %v", i, err)
		}
		_, err = v.WriteAt(buf, 0)
		if !errors.Is(err, want) {
			t.Fatalf("gateway %d: write: %v, want %v", i, err, want)
		}
		var se *initiator.SCSIError
		if want != nil && (!errors.As(err, &se) || se.Key != 0x2 || se.ASC != 0x04 || se.ASCQ != 0x0B) {
			t.Errorf("gateway %d: write: %v, want NOT READY 04/0B", i, err)
		}
		v.Close()
		s.Close()
	}
}
