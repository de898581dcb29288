package cli

// EmuRetryTimeout and EmuRetryCount are the software NIC's ACK timeout
// and retry count in the programs. The emu defaults (20 ms × 3) keep tests
// fast but turn a GC pause or a busy 2-core machine into RETRY_EXC_ERR;
// between processes over TCP, which never loses a frame, only a stuck
// peer goes unanswered, so the programs wait as long as hardware would
// with a generous local ACK timeout.
const (
	EmuRetryTimeoutMS = 1000
	EmuRetryCount     = 7
)
