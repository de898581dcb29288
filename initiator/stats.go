package initiator

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/frmr"
)

// LatencyBuckets is the number of latency histogram buckets: bucket i
// counts I/Os that took [2^i, 2^(i+1)) microseconds (bucket 0 also holds
// anything faster).
const LatencyBuckets = 32

type opStats struct {
	ops, bytes, errors atomic.Uint64
	lat                [LatencyBuckets]atomic.Uint64
}

type stats struct {
	byOp       [opControl + 1]opStats
	connLost   atomic.Uint64
	reconnects atomic.Uint64
	// the write verifier's (replay.go)
	instanceChanges, writeCacheLost, replayed, replayFlushes atomic.Uint64
	// ticks counts the channels' ticks: a channel with nothing to time
	// takes none (tickTimer).
	ticks atomic.Uint64
	// paced is how long the channels have waited, in nanoseconds, before
	// reconnects paced for churn (channel.reconnect): a count the tests
	// read instead of timing a failover.
	paced atomic.Int64
	// lostSilent and lostTimeout count the connections ended by the
	// keepalive (errSilent) and by a request's IOTimeout (errIOTimeout).
	lostSilent, lostTimeout atomic.Uint64
	poolMu                  sync.Mutex
	pool                    []frmr.Stats
}

func (s *stats) init() {}

func (s *stats) record(op Op, n int64, d time.Duration, failed bool) {
	o := &s.byOp[op]
	o.ops.Add(1)
	if failed {
		o.errors.Add(1)
	} else {
		o.bytes.Add(uint64(n))
	}
	us := uint64(d / time.Microsecond)
	b := 0
	if us > 0 {
		b = min(bits.Len64(us)-1, LatencyBuckets-1)
	}
	o.lat[b].Add(1)
}

// OpStats are the counts of one operation type.
type OpStats struct {
	Ops, Bytes, Errors uint64
	Latency            [LatencyBuckets]uint64
}

// Percentile estimates the latency below which a fraction q (0..1) of the
// operations completed, from the histogram (upper bucket edge).
func (o *OpStats) Percentile(q float64) time.Duration {
	var total uint64
	for _, n := range o.Latency {
		total += n
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total) + 0.5)
	var seen uint64
	for i, n := range o.Latency {
		seen += n
		if seen >= want && n > 0 {
			return time.Duration(uint64(1)<<(i+1)) * time.Microsecond
		}
	}
	return time.Duration(uint64(1)<<LatencyBuckets) * time.Microsecond
}

// Stats are a session's counters.
type Stats struct {
	Read, Write, Flush, Discard, WriteZeroes OpStats
	ConnectionsLost, Reconnects              uint64
	// InstanceChanges counts logins that found a target instance other
	// than the one before (a restarted target).
	InstanceChanges uint64
	// WriteCacheLost counts volumes found to have lost acknowledged,
	// unflushed writes (each reported as ErrWriteCacheLost).
	WriteCacheLost uint64
	// ReplayedWrites counts writes re-issued from the replay buffer after
	// an instance change; ReplayFlushes the flushes the session issued
	// itself because the replay buffer was full.
	ReplayedWrites, ReplayFlushes uint64
	// FRMR are the registration pools' counters, one per channel, as of
	// the last tick.
	FRMR []frmr.Stats
}

// Stats returns the session's counters.
func (s *Session) Stats() Stats {
	get := func(op Op) OpStats {
		o := &s.stats.byOp[op]
		r := OpStats{Ops: o.ops.Load(), Bytes: o.bytes.Load(), Errors: o.errors.Load()}
		for i := range r.Latency {
			r.Latency[i] = o.lat[i].Load()
		}
		return r
	}
	st := Stats{Read: get(OpRead), Write: get(OpWrite), Flush: get(OpFlush), Discard: get(OpDiscard),
		WriteZeroes: get(OpWriteZeroes), ConnectionsLost: s.stats.connLost.Load(), Reconnects: s.stats.reconnects.Load(),
		InstanceChanges: s.stats.instanceChanges.Load(), WriteCacheLost: s.stats.writeCacheLost.Load(),
		ReplayedWrites: s.stats.replayed.Load(), ReplayFlushes: s.stats.replayFlushes.Load()}
	s.stats.poolMu.Lock()
	st.FRMR = append([]frmr.Stats(nil), s.stats.pool...)
	s.stats.poolMu.Unlock()
	return st
}

// publishPool copies a channel's pool counters for Stats (loop only).
func (s *stats) publishPool(ch int, p *frmr.Pool) {
	st := p.Stats()
	s.poolMu.Lock()
	for len(s.pool) <= ch {
		s.pool = append(s.pool, frmr.Stats{})
	}
	s.pool[ch] = st
	s.poolMu.Unlock()
}
