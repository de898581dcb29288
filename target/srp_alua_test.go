package target

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// fakeGateway is the path state of the rig's volumes at its target, as
// a gateway's catalog keeps it: standby until a takeover, which reports
// the change through Target.PathStateChanged from inside TakeOver, as
// srpd's OnStateChange hook does.
type fakeGateway struct {
	tgt       *Target
	standby   atomic.Bool
	fail      atomic.Bool
	fenced    atomic.Bool
	takeovers atomic.Int32
	closes    atomic.Int32
}

// pathVolume is a rig volume behind a fakeGateway; its I/O fails with
// ErrStandby while standby, as a gateway handle's does.
type pathVolume struct {
	Volume
	name string
	g    *fakeGateway
}

func (v *pathVolume) Standby() bool { return v.g.standby.Load() }

func (v *pathVolume) Fenced() bool { return v.g.fenced.Load() }

func (v *pathVolume) TakeOver() error {
	if v.g.fail.Load() {
		return errors.New("the cluster refused the lock")
	}
	v.g.takeovers.Add(1)
	if v.g.standby.Swap(false) {
		v.g.tgt.PathStateChanged(v.name, false)
	}
	return nil
}

func (v *pathVolume) ReadAt(p []byte, off int64) (int, error) {
	if v.g.standby.Load() {
		return 0, ErrStandby
	}
	return v.Volume.ReadAt(p, off)
}

func (v *pathVolume) Close() error {
	v.g.closes.Add(1)
	if c, ok := v.Volume.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// gatewayRig is a rig whose volumes are a standby gateway's, with
// SRPPortGroup group (0: ALUA off).
func gatewayRig(t *testing.T, e env, group uint16) (*rig, *fakeGateway) {
	t.Helper()
	g := &fakeGateway{}
	g.standby.Store(true)
	r := newRig(t, e, Config{SRPPortGroup: group})
	g.tgt = r.tgt
	r.cat.wrap = func(v Volume) Volume { return &pathVolume{Volume: v, name: "vol0", g: g} }
	return r, g
}

// rtpg sends REPORT TARGET PORT GROUPS with the extended header and
// returns the response and its data.
func (c *srpClient) rtpg(lun uint16) (srp.Rsp, []byte) {
	clear(c.data(0, 64))
	r := c.do(c.in(srpCmd(lun, 0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0), 0, 64))
	return r, c.data(0, 64)
}

// hearsAccessChanged sends TEST UNIT READY until the port is standby,
// and fails the test unless ASYMMETRIC ACCESS STATE CHANGED came first:
// the connection learns of a path change on its own time, so a command
// may still find the state before it (served, or standby), and a change
// it took in as two may be reported twice.
func (c *srpClient) hearsAccessChanged(t *testing.T, tur func(*srpClient) srp.Rsp) {
	t.Helper()
	told := false
	waitFor(t, "the change to be reported", func() bool {
		rsp := tur(c)
		sense, _ := scsi.ParseSense(rsp.Sense)
		switch {
		case sense == scsi.SenseAccessChanged:
			told = true
		case rsp.Status == 0 || sense == scsi.SenseStandby:
		default:
			t.Fatalf("TEST UNIT READY: status %#x, sense %s while the change was reported", rsp.Status, sense)
		}
		return told && sense == scsi.SenseStandby
	})
}

// stpg sends SET TARGET PORT GROUPS with one descriptor: group, state.
func (c *srpClient) stpg(lun, group uint16, state byte) srp.Rsp {
	param := []byte{0, 0, 0, 0, state, 0, byte(group >> 8), byte(group)}
	copy(c.data(0, len(param)), param)
	return c.do(c.out(srpCmd(lun, 0xA4, 0x0A, 0, 0, 0, 0, 0, 0, 0, byte(len(param)), 0, 0), 0, len(param)))
}

// TestSRPALUA: an SRP host sees a gateway's volume as SPC-4 ALUA
// describes a target port group, so that Linux's scsi_dh_alua attaches
// and dm-multipath can group the gateways' paths by state and activate
// a standby one: INQUIRY says TPGS 11b, VPD 0x83 names the group and
// the relative port, REPORT TARGET PORT GROUPS gives the state, a
// standby port refuses TEST UNIT READY (what multipath's tur checker
// reads as a standby path) but serves READ CAPACITY, and SET TARGET
// PORT GROUPS takes the volume over. The other nexus is told
// ASYMMETRIC ACCESS STATE CHANGED, the one that asked is not; a
// takeover through another gateway tells both. A failed takeover is
// SET TARGET PORT GROUPS COMMAND FAILED. A fenced gateway's unit is
// unavailable.
func TestSRPALUA(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		const group = 0x0102
		r, g := gatewayRig(t, e, group)
		a, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.srpDial(t, srpLoginReq(2))
		if err != nil {
			t.Fatal(err)
		}
		tur := func(c *srpClient) srp.Rsp { return c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)) }

		a.good("INQUIRY", a.do(a.in(srpCmd(lunVol0, 0x12, 0, 0, 0, 36, 0), 0, 36)), 0)
		if got := a.data(5, 1)[0]; got != 0x30 {
			t.Errorf("INQUIRY byte 5 %#02x, want TPGS 11b", got)
		}
		clear(a.data(0, 255))
		a.good("VPD 0x83", a.do(a.in(srpCmd(lunVol0, 0x12, 1, 0x83, 0, 255, 0), 0, 255)), srp.DIUnder)
		n := int(binary.BigEndian.Uint16(a.data(2, 2)))
		wantTail := []byte{0x01, 0x14, 0, 4, 0, 0, 0x01, 0x02, 0x01, 0x15, 0, 4, 0, 0, 0x01, 0x02}
		if got := a.data(4+n-16, 16); !bytes.Equal(got, wantTail) {
			t.Errorf("VPD 0x83 ends % x, want the relative port and port group designators % x", got, wantTail)
		}

		state := func(who string, c *srpClient) byte {
			t.Helper()
			rsp, d := c.rtpg(lunVol0)
			c.good(who+": REPORT TARGET PORT GROUPS", rsp, srp.DIUnder)
			if got := binary.BigEndian.Uint16(d[10:]); got != group {
				t.Fatalf("%s: REPORT TARGET PORT GROUPS group %#x, want %#x", who, got, group)
			}
			return d[8] & 0x0f
		}
		// A standby unit tells each new nexus its state changed, so that
		// scsi_dh_alua asks for it (srpNexus.unit); the first command
		// that reports unit attentions takes it.
		for _, c := range []*srpClient{a, b} {
			c.checkSense("the first TEST UNIT READY of a nexus on a standby unit", tur(c), scsi.SenseAccessChanged)
		}
		if st := state("standby", a); st != 2 {
			t.Fatalf("state %d on a standby gateway, want 2 (standby)", st)
		}
		a.checkSense("TEST UNIT READY on the standby port", tur(a), scsi.SenseStandby)
		b.checkSense("TEST UNIT READY on the standby port", tur(b), scsi.SenseStandby)
		a.good("READ CAPACITY(16) on the standby port", a.do(a.in(srpCmd(lunVol0, 0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0), 0, 32)), 0)

		g.fail.Store(true)
		a.checkSense("SET TARGET PORT GROUPS that cannot take over", a.stpg(lunVol0, group, 0), scsi.SenseSetPortGroupsFailed)
		g.fail.Store(false)
		a.checkSense("SET TARGET PORT GROUPS giving the volume up", a.stpg(lunVol0, group, 2), scsi.SenseInvalidParam)
		if g.takeovers.Load() != 0 {
			t.Fatalf("%d takeovers after refused lists", g.takeovers.Load())
		}

		a.good("SET TARGET PORT GROUPS active/optimized", a.stpg(lunVol0, group, 0), 0)
		if g.takeovers.Load() != 1 {
			t.Fatalf("%d takeovers, want 1", g.takeovers.Load())
		}
		// The host that asked finds the volume served at once, and is
		// not told of the change it made (SPC-4 5.15.2.3) on any
		// command, however the change reaches its connection.
		a.good("TEST UNIT READY after the takeover", tur(a), 0)
		want := pattern(bs, 9)
		copy(a.data(0, bs), want)
		a.good("WRITE(10)", a.do(a.out(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x2A, 3, 1, false)}, 0, bs)), 0)
		if st := state("active", a); st != 0 {
			t.Fatalf("state %d after the takeover, want 0 (active/optimized)", st)
		}
		// Until b's connection takes the change in, its TEST UNIT READY
		// still finds the port standby (a CHECK CONDITION too): wait for
		// the unit attention itself.
		waitFor(t, "the other nexus to hear of the takeover", func() bool {
			sense, _ := scsi.ParseSense(tur(b).Sense)
			return sense == scsi.SenseAccessChanged
		})
		b.good("TEST UNIT READY after the unit attention", tur(b), 0)
		a.good("TEST UNIT READY, nothing owed", tur(a), 0)

		// Another gateway takes the volume over: both nexuses are told.
		g.standby.Store(true)
		r.tgt.PathStateChanged("vol0", true)
		for _, c := range []*srpClient{a, b} {
			var sense scsi.Sense
			waitFor(t, "the takeover elsewhere", func() bool {
				rsp := tur(c)
				sense, _ = scsi.ParseSense(rsp.Sense)
				return rsp.Status == uint8(scsi.StatusCheckCondition)
			})
			if sense != scsi.SenseAccessChanged {
				t.Fatalf("TEST UNIT READY after a takeover elsewhere: %s, want %s", sense, scsi.SenseAccessChanged)
			}
			c.checkSense("TEST UNIT READY on the port now standby", tur(c), scsi.SenseStandby)
		}
		// A takeover here and one elsewhere in quick succession, before
		// the connections look: the state is standby again, but it
		// changed twice, and each host is told (SPC-4 5.15.2.3).
		r.tgt.PathStateChanged("vol0", false)
		r.tgt.PathStateChanged("vol0", true)
		for _, c := range []*srpClient{a, b} {
			c.hearsAccessChanged(t, tur)
		}
		clear(a.data(0, bs))
		a.checkSense("READ(10) on the port now standby", a.do(a.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 3, 1, false)}, 0, bs)), scsi.SenseStandby)
		b.good("SET TARGET PORT GROUPS back", b.stpg(lunVol0, group, 1), 0)
		clear(b.data(0, bs))
		b.good("READ(10) after taking it back", b.do(b.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 3, 1, false)}, 0, bs)), 0)
		if !bytes.Equal(b.data(0, bs), want) {
			t.Error("the block written before the takeovers reads back otherwise")
		}
		// a did not ask for b's takeover: it hears of it, and then finds
		// the volume served.
		waitFor(t, "the other nexus to hear of the takeover back", func() bool {
			sense, _ := scsi.ParseSense(tur(a).Sense)
			return sense == scsi.SenseAccessChanged
		})
		a.good("TEST UNIT READY after the takeover back", tur(a), 0)

		// The policy takes vol0 from b and leaves a only reading. b's
		// handle closes once nothing runs on it, its takeover included;
		// a read-only host may still take the volume over (reads need
		// it served).
		closes := g.closes.Load()
		r.tgt.SetACL(&ACL{Rules: []ACLRule{{Initiator: srpInitiatorName(srpPort(2)), Volume: "vol0", Access: AccessNone},
			{Initiator: srpInitiatorName(srpPort(1)), Volume: "vol0", Access: AccessReadOnly}}})
		waitFor(t, "the revoked handle to close", func() bool { return g.closes.Load() > closes })
		g.standby.Store(true)
		r.tgt.PathStateChanged("vol0", true)
		waitFor(t, "the read-only host to hear of the change", func() bool { return tur(a).Status == uint8(scsi.StatusCheckCondition) })
		a.checkSense("TEST UNIT READY, standby again", tur(a), scsi.SenseStandby)
		a.good("SET TARGET PORT GROUPS from a read-only host", a.stpg(lunVol0, group, 0), 0)
		a.good("READ(10) after its takeover", a.do(a.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 3, 1, false)}, 0, bs)), 0)
		if g.takeovers.Load() != 3 {
			t.Errorf("%d takeovers, want 3", g.takeovers.Load())
		}

		// Fenced by another gateway's takeover, this one cannot serve
		// the volume before it restarts: unavailable, not standby.
		g.standby.Store(true)
		g.fenced.Store(true)
		g.fail.Store(true)
		r.tgt.PathFenced("vol0")
		waitFor(t, "the fenced state", func() bool { return tur(a).Status == uint8(scsi.StatusCheckCondition) })
		a.checkSense("TEST UNIT READY on the fenced port", tur(a), scsi.SenseUnavailable)
		rsp, d := a.rtpg(lunVol0)
		a.good("REPORT TARGET PORT GROUPS on the fenced port", rsp, srp.DIUnder)
		if st, sup := d[8]&0x0f, d[9]; st != 3 || sup != 0x0d {
			t.Errorf("fenced: state %d, supported %#02x; want 3 (unavailable), 0x0d", st, sup)
		}
		a.checkSense("SET TARGET PORT GROUPS on the fenced port", a.stpg(lunVol0, group, 0), scsi.SenseSetPortGroupsFailed)
		a.logout()
		b.logout()
	})
}

// TestSRPALUAOff: without SRPPortGroup a gateway's volume shows SRP hosts
// no ALUA (TPGS 0, no TARGET PORT GROUPS commands), and a standby
// gateway refuses I/O in its store, with the same NOT READY sense.
func TestSRPALUAOff(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, _ := gatewayRig(t, e, 0)
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		c.good("INQUIRY", c.do(c.in(srpCmd(lunVol0, 0x12, 0, 0, 0, 36, 0), 0, 36)), 0)
		if got := c.data(5, 1)[0]; got != 0 {
			t.Errorf("INQUIRY byte 5 %#02x without a port group, want 0", got)
		}
		rsp, _ := c.rtpg(lunVol0)
		c.checkSense("REPORT TARGET PORT GROUPS", rsp, scsi.SenseInvalidField)
		c.checkSense("SET TARGET PORT GROUPS", c.stpg(lunVol0, 1, 0), scsi.SenseInvalidOpcode)
		c.good("TEST UNIT READY", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0)
		c.checkSense("READ(10)", c.do(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 0, 1, false)}, 0, bs)), scsi.SenseStandby)
		c.logout()
	})
}
