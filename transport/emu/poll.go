package emu

// The polling policy of the wires' readers: how long a reader with
// nothing to do polls before it sleeps, and when it stops polling because
// the CPUs are oversubscribed.

import (
	"time"
)

// Waiting policy of a ring reader with nothing to do: poll for a spin
// budget, then sleep until a doorbell (or at most shmSleep, a safety net;
// peer death is reported by the socket). The budget adapts to how long
// the reader has been waiting for work lately (transport/internal/spin):
// twice the recent average wait, within [shmSpinMin, shmSpinMax]. A peer
// that answers in microseconds (the other process on another core) is
// met spinning, with no system call on either side; a peer that answers
// slowly, or shares a core with us, finds the reader asleep instead of
// burning the CPU it needs.
const (
	// shmSpinPolls is how many times a producer retries a full ring, or
	// shutSinks a busy gate, before it starts yielding.
	shmSpinPolls = 128
	shmSpinMin   = 2 * time.Microsecond
	shmSpinMax   = 50 * time.Microsecond
	shmSleep     = time.Second
	// shmMapWait bounds how long a descriptor may wait for the arena MAP
	// the peer promised to send before it.
	shmMapWait = 5 * time.Second
)

// shmSpinAwait is how long a reader whose QP has requests in flight
// polls for their answers before it sleeps, whatever its average wait,
// unless the CPUs are oversubscribed (Config.ShmPoll adaptive): an answer
// comes from the peer's NIC (its ring reader) alone. Waits for new
// requests, which come from the peer's application and may take any time
// (an NBD client, another process on the same cores), get only the
// adaptive budget: spinning through those starved the very processes that
// would send them.
const shmSpinAwait = 200 * time.Microsecond

// shmSpinIdle is how long a reader with no requests in flight polls for
// new ones, past its adaptive budget, while most of its recent waits
// ended without a sleep and the CPUs do not look oversubscribed
// (contention.busy): then the polling takes CPU
// from nobody and usually ends in work, and a reader that sleeps instead
// costs the peer a wake-up across CPUs for the next request, which on a
// VM without guest halt-polling is tens of microseconds. A reader whose
// waits mostly outlast the polling (a QD1 client behind an NBD hop) gets
// the adaptive budget alone, which also tells it when waits shorten
// again. (The average wait cannot decide this: the sleeps that polling
// avoids are what make it long.)
const shmSpinIdle = 50 * time.Microsecond

// A poll that takes longer than pollPreempted means the reader did not
// run in between. If the kernel ran another thread on this CPU meanwhile
// (the reader assumes so, or asks PSI with Config.PollPressure), the CPUs
// are oversubscribed, and a reader polling
// for answers takes time from the processes that would produce them, so
// for pollContendedFor after it, the shm and tcp readers do not poll for
// answers.
const (
	pollPreempted    = 20 * time.Microsecond
	pollContendedFor = 50 * time.Millisecond
)

// contention is a polling reader's record of being descheduled, and the
// pressure gauge it may consult (nil: its own record alone;
// Config.PollPressure).
type contention struct {
	until int64
	g     *pressureGauge
}

// observe records one poll that began at prev and ended at now (clock
// nanoseconds); it reports whether the reader was descheduled in between
// by a thread that wanted its CPU. Without a gauge a long gap alone
// counts: on a machine given to gosrp it is rare, and where it is not,
// backing off is the safe guess.
func (c *contention) observe(prev, now int64) bool {
	if now-prev > int64(pollPreempted) && (c.g == nil || c.g.oversubscribed(now)) {
		c.until = now + int64(pollContendedFor)
		return true
	}
	return false
}

// busy reports whether the CPUs look oversubscribed at now, which keeps a
// reader from polling for new requests: the gauge's word where there is
// one, else the reader's own record.
func (c *contention) busy(now int64) bool {
	if c.g != nil {
		return c.g.oversubscribed(now)
	}
	return c.contended(now)
}

// contended reports whether polling for answers should stop at now.
func (c *contention) contended(now int64) bool { return now < c.until }

// tcpSpinAwait is how long the reader polls a quiet socket while its QP
// has requests in flight, before it parks in the netpoller. Parking costs
// an epoll_wait, a sleep and a wake-up per burst; the peer's answers to a
// deep queue come within tens of microseconds, unless the peer itself
// parked and must first be woken, which on a VM can take tens of
// microseconds more (a pipe round trip between two vCPUs took 29–65 µs
// on ours): a window shorter than that turns one parked side into two.
// It is shmSpinAwait's. Linux's busy polling (SO_BUSY_POLL,
// net.core.busy_read) makes the same trade in the kernel, and does not
// apply to loopback.
const tcpSpinAwait = 200 * time.Microsecond

// tcpSpinIdle is how long the reader polls a quiet socket while no answer
// is due, when no task waits for a CPU (the shm reader's shmSpinIdle):
// the next request of a busy peer usually comes within it, and parking
// costs the peer a cross-CPU wake-up for it.
const tcpSpinIdle = 50 * time.Microsecond
