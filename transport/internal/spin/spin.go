// Package spin is the polling policy the providers' waiters share: how
// long a waiter with nothing to do polls before it sleeps. A sleep costs
// system calls and, for whoever ends it, a wake-up across CPUs; polling
// costs a core while it lasts. So a waiter polls about as long as its
// waits have lately lasted, as an adaptive mutex spins about as long as
// the lock is usually held:
//
//	var avg spin.Average
//	for {
//		budget := spin.Budget(avg.Nanos(), lo, hi)
//		... poll for up to budget, then sleep until woken ...
//		avg.Observe(waited) // how long it took for the work to come
//	}
//
// A peer that answers within hi is met polling, with no system call on
// either side; one that answers slowly, or that shares the waiter's
// core, finds it asleep instead of spinning on the CPU it needs.
package spin

// Average is a moving average of a waiter's recent waits, in
// nanoseconds. Its zero value has seen no wait. Not safe for concurrent
// use.
type Average struct{ ns int64 }

// Observe folds a wait of d nanoseconds in, with weight 1/8 (the gain of
// TCP's smoothed round-trip time, RFC 6298): one long wait, an idle
// spell, moves it far, and about a dozen short ones bring it back.
func (a *Average) Observe(d int64) { a.ns += (d - a.ns) / 8 }

// Nanos is the average.
func (a Average) Nanos() int64 { return a.ns }

// Budget is how long to poll before sleeping when waits have lately
// lasted avg nanoseconds: twice that, within [lo, hi]; lo when they
// outlast hi, since then the poll would end before the work came and
// only add its cost to the sleep's.
func Budget(avg, lo, hi int64) int64 {
	if avg > hi {
		return lo
	}
	return min(max(2*avg, lo), hi)
}
