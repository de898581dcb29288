package target

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// runsVolume is a Volume whose Allocated reports fixed runs and end.
type runsVolume struct {
	sliceVolume
	runs [][2]int64
	end  int64 // returned; -1: off+n
	err  error
}

func (v *runsVolume) Allocated(off, n int64, yield func(off, n int64) bool) (int64, error) {
	for _, r := range v.runs {
		if !yield(r[0], r[1]) {
			return r[0] + r[1], v.err
		}
	}
	if v.end < 0 {
		return off + n, v.err
	}
	return v.end, v.err
}

// TestVolumeExtents: how a worker turns a volume's runs into an answer:
// holes between and after runs, adjacent runs merged, at most the limit
// (a prefix, never a hole over data), and a volume's bad runs refused.
func TestVolumeExtents(t *testing.T) {
	const off, n = 1000, 10000
	hz := wire.ExtentHole | wire.ExtentZero
	ext := func(l uint64, f uint32) wire.Extent { return wire.Extent{Length: l, Flags: f} }
	cases := []struct {
		name  string
		vol   Volume
		limit int
		want  []wire.Extent
		err   string
	}{
		{"no Allocator: all allocated", &sliceVolume{}, 8, []wire.Extent{ext(n, 0)}, ""},
		{"no runs: one hole", &runsVolume{end: -1}, 8, []wire.Extent{ext(n, hz)}, ""},
		{"runs and holes", &runsVolume{runs: [][2]int64{{off, 100}, {2000, 500}, {2500, 500}, {5000, 10}}, end: -1}, 8,
			[]wire.Extent{ext(100, 0), ext(900, hz), ext(1000, 0), ext(2000, hz), ext(10, 0), ext(off+n-5010, hz)}, ""},
		{"a prefix described", &runsVolume{runs: [][2]int64{{2000, 500}}, end: 4000}, 8,
			[]wire.Extent{ext(1000, hz), ext(500, 0), ext(1500, hz)}, ""},
		{"nothing described", &runsVolume{end: off}, 8, []wire.Extent{ext(n, 0)}, ""},
		{"the limit: a prefix", &runsVolume{runs: [][2]int64{{off, 10}, {2000, 10}, {3000, 10}}, end: -1}, 3,
			[]wire.Extent{ext(10, 0), ext(990, hz), ext(10, 0)}, ""},
		{"the limit on a hole", &runsVolume{runs: [][2]int64{{off, 10}, {2000, 10}, {3000, 10}}, end: -1}, 2,
			[]wire.Extent{ext(10, 0), ext(990, hz)}, ""},
		{"out of order", &runsVolume{runs: [][2]int64{{3000, 10}, {2000, 10}}, end: -1}, 8, nil, "run of 10 bytes at 2000"},
		{"before the range", &runsVolume{runs: [][2]int64{{0, 10}}, end: -1}, 8, nil, "run of 10 bytes at 0"},
		{"beyond the range", &runsVolume{runs: [][2]int64{{off + n - 5, 10}}, end: -1}, 8, nil, "run of 10 bytes"},
		{"empty run", &runsVolume{runs: [][2]int64{{2000, 0}}, end: -1}, 8, nil, "run of 0 bytes"},
		{"volume error", &runsVolume{err: errors.New("disk gone"), end: -1}, 8, nil, "disk gone"},
	}
	for _, c := range cases {
		ov := &openVol{vol: c.vol}
		ov.inflight.Add(1)
		got, err := volumeExtents(ov, off, n, c.limit)
		ov.inflight.Wait() // the job ended the count
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}
