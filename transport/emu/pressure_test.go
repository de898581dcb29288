package emu

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestParsePressure(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"some avg10=0.74 avg60=6.68 avg300=9.72 total=103447872\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 103447872, true},
		{"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, true},
		{"some total=5", 5, true},
		{"full avg10=0.00 avg60=0.00 avg300=0.00 total=7\nsome avg10=0.00 total=9\n", 0, false}, // "some" must come first
		{"some avg10=0.74 avg60=6.68 avg300=9.72\nfull total=3\n", 0, false},                    // total on another line
		{"some avg10=0.74 total=\n", 0, false},
		{"some avg10=0.74 total=x1\n", 0, false},
		{"some total=99999999999999999999\n", 0, false}, // overflows int64
		{"", 0, false},
		{"some", 0, false},
	}
	for _, tc := range tests {
		got, ok := parsePressure([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parsePressure(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestPressureGauge drives a gauge over a file standing in for
// /proc/pressure/cpu: the CPUs count as oversubscribed when the stall
// total grew by at least pressureShare of the wall time since the last
// sample, and a sample is renewed no more often than pressureEvery.
func TestPressureGauge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu")
	set := func(total int64) {
		s := fmt.Sprintf("some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", total)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set(1000)
	g := newPressureGauge(path)
	const ms = 1_000_000 // ns
	steps := []struct {
		now   int64 // ns
		total int64 // µs
		want  bool
	}{
		{10 * ms, 1000, false},  // first sample: no rate yet
		{20 * ms, 1100, false},  // 100 µs of 10 ms: 1%
		{30 * ms, 3100, true},   // 2 ms of 10 ms: 20%
		{31 * ms, 3100, true},   // within pressureEvery: the last verdict
		{40 * ms, 3100, false},  // nothing stalled in 10 ms
		{140 * ms, 13100, true}, // exactly pressureShare
		{240 * ms, 23099, false},
	}
	for i, s := range steps {
		set(s.total)
		if got := g.oversubscribed(s.now); got != s.want {
			t.Fatalf("step %d (%d ms, total %d µs): oversubscribed %v, want %v", i, s.now/ms, s.total, got, s.want)
		}
	}

	if g := newPressureGauge(filepath.Join(t.TempDir(), "missing")); !g.oversubscribed(1) {
		t.Fatal("without PSI every long gap must count as contention")
	}
	if err := os.WriteFile(path, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if g := newPressureGauge(path); !g.oversubscribed(1) || g.fd >= 0 {
		t.Fatal("a file that does not parse was taken for PSI")
	}
}

func newPressureGauge(path string) *pressureGauge {
	return &pressureGauge{path: path, fd: -1}
}

func FuzzParsePressure(f *testing.F) {
	f.Add([]byte("some avg10=0.74 avg60=6.68 avg300=9.72 total=103447872\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	f.Add([]byte("some total=\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := parsePressure(b)
		if !ok {
			return
		}
		if v < 0 {
			t.Fatalf("negative total %d from %q", v, b)
		}
		if w, ok := parsePressure(fmt.Appendf(nil, "some total=%d\n", v)); !ok || w != v {
			t.Fatalf("total %d does not read back: %d, %v", v, w, ok)
		}
	})
}
