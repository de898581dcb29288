package target

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// TestLUNMapAssign: a volume keeps its number through creates, snapshots
// and deletes of other volumes; a catalog seen for the first time is
// numbered in name order (as srpd numbered every catalog before the map,
// so an upgrade renumbers nothing); a deleted volume's number goes to a
// new volume only when every number below the limit was handed out once,
// the oldest retired first; a volume that finds no number is left out.
func TestLUNMapAssign(t *testing.T) {
	var m LUNMap
	for i, step := range []struct {
		catalog string // volume names, space-separated
		limit   int
		want    string // names by LUN, "-" for none
		left    string
	}{
		{"vol1 vol0 ro", 7, "ro vol0 vol1", ""},
		{"vol1 vol0 ro a", 7, "ro vol0 vol1 a", ""},                            // "a" sorts first, numbered last
		{"vol1 vol0 ro a vol0@snap", 7, "ro vol0 vol1 a vol0@snap", ""},        // a snapshot renumbers nothing
		{"vol1 ro a vol0@snap", 7, "ro - vol1 a vol0@snap", ""},                // vol0 deleted: its number is retired
		{"vol1 ro a vol0@snap vol0", 7, "ro - vol1 a vol0@snap vol0", ""},      // re-created: a fresh number, not vol0's old one
		{"vol1 ro a vol0@snap vol0 b c", 6, "ro b vol1 a vol0@snap vol0", "c"}, // limit 6 reached: b gets the retired 1; c none
	} {
		byLUN, left, _ := m.assign(catalog(step.catalog), step.limit)
		got := make([]string, len(byLUN))
		for j, n := range byLUN {
			got[j] = cmp(n, "-")
		}
		if g := strings.Join(got, " "); g != step.want || strings.Join(left, " ") != step.left {
			t.Fatalf("step %d (%s): LUNs %q, left out %q; want %q, %q", i, step.catalog, g, left, step.want, step.left)
		}
	}
}

// catalog is a catalog's volumes from a space-separated list of names,
// each NAME or NAME=IDENTITY.
func catalog(list string) []VolumeInfo {
	var vols []VolumeInfo
	for _, f := range strings.Fields(list) {
		name, id, _ := strings.Cut(f, "=")
		v := VolumeInfo{Name: name}
		if id != "" {
			n, err := strconv.ParseUint(id, 10, 64)
			if err != nil {
				panic(err)
			}
			v.Identity = n
		}
		vols = append(vols, v)
	}
	return vols
}

// TestLUNMapReplaced: a volume whose identity is not the one its number
// was given to is another volume created under the same name while the
// target did not look (srpd SIGKILLed between a delete and the map's
// save, and the name created again after the restart; or another
// gateway of the shared store replacing it): it gets a new number and
// the old one is retired, as for a delete the target saw, so that the
// host's disk on the old number fails its I/O rather than write into
// the new volume. A volume whose identity the catalog does not give
// keeps its number; a map saved before identities were recorded learns
// them without renumbering; a replaced volume at the limit takes the
// oldest retired number, as any new volume does.
func TestLUNMapReplaced(t *testing.T) {
	var m LUNMap
	for i, step := range []struct {
		catalog string
		limit   int
		want    string
		changed bool
	}{
		{"vol0=1 vol1=1 old", 3, "old vol0 vol1", true},
		{"vol1=1 vol0=1 old", 3, "old vol0 vol1", false},
		{"vol0=1 vol1=1 old=7", 3, "old vol0 vol1", true},   // learned, not renumbered
		{"vol0=1 vol1=2 old=7", 4, "old vol0 - vol1", true}, // vol1 replaced: LUN 2 retired, a fresh number
		{"vol0 vol1=2 old=7", 4, "old vol0 - vol1", false},  // vol0's identity unknown: kept
		{"vol0=1 vol1=2 old=7", 4, "old vol0 - vol1", false},
		{"vol0=3 vol1=2 old=7", 4, "old - vol0 vol1", true}, // vol0 replaced at the limit: the oldest retired number, 2; its 1 retired
	} {
		byLUN, _, changed := m.assign(catalog(step.catalog), step.limit)
		got := make([]string, len(byLUN))
		for j, n := range byLUN {
			got[j] = cmp(n, "-")
		}
		if g := strings.Join(got, " "); g != step.want || changed != step.changed {
			t.Fatalf("step %d (%s): LUNs %q, changed %t; want %q, %t", i, step.catalog, g, changed, step.want, step.changed)
		}
	}
	if err := m.check(4); err != nil {
		t.Fatalf("the map after the steps: %v", err)
	}
}

func cmp(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

// memLUNs is a LUNStore in memory; fail makes SaveLUNs fail.
type memLUNs struct {
	mu    sync.Mutex
	m     LUNMap
	saves int
	fail  bool
}

func (s *memLUNs) LoadLUNs() (LUNMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.clone(), nil
}

func (s *memLUNs) SaveLUNs(m LUNMap) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("disk full")
	}
	s.m, s.saves = m.clone(), s.saves+1
	return nil
}

// TestLUNTableSaved: a new number is saved before a login may use it, a
// login that changes nothing saves nothing, a failed save refuses the
// numbering and leaves the map as it was, and a target loading the saved
// map numbers as the one before it did.
func TestLUNTableSaved(t *testing.T) {
	vols := func(names ...string) []VolumeInfo {
		l := make([]VolumeInfo, len(names))
		for i, n := range names {
			l[i] = VolumeInfo{Name: n}
		}
		return l
	}
	st := &memLUNs{}
	var a lunTable
	if err := a.load(st); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.names(vols("b", "c")); err != nil || st.saves != 1 {
		t.Fatalf("first numbering: %v, %d saves; want saved once", err, st.saves)
	}
	if _, _, err := a.names(vols("c", "b")); err != nil || st.saves != 1 {
		t.Fatalf("same catalog: %v, %d saves; want no save", err, st.saves)
	}
	st.fail = true
	if _, _, err := a.names(vols("a", "b", "c")); err == nil {
		t.Fatal("a numbering that could not be saved was used")
	}
	st.fail = false
	var b lunTable
	if err := b.load(st); err != nil {
		t.Fatal(err)
	}
	byLUN, _, err := b.names(vols("a", "b", "c"))
	if err != nil || !slices.Equal(byLUN, []string{"b", "c", "a"}) {
		t.Fatalf("after a restart: %q, %v; want b c a (the saved numbers kept, a new)", byLUN, err)
	}
	byLUN, _, _ = a.names(vols("a", "b", "c"))
	if !slices.Equal(byLUN, []string{"b", "c", "a"}) {
		t.Fatalf("after the failed save: %q; want the map unchanged by it, then a numbered", byLUN)
	}
}

// TestLUNMapCheck: a loaded map that could put two volumes on one LUN,
// hide a volume past the limit or hand a live number out again is
// refused before the target serves anything.
func TestLUNMapCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    LUNMap
		ok   bool
	}{
		{"empty", LUNMap{}, true},
		{"saved", LUNMap{LUNs: map[string]uint16{"a": 0, "c": 2}, Next: 3, Retired: []uint16{1}}, true},
		{"two volumes on one LUN", LUNMap{LUNs: map[string]uint16{"a": 1, "b": 1}, Next: 2}, false},
		{"a LUN past Next", LUNMap{LUNs: map[string]uint16{"a": 5}, Next: 2}, false},
		{"a LUN past the limit", LUNMap{LUNs: map[string]uint16{"a": 300}, Next: 301}, false},
		{"a retired LUN in use", LUNMap{LUNs: map[string]uint16{"a": 0}, Next: 1, Retired: []uint16{0}}, false},
		{"retired twice", LUNMap{LUNs: map[string]uint16{}, Next: 2, Retired: []uint16{1, 1}}, false},
		{"retired never handed out", LUNMap{LUNs: map[string]uint16{}, Next: 1, Retired: []uint16{4}}, false},
	} {
		st := &memLUNs{m: tc.m}
		var tb lunTable
		if err := tb.load(st); (err == nil) != tc.ok {
			t.Errorf("%s: load: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// writeVol0 logs in to r, writes a block of 0x61 at vol0's LUN and logs
// out.
func writeVol0(t *testing.T, r *rig) {
	t.Helper()
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	copy(c.data(0, bs), pattern(bs, 0x61))
	c.good("WRITE(10) to vol0's LUN", c.do(c.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)
	c.logout()
}

// TestSRPStableLUNs: a host's LUN keeps naming its volume after a volume
// that sorts before it is created and the host logs in again (ib_srp
// reconnecting after a link flap or a target restart): before the LUN
// map, LUN n was the n-th volume in name order, and the host's writes
// for vol0 would have gone into the new volume.
func TestSRPStableLUNs(t *testing.T) {
	e := srpEnvs[0]
	st := &memLUNs{}
	r := newRig(t, e, Config{LUNs: st})
	writeVol0(t, r)
	for _, n := range []string{"a", "aa"} {
		r.createVolume(t, n)
	}
	// The target restarts on the same store and LUN map.
	r2 := newRig(t, e, Config{LUNs: st, Catalog: r.cat})
	c2, err := r2.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	clear(c2.data(bs, bs))
	c2.good("READ(10) of the same LUN after the catalog grew", c2.do(c2.in(srpCmd(lunVol0, rw10(0x28, 0, 1, false)...), bs, bs)), 0)
	if !bytes.Equal(c2.data(bs, bs), pattern(bs, 0x61)) {
		t.Fatal("the LUN names another volume after a volume sorting before it was created")
	}
	clear(c2.data(0, 64))
	c2.good("REPORT LUNS", c2.do(c2.in(srpCmd(lunVol0, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0), 0, 56)), srp.DIUnder)
	var luns []uint16
	got := c2.data(0, 56)
	for i := 8; i < 8+int(got[3]); i += 8 {
		l, err := scsi.DecodeLUN([8]byte(got[i : i+8]))
		if err != nil {
			t.Fatal(err)
		}
		luns = append(luns, l)
	}
	if !slices.Equal(luns, []uint16{lunRO, lunVol0, lunVol1, 3, 4}) {
		t.Fatalf("REPORT LUNS: %v; want the old three, then a and aa", luns)
	}
	c2.logout()
}

// identified is a catalog whose volumes have the identities ids gives
// (VolumeInfo.Identity), as a pebble, file or RBD store's do.
type identified struct {
	Catalog
	ids map[string]uint64
}

func (c *identified) List() ([]VolumeInfo, error) {
	l, err := c.Catalog.List()
	for i := range l {
		l[i].Identity = c.ids[l[i].Name]
	}
	return l, err
}

// TestSRPReplacedLUN: vol0 is deleted and created again under its name
// while the target does not look (srpd SIGKILLed before it saved the
// delete into its LUN map, or another gateway replacing the image), and
// the target restarts on the same map. A host that logs in again, as
// ib_srp does after the restart, addresses vol0's old LUN with its old
// disk's I/O: that LUN must be no unit now (LOGICAL UNIT NOT
// SUPPORTED), its WRITE refused, and the new vol0 listed under a new
// LUN. Before, the old LUN named the new volume, and the host's disk
// read its zeros and wrote into it as if it were the volume it had
// written before; Linux's sd never checks the unit's identity again.
func TestSRPReplacedLUN(t *testing.T) {
	e := srpEnvs[0]
	st := &memLUNs{}
	ic := &identified{ids: map[string]uint64{"vol0": 1, "vol1": 1, "ro": 1}}
	r := newRig(t, e, Config{LUNs: st, Catalog: ic})
	ic.Catalog = r.cat
	writeVol0(t, r)
	// The logout's handles close after it is answered.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := r.store.Delete("vol0")
		if err == nil {
			break
		}
		if !errors.Is(err, block.ErrBusy) || time.Now().After(end) {
			t.Fatal(err)
		}
	}
	r.createVolume(t, "vol0")
	ic.ids["vol0"] = 2

	r2 := newRig(t, e, Config{LUNs: st, Catalog: ic})
	c2, err := r2.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	c2.checkSense("READ(10) of the replaced volume's old LUN", c2.do(c2.in(srpCmd(lunVol0, rw10(0x28, 0, 1, false)...), bs, bs)), scsi.SenseLUNotSupported)
	c2.checkSense("WRITE(10) to the replaced volume's old LUN", c2.do(c2.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), scsi.SenseLUNotSupported)
	if luns := c2.reportLUNs(t, "REPORT LUNS after the restart"); !slices.Equal(luns, []uint16{lunRO, lunVol1, 3}) {
		t.Fatalf("REPORT LUNS: %v; want ro and vol1 as before and the new vol0 under a new number, 3", luns)
	}
	if got := st.m.LUNs["vol0"]; got != 3 || !slices.Contains(st.m.Retired, lunVol0) {
		t.Fatalf("saved map: vol0 at %d, retired %v; want 3 and %d retired", got, st.m.Retired, lunVol0)
	}
	c2.logout()
}
