package initiator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
)

// TestHostileSRPFenceNoLogin: in an SRP session of two channels the
// second loses its connection, and from then on the target never logs
// the nexus in again: it accepts every connection with no
// SRP_LOGIN_RSP in it, or it refuses every SINGLE login with an
// SRP_LOGIN_REJ while it would take MULTI ones. The second channel
// waits for a SINGLE login of the first that never completes
// (srpFence), the first is told to log in again and cannot: the writes
// queued on both must still fail with ErrConnectionLost at LossTimeout,
// not wait for the fence, and Close must return at once. The first
// channel's tries back off (channel.churn), so the target sees a
// bounded number.
func TestHostileSRPFenceNoLogin(t *testing.T) {
	for _, tc := range []struct {
		name string
		// script returns the target's script and the count of logins
		// it refused, once refuse is set.
		script func(refuse *atomic.Bool, logins *atomic.Int32) targettest.Script
	}{
		{"no login response", func(refuse *atomic.Bool, logins *atomic.Int32) targettest.Script {
			return targettest.Script{Accept: func(priv []byte) []byte {
				if !refuse.Load() {
					return priv
				}
				logins.Add(1)
				return []byte{0xFF} // no SRP_LOGIN_RSP
			}}
		}},
		{"SINGLE rejected", refuseSINGLE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var refuse atomic.Bool
			var logins atomic.Int32
			fenceNeverOpens(t, tc.script(&refuse, &logins), &refuse, &logins)
		})
	}
}

func fenceNeverOpens(t *testing.T, script targettest.Script, refuse *atomic.Bool, logins *atomic.Int32) {
	const loss, slack, maxLogins = 2 * time.Second, 3 * time.Second, 40
	r := newHostileRigWith(t, "rxe", script, target.Config{SRPTargetPortID: srpPort})
	s := dial(t, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "victim", Logger: quiet,
		Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Channels: 2,
		LossTimeout: loss, IOTimeout: time.Second, ConnectTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, ctx, v, make([]byte, 8192), 0)

	refuse.Store(true)
	if err := r.ip.CutLink(initiator.PinChannel(s, 1)); err != nil {
		t.Fatal(err)
	}
	// Both channels down: the cut one, and the first, told to log the
	// nexus in again. A write sent before the first had heard of it
	// would have gone out on its live connection.
	waitUntil(t, "both channels down", func() bool { return s.Stats().ConnectionsLost >= 2 })
	start := time.Now()
	errs := make(chan error, 2)
	for i := range 2 { // one on each channel
		go func() { errs <- write(v, int64(i)*4096, loss+slack) }()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, initiator.ErrConnectionLost) {
			t.Fatalf("write across a lost channel whose nexus cannot log in again: %v after %v, want ErrConnectionLost within LossTimeout %v + %v",
				err, time.Since(start).Round(time.Millisecond), loss, slack)
		}
	}
	t.Logf("both writes failed after %v; %d logins tried", time.Since(start).Round(time.Millisecond), logins.Load())
	if logins.Load() == 0 {
		t.Fatal("no login was tried after the loss: the run tested nothing")
	}
	if n := logins.Load(); n > maxLogins {
		t.Errorf("%d logins in %v: the channels did not back off (want at most %d)", n, time.Since(start).Round(time.Millisecond), maxLogins)
	}
	closed := time.Now()
	if err := s.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	if d := time.Since(closed); d > slack {
		t.Fatalf("Close took %v with a channel waiting for the nexus's login", d.Round(time.Millisecond))
	}
}

// refuseSINGLE is a target script that, while refuse is set, rejects
// every SINGLE login with an SRP_LOGIN_REJ (insufficient resources) and
// counts it in refused; it takes every MULTI login.
func refuseSINGLE(refuse *atomic.Bool, refused *atomic.Int32) targettest.Script {
	return targettest.Script{Request: func(priv []byte) ([]byte, bool) {
		var req srp.LoginRequest
		if !refuse.Load() || req.DecodeRDMA(priv) != nil || req.Flags&srp.MultiChanMask != srp.MultiChanSingle {
			return nil, false
		}
		refused.Add(1)
		rej := srp.LoginReject{Reason: srp.RejectInsufficientResources, Tag: req.Tag,
			BufFormats: srp.BufFormatDirect | srp.BufFormatIndirect}
		b := make([]byte, srp.LoginRejectLen)
		if _, err := rej.Encode(b); err != nil {
			panic(err) // b holds LoginRejectLen bytes
		}
		return b, true
	}}
}
