package target

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/scsi"
)

// TestSRPHungOpen: the store hangs in the open of one volume (vol1). An
// SRP login completes all the same once OpenWait has passed, its
// other LUNs serving I/O and vol1's LUN left out of REPORT LUNS and
// becoming ready: its commands are answered NOT READY 04h/01h, which a
// host retries (a LUN that never had a volume is still LOGICAL UNIT NOT
// SUPPORTED, which it does not). A catalog change then adds three
// volumes, two of which hang too: the other becomes a LUN, announced by
// REPORTED LUNS DATA HAS CHANGED, without waiting for them. Once the
// store answers, one hung volume and vol1 become LUNs of the session,
// announced by another unit attention, each opened once: the refreshes
// meanwhile did not open them again. The store fails the other's open:
// its LUN is then not supported. Before, the login never finished (its
// connection opened the volumes one by one before its loop started), a
// hung open held back every other new LUN of the change, and a LUN
// still opening was answered as if it would never be there.
func TestSRPHungOpen(t *testing.T) {
	e := srpEnvs[0]
	r := newRig(t, e, Config{OpenWait: time.Second})
	gate := make(chan struct{})
	var mu sync.Mutex
	opens := map[string]int{}
	r.cat.opening = func(name string) {
		mu.Lock()
		opens[name]++
		mu.Unlock()
		if name == "vol1" || name == "slow" || name == "tardy" {
			<-gate
		}
	}
	r.cat.openErr = func(name string) error {
		if name == "tardy" {
			return errors.New("the store lost it")
		}
		return nil
	}
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the rig's shutdown (cleanups run last first)

	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.reportLUNs(t, "REPORT LUNS with vol1 hung"); !slices.Equal(got, []uint16{lunRO, lunVol0}) {
		t.Fatalf("REPORT LUNS with vol1's open hung: %v, want ro and vol0", got)
	}
	c.checkSense("TEST UNIT READY on vol1's LUN while its open hangs", srpTUR(c, lunVol1), scsi.SenseBecomingReady)
	c.checkSense("READ(10) of vol1's LUN while its open hangs", c.do(c.in(srpCmd(lunVol1, rw10(0x28, 0, 1, false)...), 0, bs)), scsi.SenseBecomingReady)
	c.checkSense("INQUIRY VPD 0x83 of vol1's LUN while its open hangs", c.do(c.in(srpCmd(lunVol1, 0x12, 1, 0x83, 0, 255, 0), 0, 255)), scsi.SenseBecomingReady)
	c.good("INQUIRY of vol1's LUN while its open hangs", c.do(c.in(srpCmd(lunVol1, 0x12, 0, 0, 0, 36, 0), 0, 36)), 0)
	if q := c.data(0, 1)[0]; q != 0x20 {
		t.Fatalf("INQUIRY of a LUN becoming ready: byte 0 %#02x, want 0x20 (qualifier 001b, direct access)", q)
	}
	c.checkSense("TEST UNIT READY on a LUN never used", srpTUR(c, 9), scsi.SenseLUNotSupported)
	copy(c.data(0, bs), pattern(bs, 0x11))
	c.good("WRITE(10) to vol0 while vol1's open hangs", c.do(c.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)

	const lunNew, lunSlow, lunTardy = 3, 4, 5
	r.createVolume(t, "new")
	r.createVolume(t, "slow")
	r.createVolume(t, "tardy")
	r.tgt.CatalogChanged()
	c.waitLUNs(t, "the change, slow and tardy hung", []uint16{lunRO, lunVol0, lunNew})
	c.checkSense("TEST UNIT READY on a new LUN whose open hangs", srpTUR(c, lunSlow), scsi.SenseBecomingReady)

	release()
	c.waitLUNs(t, "the hung opens returned", []uint16{lunRO, lunVol0, lunVol1, lunNew, lunSlow})
	waitFor(t, "the LUN whose open failed is not supported", func() bool {
		rsp := srpTUR(c, lunTardy)
		if rsp.Status != uint8(scsi.StatusGood) && len(rsp.Sense) > 0 {
			if s, err := scsi.ParseSense(rsp.Sense); err == nil && s == scsi.SenseBecomingReady {
				return false
			}
		}
		c.checkSense("TEST UNIT READY on the LUN whose open failed", rsp, scsi.SenseLUNotSupported)
		return true
	})
	for i, lun := range []uint16{lunVol1, lunSlow} {
		// Each late open announced itself: the second announcement may
		// still be pending on a unit the first attached.
		c.clearUA(t, lun)
		p := pattern(bs, byte(0x21+i))
		copy(c.data(0, bs), p)
		c.good("WRITE(10) to a LUN opened late", c.do(c.out(srpCmd(lun, rw10(0x2A, 1, 1, false)...), 0, bs)), 0)
		clear(c.data(bs, bs))
		c.good("READ(10) of a LUN opened late", c.do(c.in(srpCmd(lun, rw10(0x28, 1, 1, false)...), bs, bs)), 0)
		if !bytes.Equal(c.data(bs, bs), p) {
			t.Fatalf("LUN %d read back something else", lun)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if opens["vol1"] != 1 || opens["slow"] != 1 {
		t.Errorf("opens: %v; want vol1 and slow opened once each (a refresh reopened a volume whose open still ran)", opens)
	}
	c.logout()
}

// waitLUNs waits until a TEST UNIT READY on vol0 reports REPORTED LUNS
// DATA HAS CHANGED and REPORT LUNS lists want afterwards; a unit
// attention followed by another list is waited past (a change may be
// announced in two steps).
func (c *srpClient) waitLUNs(t *testing.T, what string, want []uint16) {
	t.Helper()
	var got []uint16
	waitFor(t, fmt.Sprintf("%s: REPORT LUNS %v", what, want), func() bool {
		rsp := srpTUR(c, lunVol0)
		if rsp.Status == uint8(scsi.StatusGood) {
			return false
		}
		c.checkSense(what+": TEST UNIT READY", rsp, scsi.SenseLUNsChanged)
		got = c.reportLUNs(t, what+": REPORT LUNS")
		return slices.Equal(got, want)
	})
}

// clearUA sends TEST UNIT READY to lun until it is GOOD, taking the
// REPORTED LUNS DATA HAS CHANGED it may report first.
func (c *srpClient) clearUA(t *testing.T, lun uint16) {
	t.Helper()
	waitFor(t, fmt.Sprintf("LUN %d ready", lun), func() bool {
		rsp := srpTUR(c, lun)
		if rsp.Status == uint8(scsi.StatusGood) {
			return true
		}
		c.checkSense(fmt.Sprintf("TEST UNIT READY on LUN %d", lun), rsp, scsi.SenseLUNsChanged)
		return false
	})
}
