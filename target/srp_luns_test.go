package target

import (
	"bytes"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// reportLUNs sends REPORT LUNS on c and returns the LUNs it lists.
func (c *srpClient) reportLUNs(t *testing.T, what string) []uint16 {
	t.Helper()
	clear(c.data(0, 64))
	c.good(what, c.do(c.in(srpCmd(lunVol0, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0), 0, 64)), srp.DIUnder)
	var luns []uint16
	got := c.data(0, 64)
	for i := 8; i < 8+int(got[3]) && i+8 <= len(got); i += 8 {
		l, err := scsi.DecodeLUN([8]byte(got[i : i+8]))
		if err != nil {
			t.Fatal(err)
		}
		luns = append(luns, l)
	}
	return luns
}

// TestSRPLiveLUN: a volume created while a host is logged in becomes a
// LUN of its session without a new login, as LIO and SPDK add one
// (issue 25). The number is saved in the LUN map before the host hears
// of the change; REPORTED LUNS DATA HAS CHANGED comes only once both
// channels of the nexus have the new LUN, so REPORT LUNS on the other
// channel right after the unit attention lists it; the new unit has no
// unit attention of its own; it is read and written on either channel,
// and another nexus sees it too; after a restart the host finds it at
// the same number.
func TestSRPLiveLUN(t *testing.T) {
	e := srpEnvs[0]
	st := &memLUNs{}
	r := newRig(t, e, Config{LUNs: st})
	a, b, other := r.srpNexusTrio(t)
	tur := srpTUR
	if got := a.reportLUNs(t, "REPORT LUNS before the create"); !slices.Equal(got, []uint16{lunRO, lunVol0, lunVol1}) {
		t.Fatalf("REPORT LUNS before the create: %v", got)
	}
	const lunNew = 3
	r.createVolume(t, "new")
	r.tgt.CatalogChanged()

	// The host polls as Linux's next command would meet the unit
	// attention: TEST UNIT READY on LUN vol0 is GOOD until the change
	// is raised, then reports it once.
	waitFor(t, "REPORTED LUNS DATA HAS CHANGED", func() bool {
		rsp := tur(a, lunVol0)
		if rsp.Status == uint8(scsi.StatusGood) {
			return false
		}
		a.checkSense("first channel: TEST UNIT READY after the create", rsp, scsi.SenseLUNsChanged)
		return true
	})
	st.mu.Lock()
	saved, ok := st.m.LUNs["new"]
	st.mu.Unlock()
	if !ok || saved != lunNew {
		t.Fatalf("LUN map after the create: %v; want new at %d, saved before the unit attention", st.m.LUNs, lunNew)
	}
	if got := b.reportLUNs(t, "second channel: REPORT LUNS after the unit attention"); !slices.Equal(got, []uint16{lunRO, lunVol0, lunVol1, lunNew}) {
		t.Fatalf("second channel: REPORT LUNS after the unit attention: %v; want the new volume at %d", got, lunNew)
	}
	b.good("second channel: TEST UNIT READY on the new LUN", tur(b, lunNew), 0)
	copy(b.data(0, bs), pattern(bs, 0x5a))
	b.good("second channel: WRITE(10) to the new LUN", b.do(b.out(srpCmd(lunNew, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)
	clear(a.data(bs, bs))
	a.good("first channel: READ(10) of the new LUN", a.do(a.in(srpCmd(lunNew, rw10(0x28, 0, 1, false)...), bs, bs)), 0)
	if !bytes.Equal(a.data(bs, bs), pattern(bs, 0x5a)) {
		t.Fatal("the first channel read back something else than the second wrote")
	}
	waitFor(t, "the other nexus's table", func() bool { return len(other.reportLUNs(t, "another nexus: REPORT LUNS")) == 4 })
	other.checkSense("another nexus: TEST UNIT READY after the create", tur(other, lunVol1), scsi.SenseLUNsChanged)
	clear(other.data(0, bs))
	other.good("another nexus: READ(10) of the new LUN", other.do(other.in(srpCmd(lunNew, rw10(0x28, 0, 1, false)...), 0, bs)), 0)
	if !bytes.Equal(other.data(0, bs), pattern(bs, 0x5a)) {
		t.Fatal("another nexus read back something else")
	}
	for _, c := range []*srpClient{a, b, other} {
		c.logout()
	}

	// The target restarts on the same store and LUN map: a volume that
	// sorts first, created meanwhile, does not take the number.
	r.createVolume(t, "a")
	r2 := newRig(t, e, Config{LUNs: st, Catalog: r.cat})
	c, err := r2.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.reportLUNs(t, "REPORT LUNS after the restart"); !slices.Equal(got, []uint16{lunRO, lunVol0, lunVol1, lunNew, 4}) {
		t.Fatalf("REPORT LUNS after the restart: %v", got)
	}
	clear(c.data(0, bs))
	c.good("READ(10) of the new LUN after the restart", c.do(c.in(srpCmd(lunNew, rw10(0x28, 0, 1, false)...), 0, bs)), 0)
	if !bytes.Equal(c.data(0, bs), pattern(bs, 0x5a)) {
		t.Fatal("after the restart the LUN names another volume")
	}
	c.logout()
}

// createVolume creates a volume of the rig's size and block size in
// its store, as srpd's volume create does (the target is not told).
func (r *rig) createVolume(t *testing.T, name string) {
	t.Helper()
	v, err := r.store.Create(name, volSize, bs)
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
}

// gateCatalog is the rig's catalog with the second open of volume gated
// held until gate is closed (entered says it is held).
type gateCatalog struct {
	Catalog
	volume        string
	opens         atomic.Int32
	gate, entered chan struct{}
}

func (g *gateCatalog) OpenVolume(name string) (Volume, error) {
	if name == g.volume && g.opens.Add(1) == 2 {
		close(g.entered)
		<-g.gate
	}
	return g.Catalog.OpenVolume(name)
}

// TestSRPLiveLUNOrder: REPORTED LUNS DATA HAS CHANGED waits for the
// nexus's last channel to attach the new LUN. With one channel's open
// of the new volume held, neither channel reports the change (a host
// told on one could send REPORT LUNS on the other and miss the LUN);
// once it is let go, the change is reported and REPORT LUNS lists the
// LUN on both channels.
func TestSRPLiveLUNOrder(t *testing.T) {
	e := srpEnvs[0]
	g := &gateCatalog{volume: "new", gate: make(chan struct{}), entered: make(chan struct{})}
	r := newRig(t, e, Config{Catalog: g})
	g.Catalog = r.cat
	t.Cleanup(func() { // a failed check must not leave the open held
		select {
		case <-g.gate:
		default:
			close(g.gate)
		}
	})
	chans := r.srpChannels(t, 1, 2)
	tur := srpTUR
	for _, c := range chans {
		c.good("TEST UNIT READY before the create", tur(c, lunVol0), 0)
	}
	r.createVolume(t, "new")
	r.tgt.CatalogChanged()
	<-g.entered
	// The first channel attached the LUN or is about to; the other is
	// held in its open.
	for i, c := range chans {
		c.good(fmt.Sprintf("channel %d: TEST UNIT READY while a channel has no table", i), tur(c, lunVol0), 0)
	}
	close(g.gate)
	r.waitLUNTables(t)
	chans[1].checkSense("second channel: TEST UNIT READY once both have the LUN", tur(chans[1], lunVol0), scsi.SenseLUNsChanged)
	for i, c := range chans {
		if got := c.reportLUNs(t, "REPORT LUNS"); !slices.Equal(got, []uint16{lunRO, lunVol0, lunVol1, 3}) {
			t.Errorf("channel %d: REPORT LUNS after the unit attention: %v", i, got)
		}
		c.logout()
	}
}

// hideCatalog is the rig's catalog with the volume hidden (when set)
// left out of its list: a volume deleted under the session, which
// srpd's stores refuse while it is open.
type hideCatalog struct {
	Catalog
	hidden atomic.Pointer[string]
}

func (h *hideCatalog) List() ([]VolumeInfo, error) {
	l, err := h.Catalog.List()
	if p := h.hidden.Load(); p != nil {
		l = slices.DeleteFunc(l, func(v VolumeInfo) bool { return v.Name == *p })
	}
	return l, err
}

// TestSRPLiveLUNGone: a volume that leaves the catalog under a live
// session loses its LUN for the session: REPORT LUNS leaves it out, a
// command to it is LOGICAL UNIT NOT SUPPORTED, and its volume is closed
// (the store can delete it). A new volume of the same name is another
// volume: it gets a new number, and the old one names nothing until
// the next login.
func TestSRPLiveLUNGone(t *testing.T) {
	e := srpEnvs[0]
	h := &hideCatalog{}
	r := newRig(t, e, Config{Catalog: h})
	h.Catalog = r.cat
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	c.good("TEST UNIT READY", srpTUR(c, lunVol1), 0)
	gone := "vol1"
	h.hidden.Store(&gone)
	r.tgt.CatalogChanged()
	r.waitLUNTables(t)
	c.checkSense("TEST UNIT READY after the catalog change", srpTUR(c, lunVol0), scsi.SenseLUNsChanged)
	if got := c.reportLUNs(t, "REPORT LUNS after vol1 went"); !slices.Equal(got, []uint16{lunRO, lunVol0}) {
		t.Fatalf("REPORT LUNS after vol1 went: %v", got)
	}
	c.checkSense("TEST UNIT READY of vol1's LUN", srpTUR(c, lunVol1), scsi.SenseLUNotSupported)
	waitFor(t, "vol1's handle closed", func() bool { return r.store.Delete("vol1") == nil })
	r.createVolume(t, "vol1")
	h.hidden.Store(nil)
	r.tgt.CatalogChanged()
	r.waitLUNTables(t)
	if got := c.reportLUNs(t, "REPORT LUNS after a new vol1 came"); !slices.Equal(got, []uint16{lunRO, lunVol0, 3}) {
		t.Fatalf("REPORT LUNS after a new vol1 came: %v; want it at a new number", got)
	}
	c.checkSense("TEST UNIT READY of the old vol1's LUN", srpTUR(c, lunVol1), scsi.SenseLUNotSupported)
	c.good("TEST UNIT READY of the new vol1", srpTUR(c, 3), 0)
	c.logout()
}
