package initiator

import "github.com/gosrp/gosrp/transport"

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
