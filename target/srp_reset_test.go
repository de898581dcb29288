package target

import (
	"bytes"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/logsink"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// writeGatedVolume blocks writes until its gate lets them through:
// a write held in the backend, its job running.
type writeGatedVolume struct {
	Volume
	gate    chan struct{}
	entered chan struct{}
}

func (g *writeGatedVolume) hold() {
	g.entered <- struct{}{}
	<-g.gate
}

func (g *writeGatedVolume) WriteAt(p []byte, off int64) (int, error) {
	g.hold()
	return g.Volume.WriteAt(p, off)
}

func (g *writeGatedVolume) WriteAtFUA(p []byte, off int64) (int, error) {
	g.hold()
	return g.Volume.WriteAtFUA(p, off)
}

// gateWrites wraps every volume the rig's catalog opens from now on in a
// writeGatedVolume: a write signals entered and then waits for gate.
func (r *rig) gateWrites() (gate, entered chan struct{}) {
	gate, entered = make(chan struct{}), make(chan struct{}, 8)
	r.cat.wrap = func(v Volume) Volume { return &writeGatedVolume{Volume: v, gate: gate, entered: entered} }
	return gate, entered
}

// stored reads n bytes at off of the rig's volume name from the store,
// behind the target.
func (r *rig) stored(t *testing.T, name string, off int64, n int) []byte {
	t.Helper()
	v, err := r.store.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	b := make([]byte, n)
	if _, err := v.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// srpResetRig starts a rig whose volume writes wait for a gate, logs in
// nexus A (one channel, port 1) and nexus B (two channels, port 2),
// and has B's second channel send a WRITE of one block at LBA 0 of lun,
// which is held in the backend; it returns that WRITE's tag and data.
func srpResetRig(t *testing.T, e env, cfg Config, lun uint16) (r *rig, gate chan struct{}, a *srpClient, b []*srpClient, tag uint64, data []byte) {
	t.Helper()
	r = newRig(t, e, cfg)
	gate, entered := r.gateWrites()
	a = r.srpChannels(t, 1, 1)[0]
	b = r.srpChannels(t, 2, 2)
	for _, c := range append([]*srpClient{a}, b...) {
		c.good("TEST UNIT READY before", srpTUR(c, lunVol1), 0) // the session's LUNs are open
	}
	data = pattern(bs, 0x5a)
	copy(b[1].data(0, bs), data)
	tag = b[1].post(b[1].out(srp.Cmd{LUN: scsi.EncodeLUN(lun), CDB: rw10(0x2a, 0, 1, false)}, 0, bs))
	<-entered
	return r, gate, a, b, tag, data
}

// resetHeld sends a LOGICAL UNIT RESET of lun on a, while another
// nexus's WRITE of the unit is held, and returns its tag: two commands
// a sends after it are answered first (it waits for the WRITE), and
// once they are, a's step has carried the reset to the other nexuses'
// channels, so a command one of them sends now is answered only after
// it took the reset in.
func resetHeld(a *srpClient, lun uint16) uint64 {
	a.tb.Helper()
	reset := a.tmf(srp.TaskLUNReset, lun, 0)
	for range 2 {
		a.good("the resetting nexus while the other's WRITE is held", srpTUR(a, lun), 0)
	}
	return reset
}

// srpTUR runs TEST UNIT READY on lun of channel c.
func srpTUR(c *srpClient, lun uint16) srp.Rsp {
	c.tb.Helper()
	return c.do(srpCmd(lun, 0, 0, 0, 0, 0, 0))
}

// TestSRPResetOtherNexus: a LOGICAL UNIT RESET aborts the unit's
// commands of every I_T nexus (SAM-5 6.3.3), not only the requester's.
// Nexus B's WRITE, held in the backend, keeps A's reset unanswered
// while A's other commands are answered; once the WRITE's job ends, B
// gets TASK ABORTED for it (TAS, the control mode page; ib_srp passes
// the status up and Linux retries it) and then A gets FUNCTION
// COMPLETE, the WRITE's data already in the volume and not changing
// after. B's next command, on either channel, reports BUS DEVICE RESET
// FUNCTION OCCURRED once for the nexus, and B's retried WRITE runs. The
// reset is logged where it was received and where it aborted B's WRITE.
func TestSRPResetOtherNexus(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		var logs logsink.Buffer
		r, gate, a, b, tag, data := srpResetRig(t, e, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, lunVol0)
		reset := resetHeld(a, lunVol0)
		b[1].checkSense("B's channel with the WRITE, after the reset", srpTUR(b[1], lunVol0), scsi.SenseResetOccurred)
		b[0].good("B's other channel: the nexus was told", srpTUR(b[0], lunVol0), 0)
		if got := r.stored(t, "vol0", 0, bs); !bytes.Equal(got, make([]byte, bs)) {
			t.Fatal("the held WRITE landed before its job was let go")
		}
		gate <- struct{}{}
		rsp := b[1].rsp()
		if rsp.Tag != tag || rsp.Status != uint8(scsi.StatusTaskAborted) || rsp.Flags != srp.DOUnder || rsp.DataOutResid != bs {
			t.Fatalf("B's aborted WRITE answered %+v, want tag %#x TASK ABORTED, DOUNDER %d", rsp, tag, bs)
		}
		a.tmfRsp("LOGICAL UNIT RESET", reset, srp.TaskComplete, 1)
		landed := r.stored(t, "vol0", 0, bs)
		if !bytes.Equal(landed, data) {
			t.Fatal("B's WRITE, whose job ran before the reset was answered, is not in the volume")
		}
		a.good("the resetting nexus after its reset", srpTUR(a, lunVol0), 0)
		if !bytes.Equal(r.stored(t, "vol0", 0, bs), landed) {
			t.Fatal("the volume changed after the reset was answered")
		}
		close(gate)
		copy(b[1].data(0, bs), pattern(bs, 0x33))
		b[1].good("B's WRITE retried", b[1].do(b[1].out(srpCmd(lunVol0, rw10(0x2a, 0, 1, false)...), 0, bs)), 0)
		if !bytes.Equal(r.stored(t, "vol0", 0, bs), pattern(bs, 0x33)) {
			t.Error("B's retried WRITE is not in the volume")
		}
		if s := r.tgt.Stats(); s.Violations != 0 {
			t.Errorf("%d protocol violations", s.Violations)
		}
		for _, want := range []string{
			`msg="SRP task management" function="LOGICAL UNIT RESET" lun=` + fmt.Sprint(lunVol0) + ` volume=vol0 tag=` + fmt.Sprint(reset) + ` aborted_here=0`,
			`msg="SRP commands aborted by another I_T nexus's task management; answered TASK ABORTED" function="LOGICAL UNIT RESET" volume=vol0 aborted=1`,
		} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("no log line with %s in:\n%s", want, logs.String())
			}
		}
		for _, c := range append([]*srpClient{a}, b...) {
			c.logout()
		}
	})
}

// TestSRPResetOtherUnit: a LOGICAL UNIT RESET of a unit nexus B does not
// have (its ACL denies it the volume) touches nothing of B: A's reset is
// answered while B's WRITE of another unit is held, which then
// completes GOOD, and B has no unit attention.
func TestSRPResetOtherUnit(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		acl := &ACL{Rules: []ACLRule{{Initiator: srpInitiatorName(srpPort(2)), Volume: "vol0", Access: AccessNone}}}
		r, gate, a, b, tag, data := srpResetRig(t, e, Config{ACL: acl}, lunVol1)
		b[0].checkSense("B on the volume it may not see", srpTUR(b[0], lunVol0), scsi.SenseLUNotSupported)
		a.tmfRsp("LOGICAL UNIT RESET", a.tmf(srp.TaskLUNReset, lunVol0, 0), srp.TaskComplete, 1)
		b[1].good("B's other unit after A's reset", srpTUR(b[1], lunVol1), 0)
		gate <- struct{}{}
		if rsp := b[1].rsp(); rsp.Tag != tag {
			t.Fatalf("B's next answer %+v, want its WRITE %#x", rsp, tag)
		} else {
			b[1].good("B's WRITE of the other unit", rsp, 0)
		}
		if !bytes.Equal(r.stored(t, "vol1", 0, bs), data) {
			t.Error("B's WRITE of the other unit is not in the volume")
		}
		close(gate)
		for _, c := range append([]*srpClient{a}, b...) {
			c.logout()
		}
	})
}

// TestSRPResetOtherNexusGone: a channel of nexus B that ends while A's
// reset waits for its held WRITE, or that ended before the reset with
// the WRITE still held, lets the reset complete once the channel's
// teardown is done (the WRITE's job ended); B's other channel serves on.
func TestSRPResetOtherNexusGone(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		for _, before := range []bool{false, true} {
			r, gate, a, b, _, _ := srpResetRig(t, e, Config{}, lunVol0)
			gone := func() {
				b[1].close()
				// Its core closed; its teardown waits for the held job.
				waitFor(t, "B's channel ending", func() bool {
					for _, c := range r.tgt.Stats().Conns {
						if c.State == connClosed.String() {
							return true
						}
					}
					return false
				})
			}
			if before {
				gone()
			}
			reset := resetHeld(a, lunVol0)
			if !before {
				b[1].checkSense("B's channel with the WRITE, after the reset", srpTUR(b[1], lunVol0), scsi.SenseResetOccurred)
				gone()
			}
			close(gate)
			a.tmfRsp("LOGICAL UNIT RESET", reset, srp.TaskComplete, 1)
			if before {
				b[0].checkSense("B's other channel after the reset", srpTUR(b[0], lunVol0), scsi.SenseResetOccurred)
			}
			b[0].good("B's other channel after the reset", srpTUR(b[0], lunVol0), 0)
			for _, c := range []*srpClient{a, b[0]} {
				c.logout()
			}
		}
	})
}

// TestSRPTaskManagementLogFlood: a host that resets a unit 200 times in
// a row has every reset answered FUNCTION COMPLETE, and its connection
// logs the first tmfLogBurst and then, when it ends, one line counting
// the rest, not a line per reset: every line and every not_logged count
// together account for the 200.
func TestSRPTaskManagementLogFlood(t *testing.T) {
	const resets = 200
	forSRPEnvs(t, func(t *testing.T, e env) {
		var logs logsink.Buffer
		// Registered before the rig's: runs after its shutdown, when the
		// connection's teardown has logged.
		t.Cleanup(func() {
			out := logs.String()
			lines, counted := 0, 0
			for _, l := range strings.Split(out, "\n") {
				if !strings.Contains(l, `msg="SRP task management`) {
					continue
				}
				lines++
				if !strings.Contains(l, "not logged before") {
					counted++ // a line for a function of its own
				}
				if m := notLogged.FindStringSubmatch(l); m != nil {
					n, _ := strconv.Atoi(m[1])
					counted += n
				}
			}
			if lines > tmfLogBurst+1 || counted != resets {
				t.Errorf("%d lines accounting for %d resets, want a few for %d:\n%s", lines, counted, resets, out)
			}
		})
		_, a := srpLoggedIn(t, e, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		a.good("TEST UNIT READY", srpTUR(a, lunVol0), 0)
		for range resets {
			a.tmfRsp("LOGICAL UNIT RESET", a.tmf(srp.TaskLUNReset, lunVol0, 0), srp.TaskComplete, 1)
		}
		a.logout()
	})
}

// notLogged finds a log line's count of functions left out.
var notLogged = regexp.MustCompile(` not_logged=(\d+)`)
