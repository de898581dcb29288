package initiator

import (
	"time"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
)

// Bounced reports whether I/O on b goes through a credit's bounce buffer,
// one copy of len(b) bytes per I/O, rather than being registered in place
// (BenchmarkIsolation reports it as copied-B/op).
func Bounced(s *Session, b []byte) bool {
	_, zc := s.zeroCopy(b)
	return !zc
}

// Ticks is how many ticks s's channels have taken (tickTimer).
func Ticks(s *Session) uint64 { return s.stats.ticks.Load() }

// PinChannel makes channel i carry s's next request, and returns the
// QP it is connected over. Call it before any reconnect: the QP is the
// one Dial connected.
func PinChannel(s *Session, i int) transport.QP {
	s.next.Store(uint32(i - 1))
	return s.chans[i].qp
}

// Paced is how long s's channels have waited before reconnects paced
// for churn (channel.reconnect), in all.
func Paced(s *Session) time.Duration { return time.Duration(s.stats.paced.Load()) }

// PathSession is the session mv's multipath keeps to path i, nil if it
// has not dialed it.
func PathSession(mv *MultipathVolume, i int) *Session {
	mv.m.mu.Lock()
	defer mv.m.mu.Unlock()
	return mv.m.paths[i]
}

// UpFor is how long the youngest of s's connections has been up, 0 if a
// channel is down. A connection that died and whose channel has not yet
// noticed counts as up.
func UpFor(s *Session) time.Duration {
	young := time.Duration(1<<63 - 1)
	for _, c := range s.chans {
		c.mu.Lock()
		down, at := c.down, c.upAt
		c.mu.Unlock()
		if down {
			return 0
		}
		young = min(young, time.Duration(clock.Nanos()-at))
	}
	return young
}

// LostBy counts s's connections ended by the keepalive's silence and by
// a request's IOTimeout.
func LostBy(s *Session) (silent, timeout uint64) {
	return s.stats.lostSilent.Load(), s.stats.lostTimeout.Load()
}
