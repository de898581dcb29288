package target

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

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
		byLUN, left, _ := m.assign(strings.Fields(step.catalog), step.limit)
		got := make([]string, len(byLUN))
		for j, n := range byLUN {
			got[j] = cmp(n, "-")
		}
		if g := strings.Join(got, " "); g != step.want || strings.Join(left, " ") != step.left {
			t.Fatalf("step %d (%s): LUNs %q, left out %q; want %q, %q", i, step.catalog, g, left, step.want, step.left)
		}
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

// TestSRPStableLUNs: a host's LUN keeps naming its volume after a volume
// that sorts before it is created and the host logs in again (ib_srp
// reconnecting after a link flap or a target restart): before the LUN
// map, LUN n was the n-th volume in name order, and the host's writes
// for vol0 would have gone into the new volume.
func TestSRPStableLUNs(t *testing.T) {
	e := srpEnvs[0]
	st := &memLUNs{}
	r := newRig(t, e, Config{LUNs: st})
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	copy(c.data(0, bs), pattern(bs, 0x61))
	c.good("WRITE(10) to vol0's LUN", c.do(c.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)
	c.logout()
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
