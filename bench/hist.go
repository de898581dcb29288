package main

import (
	"math"
	"math/bits"
	"time"
)

// Histogram is an HDR-style log-linear latency histogram in nanoseconds:
// values below 2^(histSubBits+1) are counted exactly, and every power of
// two above that is split into 2^histSubBits equal sub-buckets, so any
// recorded value is known to within 1/2^histSubBits (0.8 %) of itself.
// Record does not allocate; the zero value is ready to use. It is not safe
// for concurrent use (see jobHist for the per-second hand-over).
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	min    int64
	max    int64
	sum    float64 // for the mean
	sumSq  float64 // for the standard deviation
}

const (
	histSubBits  = 7
	histSubCount = 1 << (histSubBits + 1) // 256: the exact range and each bucket's resolution
	histSubHalf  = histSubCount / 2
	histMaxExp   = 40                                               // values are clamped to 2^40 ns (about 18 minutes)
	histBuckets  = (histMaxExp - histSubBits - 1 + 2) * histSubHalf // buckets 0..32 of 128 sub-buckets, plus the lower half of bucket 0
	histMaxValue = int64(1)<<histMaxExp - 1
)

// histIndex maps a value to its bucket.
func histIndex(v int64) int {
	if v < 0 {
		v = 0
	}
	if v > histMaxValue {
		v = histMaxValue
	}
	u := uint64(v)
	b := bits.Len64(u|(histSubCount-1)) - (histSubBits + 1) // power-of-two bucket, 0 for the exact range
	sub := int(u >> uint(b))                                // [0,256) for b = 0, [128,256) above
	return (b+1)*histSubHalf + sub - histSubHalf
}

// histRange is the smallest and largest value that map to bucket i.
func histRange(i int) (lo, hi int64) {
	b := i/histSubHalf - 1
	sub := int64(i%histSubHalf + histSubHalf)
	if b < 0 {
		b, sub = 0, int64(i)
	}
	lo = sub << uint(b)
	hi = (sub+1)<<uint(b) - 1
	return lo, hi
}

// Record adds one value in nanoseconds (clamped to [0, 2^40)).
func (h *Histogram) Record(ns int64) {
	ns = min(max(ns, 0), histMaxValue)
	h.counts[histIndex(ns)]++
	if h.n == 0 || ns < h.min {
		h.min = ns
	}
	if ns > h.max {
		h.max = ns
	}
	h.n++
	f := float64(ns)
	h.sum += f
	h.sumSq += f * f
}

// RecordDuration adds one duration.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(int64(d)) }

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max are the exact extremes (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max is the largest value recorded.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact arithmetic mean.
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// StdDev is the population standard deviation.
func (h *Histogram) StdDev() float64 {
	if h.n == 0 {
		return 0
	}
	m := h.Mean()
	v := h.sumSq/float64(h.n) - m*m
	if v < 0 {
		return 0
	}
	return math.Sqrt(v)
}

// Percentile returns the value below or at which q percent (0..100) of the
// recorded values lie: the nearest-rank value ceil(q/100 × N), reported
// as the top of its bucket (never more than Max). 0 when empty.
func (h *Histogram) Percentile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q / 100 * float64(h.n)))
	rank = max(rank, 1)
	rank = min(rank, h.n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i]
		if seen >= rank {
			_, hi := histRange(i)
			return min(max(hi, h.min), h.max)
		}
	}
	return h.max
}

// Merge adds o's values to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
	h.sumSq += o.sumSq
}

// Reset empties the histogram.
func (h *Histogram) Reset() { *h = Histogram{} }

// Bins calls fn for every non-empty bucket in ascending order with its
// upper value and count (for plots).
func (h *Histogram) Bins(fn func(hi int64, count uint64)) {
	for i, c := range h.counts {
		if c != 0 {
			_, hi := histRange(i)
			fn(hi, c)
		}
	}
}
