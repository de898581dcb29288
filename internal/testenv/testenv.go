// Package testenv reads the settings of the project's long tests from the
// environment: soak lengths (GOSRP_*_SOAK and the like) and replay seeds.
// A setting that is present but malformed fails the test at once, so a
// typo never turns a long soak silently into the short one. It also
// finds the micro Ceph cluster's OSD (test/ceph/cluster.sh) for the tests
// that stop, kill and restart it.
//
//	n := testenv.Int(t, "GOSRP_HOSTILE_SOAK", 1500, 1)
//	seed := testenv.Seed(t, "GOSRP_HOSTILE_SEED")
package testenv

import (
	"math"
	"os"
	"strconv"
	"testing"
	"time"
)

// Int returns the integer in the environment variable name (decimal, or
// 0x-prefixed hex), or def when it is unset or empty. A value that does
// not parse or is below min fails the test.
func Int(tb testing.TB, name string, def, min int64) int64 {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil || n < min {
		if min == math.MinInt64 {
			tb.Fatalf("%s=%q: want an integer", name, v)
		}
		tb.Fatalf("%s=%q: want an integer of at least %d", name, v, min)
	}
	return n
}

// Seed returns the seed in the environment variable name, to replay a
// run, or a fresh one from the clock, and logs which with the line that
// replays it. Seeds are positive, so that every consumer can take them.
func Seed(tb testing.TB, name string) int64 {
	tb.Helper()
	seed := Int(tb, name, time.Now().UnixNano()&math.MaxInt32|1, math.MinInt64)
	tb.Logf("seed %d (replay with %s=%d)", seed, name, seed)
	return seed
}
