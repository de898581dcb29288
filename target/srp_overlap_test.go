package target

import (
	"bytes"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// TestSRPOverlappedCommand: a hostile SRP initiator sends a WRITE under
// the tag of its READ still at the volume, with another READ of the
// same I_T nexus running on a second channel. The WRITE never runs and
// is answered CHECK CONDITION, ABORTED COMMAND, OVERLAPPED COMMANDS
// ATTEMPTED once both READs stopped (SAM-5 5.9.4), with the credit of
// the READ it aborted on its channel; neither READ is answered nor
// writes the initiator's memory, and the other channel's credit comes
// back too. The retried WRITE then runs. The core's rule is
// srpOverlapped (core_srp_tmf.go), its trace testdata/core/srp-overlapped.
func TestSRPOverlappedCommand(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		gate, entered := r.gateReads()
		dial := func(action uint8) *srpClient {
			t.Helper()
			req := srpLoginReq(1)
			req.Flags = req.Flags&^srp.MultiChanMask | action
			c, err := r.srpDial(t, req)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		a, b := dial(srp.MultiChanSingle), dial(srp.MultiChanMulti)
		sentinel := pattern(bs, 0xee)
		copy(a.data(0, bs), sentinel)
		copy(b.data(0, bs), sentinel)
		b.post(b.in(srpCmd(lunVol1, rw10(0x28, 0, 1, false)...), 0, bs))
		<-entered
		tag := a.post(a.in(srpCmd(lunVol0, rw10(0x28, 0, 1, false)...), 0, bs))
		<-entered

		want := pattern(bs, 7)
		copy(a.data(bs, bs), want)
		write := a.out(srpCmd(lunVol0, rw10(0x2a, 5, 1, false)...), bs, bs)
		a.postTag(write, tag)
		// As in TestSRPNexusTaskManagement: two commands answered on a
		// after the WRITE, and its step, which carries the abort to b,
		// is over; a command on b answered then, and b took it in.
		tur := func(c *srpClient) srp.Rsp { return c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)) }
		a.good("TEST UNIT READY", tur(a), 0)
		a.good("TEST UNIT READY", tur(a), 0)
		b.good("second channel: TEST UNIT READY", tur(b), 0)
		close(gate)

		raw, _ := a.mustNext()
		var rsp srp.Rsp
		if err := rsp.Decode(raw); err != nil {
			t.Fatal(err)
		}
		if rsp.Tag != tag {
			t.Fatalf("answer for tag %#x, want the overlapped command's %#x (the aborted READ was answered?)", rsp.Tag, tag)
		}
		a.checkSense("the overlapped WRITE", rsp, scsi.SenseOverlapped)
		if rsp.ReqLimDelta != 2 {
			t.Errorf("the overlapped command returned %d credits, want 2 (its own and the aborted READ's)", rsp.ReqLimDelta)
		}
		if got := r.stored(t, "vol0", 5*bs, bs); !bytes.Equal(got, make([]byte, bs)) {
			t.Fatal("the overlapped WRITE reached the volume")
		}
		if !bytes.Equal(a.data(0, bs), sentinel) || !bytes.Equal(b.data(0, bs), sentinel) {
			t.Fatal("an aborted READ's data reached the initiator's memory")
		}

		// The other channel's READ was aborted: no answer, and its credit
		// comes back (in an SRP_CRED_REQ, or with the next answer).
		bt := b.post(srpCmd(lunVol1, 0, 0, 0, 0, 0, 0))
		raw, _ = b.mustNext()
		if err := rsp.Decode(raw); err != nil {
			t.Fatal(err)
		}
		if rsp.Tag != bt {
			t.Fatalf("second channel: answer for tag %#x, want the TEST UNIT READY's %#x (the aborted READ was answered?)", rsp.Tag, bt)
		}
		if n := 1 + rsp.ReqLimDelta + b.credited; n != 3 {
			t.Errorf("second channel: %d credits back, want 3 (two TEST UNIT READYs' and the aborted READ's)", n)
		}

		a.good("the WRITE retried", a.do(write), 0)
		if got := r.stored(t, "vol0", 5*bs, bs); !bytes.Equal(got, want) {
			t.Fatal("the retried WRITE did not land")
		}
		a.logout()
		b.logout()
	})
}
