package transporttest

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// The optional provider hooks used by fault-injection tests. Their method
// sets match the software NIC's (transport/emu) exactly; this package does
// not import it. A provider that does not implement a hook skips the tests
// that need it (a hardware provider implements none).

// QPErrorInjector moves a QP to ERR just before its afterWRs-th next send
// work request executes (0 = the next one).
type QPErrorInjector interface {
	InjectQPError(qp transport.QP, afterWRs int) error
}

// PostFailureInjector makes the next PostSend on qp accept wrs[:atWR] and
// fail wrs[atWR] with an error wrapping transport.ErrQueueFull (ENOMEM from
// ibv_post_send partway through a chain).
type PostFailureInjector interface {
	InjectPostFailure(qp transport.QP, atWR int) error
}

// CQEDropInjector loses the nth next send completion of qp (0 = next).
type CQEDropInjector interface {
	InjectDropCQE(qp transport.QP, nth int) error
}

// CQEStatusInjector makes the nth next successful send completion of qp
// report status s instead; the QP then goes to ERR as after a real error.
type CQEStatusInjector interface {
	InjectCQEStatus(qp transport.QP, nth int, s transport.Status) error
}

// DuplicateInjector delivers the nth next request qp transmits twice.
type DuplicateInjector interface {
	InjectDuplicate(qp transport.QP, nth int) error
}

// LinkCutter cuts the wire under qp's connection: both QPs go to ERR and
// both Conn.Done channels close.
type LinkCutter interface {
	CutLink(qp transport.QP) error
}

// CQOverrunInjector overruns cq now: a CQ_ERR async event, every attached
// QP to ERR, and Poll returning transport.ErrCQOverrun.
type CQOverrunInjector interface {
	InjectCQOverrun(cq transport.CQ) error
}

// StrayInjector makes qp (the issuing side) perform an RDMA_WRITE of data,
// or an RDMA_READ of len(data) bytes into data, at (rkey, va) on its peer,
// outside the WRs its send queue shows, and returns the completion status
// it got.
type StrayInjector interface {
	InjectStray(qp transport.QP, op transport.Opcode, rkey transport.Key, va uint64, data []byte) (transport.Status, error)
}

// Seeder reports the seed of a provider's random choices (keys, faults), so
// a failing test can print it.
type Seeder interface {
	Seed() int64
}

// Injector is the full set of injection hooks of the software NIC.
type Injector interface {
	QPErrorInjector
	PostFailureInjector
	CQEDropInjector
	CQEStatusInjector
	DuplicateInjector
	LinkCutter
	CQOverrunInjector
	StrayInjector
}

// hook returns p as H or skips the test.
func hook[H any](t *testing.T, p transport.Provider, what string) H {
	t.Helper()
	h, ok := p.(H)
	if !ok {
		t.Skipf("provider %q has no %s hook (needs fault injection, e.g. transport/emu)", p.Name(), what)
	}
	return h
}
