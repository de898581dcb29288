package main

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refPercentile is the nearest-rank percentile of sorted values.
func refPercentile(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	rank = max(rank, 1)
	return sorted[rank-1]
}

func TestHistogramPercentiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gen := func(n int, f func() int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = f()
		}
		return out
	}
	tests := []struct {
		name string
		vals []int64
	}{
		{"single", []int64{12345}},
		{"exact range", gen(1000, func() int64 { return rng.Int64N(256) })},
		{"constant", gen(500, func() int64 { return 40000 })},
		{"uniform 10us-1ms", gen(20000, func() int64 { return 10000 + rng.Int64N(990000) })},
		{"exponential mean 50us", gen(20000, func() int64 { return int64(rng.ExpFloat64() * 50000) })},
		{"bimodal with tail", gen(20000, func() int64 {
			switch x := rng.IntN(1000); {
			case x == 0:
				return 5e9 + rng.Int64N(1e9) // 5 s outliers
			case x < 700:
				return 20000 + rng.Int64N(2000)
			default:
				return 300000 + rng.Int64N(50000)
			}
		})},
		{"huge values clamp", []int64{1, 2, 1 << 50}},
	}
	qs := []float64{0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h Histogram
			for _, v := range tc.vals {
				h.Record(v)
			}
			sorted := append([]int64(nil), tc.vals...)
			sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
			for i := range sorted {
				sorted[i] = min(sorted[i], histMaxValue)
			}
			if h.Count() != uint64(len(sorted)) || h.Min() != sorted[0] || h.Max() != sorted[len(sorted)-1] {
				t.Fatalf("count/min/max = %d/%d/%d, want %d/%d/%d", h.Count(), h.Min(), h.Max(), len(sorted), sorted[0], sorted[len(sorted)-1])
			}
			for _, q := range qs {
				got, want := h.Percentile(q), refPercentile(sorted, q)
				// The histogram reports the top of the bucket holding the
				// rank: never below the true value, at most 1/128 above it.
				tol := want/(1<<histSubBits) + 1
				if want < histSubCount {
					tol = 0
				}
				if got < want || got-want > tol {
					t.Errorf("p%v = %d, reference %d (tolerance %d)", q, got, want, tol)
				}
			}
			var mean float64
			for _, v := range sorted {
				mean += float64(v)
			}
			mean /= float64(len(sorted))
			if math.Abs(h.Mean()-mean) > 1e-6*mean+1e-9 {
				t.Errorf("mean %v, want %v", h.Mean(), mean)
			}
		})
	}
}

func TestHistogramMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var a, b, all Histogram
	for i := 0; i < 10000; i++ {
		v := int64(rng.ExpFloat64() * 1e5)
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&Histogram{})
	if m.Count() != all.Count() || m.Min() != all.Min() || m.Max() != all.Max() {
		t.Fatalf("merged count/min/max %d/%d/%d, want %d/%d/%d", m.Count(), m.Min(), m.Max(), all.Count(), all.Min(), all.Max())
	}
	for _, q := range []float64{1, 50, 90, 99, 99.9, 100} {
		if m.Percentile(q) != all.Percentile(q) {
			t.Errorf("p%v merged %d, direct %d", q, m.Percentile(q), all.Percentile(q))
		}
	}
	m.Reset()
	if m.Count() != 0 || m.Percentile(50) != 0 {
		t.Fatal("Reset left values")
	}
}

func TestHistogramIndexRoundTrip(t *testing.T) {
	prevHi := int64(-1)
	for i := 0; i < histBuckets; i++ {
		lo, hi := histRange(i)
		if lo != prevHi+1 || hi < lo {
			t.Fatalf("bucket %d = [%d, %d], previous ended at %d", i, lo, hi, prevHi)
		}
		if histIndex(lo) != i || histIndex(hi) != i {
			t.Fatalf("bucket %d [%d, %d]: index(lo)=%d index(hi)=%d", i, lo, hi, histIndex(lo), histIndex(hi))
		}
		prevHi = hi
	}
	if prevHi != histMaxValue {
		t.Fatalf("last bucket ends at %d, want %d", prevHi, histMaxValue)
	}
}

func TestHistogramRecordAllocs(t *testing.T) {
	var h Histogram
	if a := testing.AllocsPerRun(1000, func() { h.Record(123456) }); a != 0 {
		t.Fatalf("Record allocates %.1f times", a)
	}
}
