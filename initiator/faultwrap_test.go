package initiator_test

import (
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/faults"
)

// TestFaultsWrapped runs TestFaults' verified workload with the faults
// made by transport/faults in front of the initiator (refused posts, QP
// errors, lost completions, and completions that report an error for WRs
// the device did carry out) rather than by the software NIC: the faults
// TestRXEEndToEnd makes on the real device. Every acknowledged write must
// be on the volume afterwards, and no local operation may execute where a
// retry would execute it again.
func TestFaultsWrapped(t *testing.T) {
	for _, wire := range []string{emu.WireTCP, emu.WireShm} {
		t.Run("wire="+wire, func(t *testing.T) {
			seed := testSeed(t)
			r := newRig(t, emu.Config{Profile: "rxe", Wire: wire, Seed: seed}, 8<<20, target.Config{})
			fp := faults.Wrap(r.ip, faults.Config{Seed: seed, PostFail: 0.002, QPError: 0.001, DropCQE: 0.001, CorruptCQE: 0.002})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := initiator.Dial(ctx, initiator.Config{Provider: fp, Addr: r.addr, Name: "faults-wrapped", Credits: 16,
				IOTimeout: 2 * time.Second, ConnectTimeout: 2 * time.Second, LossTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			v, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			gens := workload(t, v, seed, 16, 1500)
			verifyAll(t, v, gens, seed)
			c := fp.Counters()
			t.Logf("faults %+v; connections lost %d, reconnects %d", c, s.Stats().ConnectionsLost, s.Stats().Reconnects)
			if c.PostFails+c.QPErrors+c.Drops+c.Corrupts == 0 {
				t.Errorf("no fault was made: the run tested nothing")
			}
			// rxe repeats, on a retry, what executed behind the request
			// retried (transport.Quirks.RetryRepeatsLocalOps): no
			// registration or invalidation may execute there, retry or
			// not, through reconnects and failed posts alike.
			if n := r.ip.Counters().ExposedLocalOps; n != 0 {
				t.Errorf("%d local operations executed behind a request waiting for its ACK", n)
			}
		})
	}
}
