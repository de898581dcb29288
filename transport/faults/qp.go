package faults

import (
	"fmt"
	"sync"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// qp wraps a QP: its posts and its completions are where faults happen.
type qp struct {
	transport.QP
	d *device

	mu   sync.Mutex
	conn transport.Conn // the connection under the QP, once connected
	// One-shot faults set by the hooks; -1 when none is pending.
	failAt   int // the next PostSend fails at this WR
	errIn    int // send WRs to hand the device before the QP goes to ERR
	dropIn   int // successful send completions to pass before one is lost
	statusIn int // successful send completions to pass before one fails
	status   transport.Status
	// errored: the wrapper moved the QP to ERR on a completion it failed,
	// so later completions report WR_FLUSH_ERR as after a real error,
	// also for WRs the device had already carried out.
	errored bool
}

func (q *qp) connection() transport.Conn {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.conn
}

func (q *qp) setConn(c transport.Conn) {
	q.mu.Lock()
	q.conn = c
	q.mu.Unlock()
}

// PostSend posts wrs with the faults due: the QP goes to ERR before the
// WR chosen for a QP error, and a post failure refuses the WR chosen for
// it and every WR after it in this call (ibv_post_send's bad_wr).
func (q *qp) PostSend(wrs []transport.SendWR) (int, error) {
	p := q.d.p
	cut, errAt, linkCut := len(wrs), -1, false
	q.mu.Lock()
	if q.failAt >= 0 {
		if q.failAt < len(wrs) {
			cut = q.failAt
		}
		q.failAt = -1
	}
	if q.errIn >= 0 {
		if q.errIn < cut {
			errAt = q.errIn
			q.errIn = -1
		} else {
			q.errIn -= cut
		}
	}
	q.mu.Unlock()
	if p.random {
		for i := 0; i < cut; i++ {
			switch {
			case p.chance(p.cfg.PostFail):
				cut = i
			case errAt < 0 && p.chance(p.cfg.QPError):
				errAt = i
			case p.chance(p.cfg.LinkCut):
				linkCut = true
			}
		}
	}
	n, err := q.post(wrs[:cut], errAt)
	if p.cfg.PostLatency > 0 {
		time.Sleep(p.cfg.PostLatency)
	}
	if linkCut {
		if c := q.connection(); c != nil {
			p.count(func(n *Counters) { n.LinkCuts++ })
			c.Disconnect()
		}
	}
	if err != nil || cut == len(wrs) {
		return n, err
	}
	p.count(func(n *Counters) { n.PostFails++ })
	return n, fmt.Errorf("faults: send WR %d refused (injected): %w", cut, transport.ErrQueueFull)
}

// post hands wrs to the device, moving the QP to ERR just before wrs[errAt]
// when errAt is inside wrs.
func (q *qp) post(wrs []transport.SendWR, errAt int) (int, error) {
	if errAt < 0 || errAt >= len(wrs) {
		return q.QP.PostSend(wrs)
	}
	n, err := q.QP.PostSend(wrs[:errAt])
	if err != nil {
		return n, err
	}
	if err := q.QP.Modify(transport.QPErr); err != nil {
		return n, fmt.Errorf("faults: move QP %d to ERR (injected): %w", q.Num(), err)
	}
	q.d.p.count(func(c *Counters) { c.QPErrors++ })
	m, err := q.QP.PostSend(wrs[errAt:])
	return n + m, err
}

// Modify passes through; a reset QP starts again without the error the
// wrapper gave it.
func (q *qp) Modify(to transport.QPState) error {
	if to == transport.QPReset {
		q.mu.Lock()
		q.errored = false
		q.mu.Unlock()
	}
	return q.QP.Modify(to)
}

// Close closes the QP underneath, then waits out DestroyLatency and
// any HoldDestroys.
func (q *qp) Close() error {
	q.d.forget(q)
	err := q.QP.Close()
	if d := q.d.p.cfg.DestroyLatency; d > 0 {
		time.Sleep(d)
	}
	q.d.p.heldDestroy()
	return err
}

// complete applies the completion faults to wc, a completion of this QP;
// it reports false when wc is lost.
func (q *qp) complete(wc *transport.WC) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.errored {
		if wc.Status == transport.StatusSuccess {
			wc.Status = transport.StatusWRFlushErr
		}
		return true
	}
	// Only a successful completion says whether it is a send's: a failed
	// one leaves the opcode undefined (struct ibv_wc).
	if wc.Status != transport.StatusSuccess || wc.Opcode >= transport.WCRecv {
		return true
	}
	p := q.d.p
	drop := q.dropIn == 0
	if q.dropIn >= 0 {
		q.dropIn--
	}
	if drop || p.random && p.chance(p.cfg.DropCQE) {
		p.count(func(n *Counters) { n.Drops++ })
		return false
	}
	fail := false
	switch {
	case q.statusIn == 0:
		q.statusIn = -1
		fail = true
		wc.Status = q.status
	case q.statusIn > 0:
		q.statusIn--
	}
	if !fail && p.random && p.chance(p.cfg.CorruptCQE) {
		fail = true
		wc.Status = transport.StatusGeneralErr
	}
	if fail {
		// What a consumer sees after a real error: the QP in ERR, the
		// rest flushed (the errored rewrite covers WRs the device had
		// already carried out).
		q.errored = true
		q.QP.Modify(transport.QPErr)
		p.count(func(n *Counters) { n.Corrupts++ })
	}
	return true
}
