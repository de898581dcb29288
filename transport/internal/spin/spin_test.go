package spin

import "testing"

// TestBudget: twice the average wait, within the bounds; the lower bound
// once waits outlast the upper one.
func TestBudget(t *testing.T) {
	for _, tc := range []struct{ avg, want int64 }{
		{0, 2}, {1, 2}, {5, 10}, {25, 50}, {40, 50}, {50, 50}, {51, 2}, {1e9, 2},
	} {
		if got := Budget(tc.avg, 2, 50); got != tc.want {
			t.Errorf("Budget(%d, 2, 50) = %d, want %d", tc.avg, got, tc.want)
		}
	}
}

// TestAverage: an idle spell lifts the average past any budget's upper
// bound at once, and short waits bring it back down within a few dozen.
func TestAverage(t *testing.T) {
	var a Average
	a.Observe(1_000_000_000) // a second idle
	if a.Nanos() < 100_000_000 {
		t.Fatalf("after a 1 s wait: %d ns", a.Nanos())
	}
	n := 0
	for a.Nanos() > 2_000_000 {
		a.Observe(500_000)
		n++
	}
	if n < 10 || n > 40 {
		t.Fatalf("%d waits of 500 µs to come below 2 ms after a 1 s wait", n)
	}
	for range 100 {
		a.Observe(500_000)
	}
	if got := a.Nanos(); got < 500_000 || got > 520_000 {
		t.Fatalf("after steady 500 µs waits: %d ns", got)
	}
}
