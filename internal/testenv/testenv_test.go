package testenv

import (
	"math"
	"testing"
)

// fakeTB records a Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }
func (f *fakeTB) Logf(string, ...any)   {}

func TestInt(t *testing.T) {
	for _, tc := range []struct {
		val      string
		min      int64
		want     int64
		wantFail bool
	}{
		{"", 1, 7, false},
		{"12", 1, 12, false},
		{"0x10", 0, 16, false},
		{"0", 1, 0, true},
		{"-3", math.MinInt64, -3, false},
		{"12k", 0, 0, true},
	} {
		t.Setenv("GOSRP_TESTENV_X", tc.val)
		f := &fakeTB{TB: t}
		got := Int(f, "GOSRP_TESTENV_X", 7, tc.min)
		if f.failed != tc.wantFail || (!tc.wantFail && got != tc.want) {
			t.Errorf("%q (min %d): %d, failed %v; want %d, failed %v", tc.val, tc.min, got, f.failed, tc.want, tc.wantFail)
		}
	}
}

func TestSeed(t *testing.T) {
	t.Setenv("GOSRP_TESTENV_SEED", "42")
	if s := Seed(t, "GOSRP_TESTENV_SEED"); s != 42 {
		t.Fatalf("seed %d, want 42", s)
	}
	t.Setenv("GOSRP_TESTENV_SEED", "")
	if s := Seed(t, "GOSRP_TESTENV_SEED"); s <= 0 {
		t.Fatalf("fresh seed %d, want positive", s)
	}
}
