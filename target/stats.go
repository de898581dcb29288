package target

import (
	"math/bits"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/wire"
)

// HistogramBuckets is the number of latency buckets: bucket 0 counts
// latencies under 1µs, bucket i (i ≥ 1) those in [2^(i-1), 2^i) µs, and the
// last bucket everything longer.
const HistogramBuckets = 32

// Histogram is a log2 latency histogram in microseconds.
type Histogram struct {
	Buckets [HistogramBuckets]uint64
}

// Count is the number of samples.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// Quantile returns an upper bound in microseconds of the q-quantile
// (0 < q ≤ 1): the upper edge of the bucket holding it. Zero when empty.
func (h *Histogram) Quantile(q float64) uint64 {
	n := h.Count()
	if n == 0 {
		return 0
	}
	want := uint64(q * float64(n))
	if want == 0 {
		want = 1
	}
	var seen uint64
	for i, b := range h.Buckets {
		seen += b
		if seen >= want {
			return 1 << i
		}
	}
	return 1 << (HistogramBuckets - 1)
}

func bucketOf(ns int64) int {
	if ns < 1000 {
		return 0
	}
	b := bits.Len64(uint64(ns / 1000))
	if b >= HistogramBuckets {
		b = HistogramBuckets - 1
	}
	return b
}

// OpStats count one kind of operation.
type OpStats struct {
	Ops    uint64
	Bytes  uint64
	Errors uint64
}

// IOStats count the commands of a volume or a connection.
type IOStats struct {
	Read, Write, Flush, Discard, WriteZeroes OpStats
	// Latency is from the command's arrival to its response being posted.
	Latency Histogram
}

// VolumeStats are the counts of one volume, summed over connections.
type VolumeStats struct {
	Name string
	IOStats
}

// ConnStats describe one live connection.
type ConnStats struct {
	ID           uint64
	Remote       string
	Initiator    string
	State        string
	Credits      int // granted at login
	CreditsInUse int // commands received and not yet answered
	OpenVolumes  int
	IOStats
}

// Stats is a snapshot of a target's counters.
type Stats struct {
	// Connections is the number of live connections; Accepted counts every
	// connection accepted so far, Rejected every connection request or
	// login refused, Violations every connection closed for a protocol
	// violation or transfer error.
	Connections int
	Accepted    uint64
	Rejected    uint64
	Violations  uint64
	// Evicted counts connections that had not logged in and gave up
	// their slot to a newcomer when every pre-login slot was held.
	Evicted uint64
	// CreditsInUse sums ConnStats.CreditsInUse.
	CreditsInUse int
	Volumes      []VolumeStats // sorted by name
	Conns        []ConnStats   // sorted by ID
}

type opCounter struct {
	ops, bytes, errors atomic.Uint64
}

func (o *opCounter) load() OpStats {
	return OpStats{Ops: o.ops.Load(), Bytes: o.bytes.Load(), Errors: o.errors.Load()}
}

// ioCounters are updated with atomics by a connection's poller and read
// by Stats at any time.
type ioCounters struct {
	ops     [5]opCounter // indexed by wire.Op - 1
	latency [HistogramBuckets]atomic.Uint64
}

func (c *ioCounters) record(op wire.Op, n uint32, failed bool, latencyNS int64) {
	if op < wire.OpRead || op > wire.OpWriteZeroes {
		return
	}
	o := &c.ops[op-1]
	o.ops.Add(1)
	if failed {
		o.errors.Add(1)
	} else {
		o.bytes.Add(uint64(n))
	}
	c.latency[bucketOf(latencyNS)].Add(1)
}

func (c *ioCounters) load() IOStats {
	var s IOStats
	s.Read = c.ops[0].load()
	s.Write = c.ops[1].load()
	s.Flush = c.ops[2].load()
	s.Discard = c.ops[3].load()
	s.WriteZeroes = c.ops[4].load()
	for i := range c.latency {
		s.Latency.Buckets[i] = c.latency[i].Load()
	}
	return s
}
