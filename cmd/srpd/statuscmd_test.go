package main

import "testing"

// TestLatencyBound: srpd status printed a volume's p99 as the histogram
// bucket's bound in microseconds, "1048576µs" for an I/O past one
// second.
func TestLatencyBound(t *testing.T) {
	for _, tc := range []struct {
		us   uint64
		want string
	}{
		{0, "-"},
		{1, "≤1µs"},
		{512, "≤512µs"},
		{1024, "≤1.02ms"},
		{16384, "≤16.4ms"},
		{524288, "≤524ms"},
		{1048576, "≤1.05s"},
		{1 << 26, "≤67.1s"},
	} {
		if got := latencyBound(tc.us); got != tc.want {
			t.Errorf("latencyBound(%d) = %q, want %q", tc.us, got, tc.want)
		}
	}
}
