package clock

import (
	"testing"
	"time"
)

func TestNanosMonotonic(t *testing.T) {
	a := Nanos()
	time.Sleep(time.Millisecond)
	b := Nanos()
	if b-a < int64(time.Millisecond) {
		t.Fatalf("Nanos advanced %d ns over a 1 ms sleep", b-a)
	}
}

func BenchmarkNanos(b *testing.B) {
	for b.Loop() {
		Nanos()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		time.Now()
	}
}
