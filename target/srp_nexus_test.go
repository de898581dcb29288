package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// srpChannels logs in n channels of initiator port port, the first
// SINGLE and the others MULTI, as ib_srp's srp_connect_ch does for
// ch_count channels.
func (r *rig) srpChannels(t *testing.T, port byte, n int) []*srpClient {
	t.Helper()
	var cs []*srpClient
	for i := range n {
		req := srpLoginReq(port)
		if i > 0 {
			req.Flags = req.Flags&^srp.MultiChanMask | srp.MultiChanMulti
		}
		c, err := r.srpDial(t, req)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

// srpNexusTrio logs in two channels of initiator port 1 (a and b, one
// nexus) and one of port 2 (other, another nexus), and returns once
// each answered a TEST UNIT READY: its LUNs are open.
func (r *rig) srpNexusTrio(t *testing.T) (a, b, other *srpClient) {
	t.Helper()
	chans := r.srpChannels(t, 1, 2)
	a, b = chans[0], chans[1]
	other = r.srpChannels(t, 2, 1)[0]
	for _, c := range []*srpClient{a, b, other} {
		c.good("TEST UNIT READY after the login", srpTUR(c, lunVol1), 0)
	}
	return a, b, other
}

// srpGatedPair starts a rig whose volume reads wait for gate (rig.gateReads)
// and logs in two channels, a and b, of one nexus.
func srpGatedPair(t *testing.T, e env) (r *rig, gate, entered chan struct{}, a, b *srpClient) {
	t.Helper()
	r = newRig(t, e, Config{})
	gate, entered = r.gateReads()
	chans := r.srpChannels(t, 1, 2)
	return r, gate, entered, chans[0], chans[1]
}

// resize resizes the store's volume name to size and tells the target,
// as srpd does when it grows a volume.
func (r *rig) resize(t *testing.T, name string, size int64) {
	t.Helper()
	v, err := r.store.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Resize(size); err != nil {
		t.Fatal(err)
	}
	v.Close()
	if err := r.tgt.VolumeResized(context.Background(), name, size); err != nil {
		t.Fatal(err)
	}
}

// TestSRPNexusUnitAttention: the channels of one SRP session are one
// I_T nexus, and a unit attention is reported once per nexus (SAM-5
// 5.14), on whichever channel asks first; another nexus hears it on its
// own. After CAPACITY DATA HAS CHANGED on one channel, READ CAPACITY on
// the other has the new size. A catalog change is reported once per
// nexus and logical unit, too.
func TestSRPNexusUnitAttention(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		a, b, other := r.srpNexusTrio(t)
		tur := srpTUR
		r.resize(t, "vol1", 2*volSize)
		b.checkSense("second channel: TEST UNIT READY after the resize", tur(b, lunVol1), scsi.SenseCapacityChanged)
		a.good("first channel: TEST UNIT READY after the second was told", tur(a, lunVol1), 0)
		b.good("second channel: TEST UNIT READY again", tur(b, lunVol1), 0)
		clear(a.data(0, 8))
		a.good("first channel: READ CAPACITY(10)", a.do(a.in(srpCmd(lunVol1, 0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0), 0, 8)), 0)
		if got := binary.BigEndian.Uint32(a.data(0, 4)); got != 2*volSize/bs-1 {
			t.Errorf("first channel: READ CAPACITY(10) last LBA %d, want %d", got, 2*volSize/bs-1)
		}
		other.checkSense("another nexus: TEST UNIT READY after the resize", tur(other, lunVol1), scsi.SenseCapacityChanged)

		r.tgt.CatalogChanged()
		r.waitLUNTables(t)
		a.checkSense("first channel, LUN vol0: after the catalog change", tur(a, lunVol0), scsi.SenseLUNsChanged)
		b.good("second channel, LUN vol0", tur(b, lunVol0), 0)
		b.checkSense("second channel, LUN vol1: after the catalog change", tur(b, lunVol1), scsi.SenseLUNsChanged)
		a.good("first channel, LUN vol1", tur(a, lunVol1), 0)
		other.checkSense("another nexus, LUN vol0", tur(other, lunVol0), scsi.SenseLUNsChanged)
		for _, c := range []*srpClient{b, a, other} {
			c.logout()
		}
	})
}

// waitLUNTables waits until every SRP nexus of the rig's target has
// raised the last catalog change: each of its channels has listed the
// catalog and attached the new LUNs (srpNexus.tableAt).
func (r *rig) waitLUNTables(t *testing.T) {
	t.Helper()
	tbl := &r.tgt.srpNexuses
	waitFor(t, "every SRP nexus's LUN table", func() bool {
		gen := tbl.catalogGen.Load()
		tbl.mu.Lock()
		defer tbl.mu.Unlock()
		for _, n := range tbl.m {
			n.mu.Lock()
			behind := n.lunsGen < gen
			n.mu.Unlock()
			if behind {
				return false
			}
		}
		return true
	})
}

// TestSRPNexusTable: channels joining one key share a nexus, which
// goes with its last channel; a unit is made once per nexus and volume
// (a lost write cache raised on that first making only); a catalog
// change is raised once per generation, only when every channel of the
// nexus has that change's LUN table (or the last one behind left), not
// on a unit the change added while others exist, and not for a nexus
// made after it; a reset raises ResetOccurred on the volume's unit of
// every other nexus.
func TestSRPNexusTable(t *testing.T) {
	var tbl srpNexusTable
	a1, a2 := tbl.join("a", 1, 0), tbl.join("a", 2, 0)
	if a1 != a2 {
		t.Fatal("two channels of one key got two nexuses")
	}
	u := a1.unit("vol", 0, 10, true, gwActive, 0, false)
	if a2.unit("vol", 0, 20, true, gwActive, 0, false) != u || u.pending() != scsi.WriteCacheLost || u.blocks.Load() != 10 {
		t.Fatalf("second channel's unit: pending %s, blocks %d; want the first's (write-cache-lost, 10)", u.pending(), u.blocks.Load())
	}
	if !u.resize(20) || u.resize(20) {
		t.Error("a resize is raised once per change")
	}
	tbl.catalogGen.Add(1)
	added := a1.unit("new", 0, 20, false, gwActive, 1, false)
	if a1.tableAt(1, 1) || u.pending()&scsi.LUNsChanged != 0 {
		t.Error("a catalog change was raised before the nexus's second channel had its table")
	}
	if !a2.tableAt(2, 1) || a1.tableAt(1, 1) || u.pending()&scsi.LUNsChanged == 0 {
		t.Error("a catalog change is raised once per nexus, when its last channel has the table")
	}
	if added.pending() != 0 {
		t.Errorf("the unit the change added has %s pending; want nothing", added.pending())
	}
	tbl.catalogGen.Add(1)
	a1.tableAt(1, 2)
	tbl.leave(a2, 2)
	if u.pending()&scsi.LUNsChanged == 0 || a1.lunsGen != 2 {
		t.Error("the channel behind left, and the change it held back was not raised")
	}
	a2 = tbl.join("a", 2, 2)
	b := tbl.join("b", 3, 1)
	if b.tableAt(3, 1) {
		t.Error("a nexus made after the catalog change heard of it")
	}
	bu := b.unit("vol", 0, 20, false, gwActive, 0, false)
	b.unit("other", 0, 20, false, gwActive, 0, false)
	if n := a1.resetOthers("vol"); n != 1 || bu.pending() != scsi.ResetOccurred {
		t.Errorf("reset from a: raised on %d nexuses, b's unit pending %s; want 1, reset-occurred", n, bu.pending())
	}
	if u.pending()&scsi.ResetOccurred != 0 {
		t.Error("the resetting nexus heard of its own reset")
	}
	tbl.leave(a1, 1)
	if tbl.join("a", 4, 2) != a2 {
		t.Error("the nexus went before its last channel")
	}
	tbl.leave(a2, 2)
	tbl.leave(a2, 4)
	if tbl.join("a", 5, 2) == a1 {
		t.Error("the nexus outlived its channels")
	}
}

// next decodes the channel's next IU as an SRP_RSP, whatever credits it
// returns.
func (c *srpClient) next() srp.Rsp {
	c.tb.Helper()
	b, _ := c.mustNext()
	var r srp.Rsp
	if err := r.Decode(b); err != nil {
		c.tb.Fatalf("SRP_RSP: %v (% x)", err, b)
	}
	return r
}

// TestSRPNexusTaskManagement: LOGICAL UNIT RESET received on one channel
// of a nexus aborts the LUN's commands on its other channel too (no
// data, no SRP_RSP, the credit back in that channel's next response or
// an SRP_CRED_REQ),
// leaves another LUN's alone, is answered only once they stopped, and
// raises BUS DEVICE RESET FUNCTION OCCURRED on another nexus only. ABORT
// TASK SET reaches the other channel alike, with no unit attention.
func TestSRPNexusTaskManagement(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, gate, entered, a, b := srpGatedPair(t, e)
		other := r.srpChannels(t, 2, 1)[0]
		tur := func(c *srpClient, lun uint16) srp.Rsp { return c.do(srpCmd(lun, 0, 0, 0, 0, 0, 0)) }
		read := func(c *srpClient, lun uint16, off int) uint64 {
			return c.post(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lun), CDB: rw10(0x28, 0, 1, false)}, off, bs))
		}
		sentinel := pattern(2*bs, 0xee)
		copy(b.data(0, 2*bs), sentinel)
		// A command answered means the session's LUNs are open.
		other.good("another nexus before the reset", tur(other, lunVol0), 0)

		for _, fn := range []srp.TaskFunc{srp.TaskLUNReset, srp.TaskAbortTaskSet} {
			read(b, lunVol0, 0)
			kept := read(b, lunVol1, bs)
			<-entered
			<-entered
			tmf := a.tmf(fn, lunVol0, 0)
			// Two commands answered on a after the function: its step,
			// which carries the function to b, is over. A command on b
			// sent then is answered only after b took the function in.
			a.good("TEST UNIT READY on the resetting channel", tur(a, lunVol0), 0)
			a.good("TEST UNIT READY on the resetting channel", tur(a, lunVol0), 0)
			b.good("TEST UNIT READY on the other channel", tur(b, lunVol0), 0)
			gate <- struct{}{}
			gate <- struct{}{}
			a.tmfRsp(fn.String(), tmf, srp.TaskComplete, 1)
			// The aborted READ's credit rides on whichever of b's next
			// answers comes after its job stopped, or in an SRP_CRED_REQ
			// if it stopped after the other READ was answered.
			credited := b.credited
			rsp := b.next()
			if rsp.Tag != kept || rsp.Status != uint8(scsi.StatusGood) {
				t.Fatalf("%s: the other channel's next answer %+v, want the other LUN's READ %#x, GOOD", fn, rsp, kept)
			}
			credits := rsp.ReqLimDelta
			b.post(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0))
			if rsp = b.next(); rsp.Status != uint8(scsi.StatusGood) {
				t.Fatalf("%s: TEST UNIT READY after the abort: %+v", fn, rsp)
			}
			if credits += rsp.ReqLimDelta + b.credited - credited; credits != 3 {
				t.Fatalf("%s: the other channel's answers returned %d credits, want 3 (one for the aborted READ)", fn, credits)
			}
			if !bytes.Equal(b.data(0, bs), sentinel[:bs]) {
				t.Fatalf("%s: the aborted READ's data reached the initiator's memory", fn)
			}
			if fn == srp.TaskLUNReset {
				other.checkSense("another nexus after the reset", tur(other, lunVol0), scsi.SenseResetOccurred)
			}
			other.good(fmt.Sprintf("another nexus after %s", fn), tur(other, lunVol0), 0)
			a.good("the resetting nexus", tur(a, lunVol0), 0)
		}
		close(gate)
		for _, c := range []*srpClient{b, a, other} {
			c.logout()
		}
	})
}

// TestSRPNexusCreditRequest: a LOGICAL UNIT RESET on one channel that
// aborts every command of the nexus's other channel leaves that channel
// no answer to come, and ib_srp, which frees the aborted requests
// without their credits and keeps its last credit for task management,
// nothing to send a command with: the target returns the credits in an
// SRP_CRED_REQ, takes the SRP_CRED_RSP, and the channel runs its whole
// queue again.
func TestSRPNexusCreditRequest(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, gate, entered, a, b := srpGatedPair(t, e)
		queue := int(b.login.ReqLimDelta) - 1 // ib_srp keeps one credit for task management
		read := func(i int) uint64 {
			return b.post(b.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, uint32(i), 1, false)}, i*bs, bs))
		}
		for i := range queue {
			read(i)
		}
		for range queue {
			<-entered
		}
		reset := a.tmf(srp.TaskLUNReset, lunVol0, 0)
		// As in TestSRPNexusTaskManagement: once these are answered, b
		// took the reset in (its TEST UNIT READY costs the credit a
		// real ib_srp would keep, and returns it).
		tur := func(c *srpClient) srp.Rsp { return c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)) }
		a.good("TEST UNIT READY on the resetting channel", tur(a), 0)
		a.good("TEST UNIT READY on the resetting channel", tur(a), 0)
		b.good("TEST UNIT READY on the other channel", tur(b), 0)
		for range queue {
			gate <- struct{}{}
		}
		close(gate)
		a.tmfRsp("LOGICAL UNIT RESET", reset, srp.TaskComplete, 1)

		// b has nothing outstanding: the next IU is the SRP_CRED_REQ.
		iu, _ := b.client.mustNext()
		var q srp.CredReq
		if err := q.Decode(iu); err != nil {
			t.Fatalf("the other channel's next IU after the reset: %v (% x), want an SRP_CRED_REQ", err, iu)
		}
		if q.ReqLimDelta != uint32(queue) {
			t.Fatalf("SRP_CRED_REQ returns %d credits, want %d (the aborted READs')", q.ReqLimDelta, queue)
		}
		b.credRsp(q.Tag)
		tags := map[uint64]bool{}
		for i := range queue {
			tags[read(i)] = true
		}
		for range queue {
			rsp := b.rsp()
			if !tags[rsp.Tag] {
				t.Fatalf("SRP_RSP for tag %#x, not one of the READs after the reset", rsp.Tag)
			}
			delete(tags, rsp.Tag)
			b.good("READ after the credits came back", rsp, 0)
		}
		if s := r.tgt.Stats(); s.Violations != 0 {
			t.Errorf("%d protocol violations", s.Violations)
		}
		for _, c := range []*srpClient{b, a} {
			c.logout()
		}
	})
}

// TestACLSource: a rule naming a source host (SourcePrefix) applies to
// the sessions AllowFrom gives that host, below a rule naming the
// initiator and above "*"; it matches no initiator by name, so a gosrp
// initiator calling itself "addr:..." gets nothing of it.
func TestACLSource(t *testing.T) {
	const src = SourcePrefix + "10.0.2.15"
	acl := &ACL{DenyByDefault: true}
	acl.Rules = append(acl.Rules, ACLRule{src, "*", AccessReadOnly}, ACLRule{src, "vol1", AccessReadWrite},
		ACLRule{"port-a", "vol1", AccessNone}, ACLRule{"*", "vol2", AccessReadWrite}, ACLRule{src, "vol2", AccessNone})
	for _, tc := range []struct {
		ini, src, vol string
		want          Access
	}{
		{"port-b", "10.0.2.15", "vol0", AccessReadOnly},  // the source's "*"
		{"port-b", "10.0.2.15", "vol1", AccessReadWrite}, // the source's own rule
		{"port-a", "10.0.2.15", "vol1", AccessNone},      // the initiator's rule beats the source's
		{"port-a", "10.0.2.15", "vol0", AccessReadOnly},
		{"port-b", "10.0.2.15", "vol2", AccessNone},      // the source beats "*"
		{"port-b", "10.0.2.16", "vol2", AccessReadWrite}, // another host: "*"
		{"port-b", "10.0.2.16", "vol0", AccessNone},      // the default
		{"port-b", "", "vol0", AccessNone},
		{"addr:10.0.2.15", "", "vol0", AccessNone}, // a name is no source
		{"port-b", "10.0.2.15", "vol1@s1", AccessReadWrite},
	} {
		if got := acl.AllowFrom(tc.ini, tc.src, tc.vol); got != tc.want {
			t.Errorf("AllowFrom(%s, %s, %s) = %s, want %s", tc.ini, tc.src, tc.vol, got, tc.want)
		}
	}
	if acl.Allow("addr:10.0.2.15", "vol0") != AccessNone {
		t.Error("Allow matched a source rule by the initiator's name")
	}
}

// TestSRPSourceACL: an SRP session's LUNs follow the rules naming its
// source host: denied by one, its LUN has no unit; a gosrp initiator
// from the same host, not an SRP session, is not bound by them.
func TestSRPSourceACL(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, c := srpLoggedIn(t, e, Config{})
		host := source(r.tgt.Stats().Conns[0].Remote)
		c.logout()
		r.tgt.SetACL(&ACL{Rules: []ACLRule{{Initiator: SourcePrefix + host, Volume: "vol0", Access: AccessNone}}})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		c.checkSense("TEST UNIT READY on the LUN the source may not see", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), scsi.SenseLUNotSupported)
		c.good("TEST UNIT READY on another LUN", c.do(srpCmd(lunVol1, 0, 0, 0, 0, 0, 0)), 0)
		c.logout()
		g := r.dial(t)
		g.login("ini")
		g.open("vol0", false)
	})
}

// TestSRPUnitALUAAtLogin: a new unit that reports a target port group
// and is not active starts with ASYMMETRIC ACCESS STATE CHANGED
// pending, so that Linux's scsi_dh_alua, which on 6.12 reads no port
// group state when it attaches, asks for it at the first command; an
// active unit, or one without ALUA, starts with nothing pending.
func TestSRPUnitALUAAtLogin(t *testing.T) {
	for _, c := range []struct {
		st   gwState
		alua bool
		want scsi.Condition
	}{
		{gwActive, true, 0},
		{gwStandby, true, scsi.AccessChanged},
		{gwFenced, true, scsi.AccessChanged},
		{gwStandby, false, 0},
	} {
		var tbl srpNexusTable
		u := tbl.join("a", 1, 0).unit("vol", 0, 10, false, c.st, 0, c.alua)
		if got := u.pending(); got != c.want {
			t.Errorf("state %v, alua %v: pending %s, want %s", c.st, c.alua, got, c.want)
		}
	}
}

// TestSRPOpenSessions: an SRP session's LUNs are volumes it has open,
// for Target.OpenSessions (srpd refuses to shrink such a volume without
// --force): the channels of one I_T nexus count once, another nexus
// counts again, and a logout ends the count. An SRP session once
// counted for nothing, and a shrink went through under it unrefused.
func TestSRPOpenSessions(t *testing.T) {
	e := srpEnvs[0]
	r := newRig(t, e, Config{})
	a, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	multi := srpLoginReq(1)
	multi.Flags = srp.MultiChanMulti | srp.ImmediateRequested
	a2, err := r.srpDial(t, multi)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "one session of one nexus", func() bool { return r.tgt.OpenSessions("vol0") == 1 })
	b, err := r.srpDial(t, srpLoginReq(2))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two nexuses", func() bool { return r.tgt.OpenSessions("vol0") == 2 })
	b.logout()
	a2.logout()
	a.logout()
	waitFor(t, "none after the logouts", func() bool { return r.tgt.OpenSessions("vol0") == 0 })
}
