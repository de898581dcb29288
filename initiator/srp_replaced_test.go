package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
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
				s, v, model := r.flushedSRP(t, initiator.Config{Channels: ch, ReplayBuffer: 4 << 20})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
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

// TestSRPReloginAfterLoss: the target is down past the loss deadline, so
// the I/O queued meanwhile fails; then it comes back. The session's
// re-login checks the unit (srp_identity.go), and the I/O submitted after
// it must wait for that check and run, not fail at once on the deadline
// that has long passed.
func TestSRPReloginAfterLoss(t *testing.T) {
	r := newCrashRig(t, 4<<20)
	cfg := initiator.Config{Protocol: initiator.ProtocolSRP, Provider: r.p, Addr: r.addr, Name: "srp-loss-test",
		IOTimeout: time.Second, ConnectTimeout: time.Second, LossTimeout: 500 * time.Millisecond}
	s := dial(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := openNamed(t, ctx, s, "lun0")
	model := make([]byte, 4<<20)
	writeModel(t, v, model, 0, 16, 4, 1)
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r.crash()
	if _, err := v.WriteAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("a write with the target down past the loss deadline succeeded")
	}
	r.start()
	// Reads fail fast while the loss is final; the first after the
	// re-login meets the check in flight.
	buf := make([]byte, 4096)
	for {
		_, err := v.ReadAt(buf, 0)
		if err == nil {
			break
		}
		if errors.Is(err, initiator.ErrNotReady) {
			t.Fatalf("read after the re-login: %v", err)
		}
		if ctx.Err() != nil {
			t.Fatalf("no read succeeded after the target came back: %v", err)
		}
	}
	writeModel(t, v, model, 16, 16, 4, 2)
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush after the target came back: %v", err)
	}
}

// TestSRPIdentitySwallowed: a hostile SRP target takes every re-login
// and never answers the identity check's INQUIRY (VPD 0x83). Each
// INQUIRY's timeout ends the connection, the next re-login starts the
// check again, and the read parked behind it once waited forever: every
// connection gave it a new loss deadline. The deadline is the unit's,
// kept across the connections: the read fails with ErrNotReady a loss
// timeout after the first re-login, and once the target answers again
// the unit is checked and reads go on.
func TestSRPIdentitySwallowed(t *testing.T) {
	var swallow atomic.Bool
	var cut atomic.Bool
	var swallowed atomic.Int64
	script := targettest.Script{
		Swallow: func(iu []byte) bool {
			// SRP_CMD (0x02) whose CDB (at byte 32) is INQUIRY (0x12)
			// with EVPD of page 0x83.
			if swallow.Load() && len(iu) >= 36 && iu[0] == 0x02 && iu[32] == 0x12 && iu[33]&1 == 1 && iu[34] == 0x83 {
				swallowed.Add(1)
				return true
			}
			return false
		},
		Respond: func(*targettest.Response) targettest.Action {
			if cut.CompareAndSwap(true, false) {
				return targettest.Disconnect
			}
			return targettest.Pass
		},
	}
	r := newHostileRigWith(t, "strict", script, target.Config{SRPTargetPortID: srpPort})
	const loss = 3 * time.Second // room for several re-logins on a loaded machine
	s := dial(t, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "victim", Logger: quiet,
		Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort,
		IOTimeout: 200 * time.Millisecond, LossTimeout: loss})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4096)
	if _, err := v.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}

	swallow.Store(true)
	cut.Store(true) // the next answer ends the connection
	done := make(chan error, 1)
	go func() {
		_, err := v.ReadAt(make([]byte, 4096), 0)
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatalf("a read parked behind an identity check the target never answers still waits after a minute (%d INQUIRYs swallowed, %d connections lost)",
			swallowed.Load(), s.Stats().ConnectionsLost)
	}
	if !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("read behind a swallowed identity check: %v, want ErrNotReady", err)
	}
	if n := swallowed.Load(); n < 2 {
		t.Fatalf("%d identity INQUIRYs swallowed, want a re-login after the first one's timeout", n)
	}

	swallow.Store(false)
	got := make([]byte, 4096)
	for {
		_, err := v.ReadAt(got, 0)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no read succeeded after the target answered the check again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the read after the check passed returned other data than before the cut")
	}
}
