package emu

import (
	"context"
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

type cq struct {
	dev   *device
	depth int

	mu      sync.Mutex
	ring    []transport.WC
	head    int // next to poll
	n       int // entries held
	overrun bool
	closed  bool
	// pushed and polled count the completions pushed and polled so far,
	// so that a QP can tell whether its consumer has seen one (replay.go).
	pushed, polled uint64
	users          map[*qp]struct{}
	notify         chan struct{} // capacity 1: a completion arrived
	done           chan struct{}
}

func newCQ(d *device, depth int) *cq {
	return &cq{
		dev:    d,
		depth:  depth,
		ring:   make([]transport.WC, depth),
		users:  map[*qp]struct{}{},
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

func (c *cq) Depth() int { return c.depth }

// Notify implements transport.CQNotifier. Wait and Notify share the
// signal: a CQ has one consumer, which uses one or the other.
func (c *cq) Notify() <-chan struct{} { return c.notify }

func (c *cq) Poll(wcs []transport.WC) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("emu: poll cq: %w", transport.ErrClosed)
	}
	if c.overrun {
		return 0, fmt.Errorf("emu: poll cq: %w", transport.ErrCQOverrun)
	}
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.ring[c.head]
		c.head++
		if c.head == c.depth {
			c.head = 0
		}
		c.n--
		c.polled++
		k++
	}
	return k, nil
}

func (c *cq) Wait(ctx context.Context) error {
	c.mu.Lock()
	ready := c.n > 0 || c.overrun
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("emu: wait cq: %w", transport.ErrClosed)
	}
	if ready {
		return nil
	}
	select {
	case <-c.notify:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return fmt.Errorf("emu: wait cq: %w", transport.ErrClosed)
	}
}

// push appends a completion. On overrun the CQ dies and every QP using it is
// moved to ERR, then CQ_ERR is raised (strict: the most unforgiving
// behaviour, docs/verbs.md#device-differences). It returns the QPs to move to
// ERR (non-nil on overrun); the caller does so without holding any lock and
// then calls raiseOverrun. seq numbers the completion among those pushed
// (from 1; 0 when it was not kept).
func (c *cq) push(wc *transport.WC) (victims []*qp, seq uint64) {
	c.mu.Lock()
	if c.closed || c.overrun {
		c.mu.Unlock()
		return nil, 0
	}
	if c.n == c.depth {
		return c.overrunLocked(), 0
	}
	i := c.head + c.n
	if i >= c.depth {
		i -= c.depth
	}
	c.ring[i] = *wc
	c.n++
	c.pushed++
	seq = c.pushed
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil, seq
}

// unpolled reports whether the completion numbered seq by push is still
// waiting for its consumer.
func (c *cq) unpolled(seq uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return seq != 0 && c.polled < seq
}

// overrunLocked kills the CQ. REQUIRES: c.mu held; releases it.
func (c *cq) overrunLocked() []*qp {
	c.overrun = true
	victims := make([]*qp, 0, len(c.users))
	for q := range c.users {
		victims = append(victims, q)
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return victims
}

// raiseOverrun reports the overrun as CQ_ERR. The caller raises it only
// after the CQ's QPs are in ERR, so a consumer that wakes on the event
// finds them there (it used to find them in RTS now and then).
func (c *cq) raiseOverrun() {
	c.dev.event(transport.AsyncEvent{Type: transport.EventCQErr, CQ: c, Reason: "completion queue overrun"})
}

func (c *cq) attach(q *qp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("emu: cq: %w", transport.ErrClosed)
	}
	c.users[q] = struct{}{}
	return nil
}

func (c *cq) detach(q *qp) {
	c.mu.Lock()
	delete(c.users, q)
	c.mu.Unlock()
}

func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if len(c.users) > 0 {
		return fmt.Errorf("emu: destroy cq used by %d QPs: %w", len(c.users), transport.ErrBusy)
	}
	c.closed = true
	close(c.done)
	return nil
}
