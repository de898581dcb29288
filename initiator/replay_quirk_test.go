package initiator_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/logsink"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestReplayOnErrInvalidatesLocally: on a device that may carry a
// received SEND_WITH_INV out again as its QP enters ERR (rxe on Linux
// 6.12.95, where the second invalidation oopses the kernel), the
// initiator never asks the target for remote invalidation and ends every
// I/O with its own LOCAL_INV; on the same device without the quirk the
// target invalidates.
func TestReplayOnErrInvalidatesLocally(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay bool
	}{
		{"replay", true},
		{"no-replay", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := transport.Quirks{ReplayOnErr: tc.replay}
			r := newRig(t, emu.Config{Seed: 1, Quirks: &q}, 4<<20, target.Config{})
			s := r.dial(t, initiator.Config{ImmediateData: -1})
			ctx := context.Background()
			v := openVol0(t, ctx, s)
			buf := make([]byte, 16<<10)
			for i := range 8 {
				buf[0] = byte(i)
				if _, err := v.WriteAt(buf, int64(i)*int64(len(buf))); err != nil {
					t.Fatal(err)
				}
				if _, err := v.ReadAt(buf, int64(i)*int64(len(buf))); err != nil {
					t.Fatal(err)
				}
			}
			// The pools' counters are published once a tick; 16
			// registrations (8 writes, 8 reads) end one way or the other.
			var remote, local uint64
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				remote, local = 0, 0
				for _, p := range s.Stats().FRMR {
					remote += p.RemoteInvalidations
					local += p.LocalInvalidationsOK
				}
				if remote+local >= 16 {
					break
				}
			}
			if tc.replay && (remote != 0 || local < 16) {
				t.Fatalf("ReplayOnErr: %d remote invalidations, %d local ones proven, want 0 and at least 16", remote, local)
			}
			if !tc.replay && remote < 16 {
				t.Fatalf("no ReplayOnErr: %d remote invalidations, want at least 16", remote)
			}
		})
	}
}

// TestReplayOnErrUnderFaults runs a verified workload on a device that
// replays at ERR (emu with Quirks.ReplayOnErr, QPs moved to ERR at random)
// with windows: no replayed SEND_WITH_INV may reach a FREE window, which
// on rxe 6.12.95 is a kernel oops (emu counts them), and every block
// reads back what was last written.
func TestReplayOnErrUnderFaults(t *testing.T) {
	seed := testSeed(t)
	q := transport.Quirks{ReplayOnErr: true}
	r := newRig(t, emu.Config{Seed: seed, Quirks: &q, Faults: emu.Faults{QPError: 0.005}, RetryTimeout: 200 * time.Millisecond}, 16<<20, target.Config{})
	s := r.dial(t, initiator.Config{Credits: 32, Mechanism: frmr.MW})
	ctx := context.Background()
	v := openVol0(t, ctx, s)
	gens := workload(t, v, seed, 32, 2000)
	verifyAll(t, v, gens, seed)
	c := r.ip.Counters()
	if c.InjectedQPErrors == 0 {
		t.Fatalf("seed %d: no QP error was injected: the run tested nothing", seed)
	}
	if c.KernelOopses != 0 {
		t.Fatalf("seed %d: %d replayed SEND_WITH_INVs invalidated a FREE window (%d QP errors injected)", seed, c.KernelOopses, c.InjectedQPErrors)
	}
}

// TestReplayedCommandsLandInOrder: the target's NIC replays too. A
// command SEND whose receive completion srpd has not polled when its QP
// enters ERR arrives again in every receive still posted, each copy a
// success under the same tag. In gosrp's protocol srpd ends the
// connection at the first copy, as a request under the tag of one in
// flight (core.tagInFlight); in T10 SRP it answers the copy as an
// overlapped command and aborts the nexus's commands
// (core.srpOverlapped). Either way no copy runs, and what the original
// started, a channel's new login waits for (target.reinstate;
// TestReloginWaitsForOldWrites). Over four channels of overlapping
// verified writes, with QPs moved to ERR at random on both NICs, every
// block reads back what was last written (the rules themselves are the
// target core's traces, testdata/core/hostile and srp-overlapped).
//
// In T10 SRP a copy is not taken for an overlapped command: that would
// abort the other channels' commands (SAM-5 5.9.4) and say so only on
// the QP in ERR, and they would wait out the I/O timeout (30 s). The
// target logs every overlapped command; the run wants none.
func TestReplayedCommandsLandInOrder(t *testing.T) {
	for _, tc := range protocols {
		t.Run(tc.name, func(t *testing.T) {
			seed := testSeed(t)
			q := transport.Quirks{ReplayOnErr: true}
			var logs logsink.Buffer
			tcfg := tc.tcfg
			tcfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			r := newRig(t, emu.Config{Wire: emu.WireTCP, Seed: seed, Quirks: &q, Faults: emu.Faults{QPError: 0.005}, RetryTimeout: 200 * time.Millisecond}, 1<<20, tcfg)
			cfg := tc.cfg
			cfg.Channels, cfg.Credits = 4, 16
			s := r.dial(t, cfg)
			ctx := context.Background()
			v := openNamed(t, ctx, s, tc.vol)
			gens := workload(t, v, seed, 32, 3000)
			verifyAll(t, v, gens, seed)
			tc, ic := r.tp.Counters(), r.ip.Counters()
			t.Logf("seed %d: target NIC %d QP errors, %d receives replayed; initiator NIC %d and %d", seed, tc.InjectedQPErrors, tc.Replays, ic.InjectedQPErrors, ic.Replays)
			if tc.Replays == 0 {
				t.Fatalf("seed %d: the target's NIC replayed no command: the run tested nothing", seed)
			}
			if n := strings.Count(logs.String(), "overlapped command"); n > 0 {
				t.Fatalf("seed %d: %d replayed commands taken for overlapped ones", seed, n)
			}
		})
	}
}
