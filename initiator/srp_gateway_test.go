package initiator_test

import (
	"bytes"
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

// TestSRPALUAGateway: an SRP host of two gateways over one volume, each
// its own ALUA target port group (srpd --srp-port-group), through the
// gateway catalog and a cluster that fences as RBD does. Opened on the
// standby gateway, the LUN reads Standby and its I/O fails ErrStandby;
// opened with Takeover, the initiator sends SET TARGET PORT GROUPS, the
// gateway breaks the other's lock and takes it, and the write lands
// there and reads back; the host's LUN on the old gateway then fails
// ErrStandby and re-opens standby, and the gosrp host that had the
// volume follows to the new gateway.
func TestSRPALUAGateway(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{portGroups: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv := r.open(t, ctx) // a gosrp host: gateway 0 takes vol0's lock
	buf := make([]byte, 4096)
	pattern(buf, 0, 1, 1)
	if _, err := mv.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	var sess [2]*initiator.Session
	for i := range sess {
		sess[i] = dial(t, initiator.Config{Provider: r.ip, Addr: r.addrs[i], Name: "srp-host", Protocol: initiator.ProtocolSRP, Credits: 4})
	}
	open := func(i int, takeover bool) *initiator.Volume {
		t.Helper()
		v, err := sess[i].Open(ctx, "lun0", initiator.OpenOptions{Takeover: takeover})
		if err != nil {
			t.Fatalf("gateway %d: open lun0 (takeover %v): %v", i, takeover, err)
		}
		return v
	}
	v0 := open(0, false)
	if v0.Standby() {
		t.Fatal("lun0 standby on the gateway that holds the lock")
	}
	v1 := open(1, false)
	if !v1.Standby() {
		t.Fatal("lun0 active on the gateway that does not hold the lock")
	}
	if _, err := v1.WriteAt(buf, 4096); !errors.Is(err, initiator.ErrStandby) {
		t.Fatalf("write on the standby gateway: %v, want ErrStandby", err)
	}
	v1.Close()

	v1 = open(1, true)
	if v1.Standby() {
		t.Fatal("lun0 standby after SET TARGET PORT GROUPS")
	}
	pattern(buf, 1, 2, 1)
	if _, err := v1.WriteAt(buf, 4096); err != nil {
		t.Fatalf("write after the takeover: %v", err)
	}
	got := make([]byte, 4096)
	if _, err := v1.ReadAt(got, 4096); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back after the takeover: %v, equal %v", err, bytes.Equal(got, buf))
	}
	if _, err := v0.WriteAt(buf, 8192); !errors.Is(err, initiator.ErrStandby) {
		t.Fatalf("write on the fenced gateway: %v, want ErrStandby", err)
	}
	v0.Close()
	if v0 = open(0, false); !v0.Standby() {
		t.Error("lun0 re-opened active on the fenced gateway")
	}
	// The gosrp host's volume moved to gateway 1 (its path notice, or
	// its next write's standby answer) and goes on.
	if _, err := mv.WriteAt(buf, 12288); err != nil {
		t.Fatalf("the gosrp host's write after the SRP host's takeover: %v", err)
	}
}
