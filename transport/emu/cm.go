package emu

// Connection management common to every wire: the established connection
// (conn), the queue a listener hands requests through, and the active
// side's endpoint.

import (
	"context"
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// conn is an established connection: the transport.Conn of one side.
type conn struct {
	q      *qp
	l      link
	priv   []byte
	local  string
	remote string
	credit transport.ReadCredit // fixed at connection; the requester gates READs by Out
	done   chan struct{}

	mu  sync.Mutex
	err error
}

func newConn(q *qp, l link, priv []byte, credit transport.ReadCredit, local, remote string) *conn {
	return &conn{q: q, l: l, priv: append([]byte(nil), priv...), credit: credit, local: local, remote: remote, done: make(chan struct{})}
}

func (c *conn) QP() transport.QP      { return c.q }
func (c *conn) PrivateData() []byte   { return c.priv }
func (c *conn) LocalAddr() string     { return c.local }
func (c *conn) RemoteAddr() string    { return c.remote }
func (c *conn) Done() <-chan struct{} { return c.done }

func (c *conn) ReadCredit() transport.ReadCredit { return c.credit }

func (c *conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends this side of the connection: the QP goes to ERR and flushes,
// as rdma_cm does when it handles a DREQ or a link failure. retryExc
// reports the oldest outstanding request as RETRY_EXC_ERR (the peer
// vanished under it) instead of flushing it.
func (c *conn) fail(err error, retryExc bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	q := c.q
	q.mu.Lock()
	if !q.closed && q.state != transport.QPErr && q.state != transport.QPReset {
		if retryExc {
			q.failInflightLocked(err.Error())
		}
		q.toErrLocked(transport.StatusSuccess, err.Error())
	}
	q.unlock()
}

func (c *conn) Disconnect() error {
	c.l.disconnect(fmt.Errorf("emu: disconnected by %s: %w", c.local, transport.ErrDisconnected))
	return nil
}

func checkPrivate(what string, b []byte, limit int) error {
	if len(b) > limit {
		return fmt.Errorf("emu: %s private data of %d bytes (limit %d, as RDMA-CM on IB/RoCE): %w", what, len(b), limit, transport.ErrInvalidArgument)
	}
	return nil
}

func asQP(d *device, x transport.QP) (*qp, error) {
	q, ok := x.(*qp)
	if !ok || q.dev != d {
		return nil, fmt.Errorf("emu: QP is not this NIC's: %w", transport.ErrInvalidArgument)
	}
	return q, nil
}

// answerOnce admits the one answer a connection request gets, an accept
// or a reject; on the loop wire a requester that gave up (gaveUp) has
// taken it.
type answerOnce struct {
	mu       sync.Mutex
	answered bool
	gaveUp   bool
}

func (a *answerOnce) answer() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.gaveUp:
		return fmt.Errorf("emu: the requester gave up: %w", transport.ErrDisconnected)
	case a.answered:
		return fmt.Errorf("emu: request already answered: %w", transport.ErrInvalidState)
	}
	a.answered = true
	return nil
}

// accepting checks an Accept's private data and QP (one of d's) and
// takes the request's answer.
func (a *answerOnce) accepting(d *device, x transport.QP, priv []byte) (*qp, error) {
	if err := checkPrivate("accept", priv, transport.MaxAcceptPrivateData); err != nil {
		return nil, err
	}
	q, err := asQP(d, x)
	if err != nil {
		return nil, err
	}
	if err := a.answer(); err != nil {
		return nil, err
	}
	return q, nil
}

// rejecting checks a Reject's private data and takes the request's
// answer.
func (a *answerOnce) rejecting(priv []byte) error {
	if err := checkPrivate("reject", priv, transport.MaxRejectPrivateData); err != nil {
		return err
	}
	return a.answer()
}

// acceptFrom waits for the next connection request a wire's listener
// queued; once the listener's socket has failed (fail, nil on the loop
// wire) it returns that error.
func acceptFrom[R transport.ConnRequest](ctx context.Context, reqs <-chan R, done <-chan struct{}, fail *listenFail, addr string) (transport.ConnRequest, error) {
	var failed <-chan struct{}
	if fail != nil {
		failed = fail.ch
	}
	select {
	case r := <-reqs:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
		return nil, fmt.Errorf("emu: accept on %s: %w", addr, transport.ErrClosed)
	case <-failed:
		return nil, fail.err
	}
}

// rejectPending refuses the requests still queued on a closing listener.
func rejectPending[R transport.ConnRequest](reqs <-chan R) {
	for {
		select {
		case r := <-reqs:
			r.Reject(nil)
		default:
			return
		}
	}
}

// maxReadCredit is the most RDMA READs the NIC lets a QP hold
// outstanding each way (max_qp_init_rd_atom and max_qp_rd_atom).
const maxReadCredit = transport.MaxReadCredit

// boundCredit bounds each figure of c to [0, maxReadCredit].
func boundCredit(c transport.ReadCredit) transport.ReadCredit {
	return transport.ReadCredit{Out: min(max(c.Out, 0), maxReadCredit), In: min(max(c.In, 0), maxReadCredit)}
}

// offeredCredit is what the passive side may give a connection whose
// requester offered offer (its own view): the requester's
// responder_resources bound the passive side's READs, and its
// initiator_depth the READs the passive side must serve, as the kernel's
// cm_format_req_event hands them to the listener.
func offeredCredit(offer transport.ReadCredit) transport.ReadCredit {
	return boundCredit(transport.ReadCredit{Out: offer.In, In: offer.Out})
}

// agreedCredit is the active side's credit from its offer and the
// acceptor's figures (the acceptor's view).
func agreedCredit(offer, reply transport.ReadCredit) transport.ReadCredit {
	return transport.ReadCredit{Out: min(offer.Out, max(reply.In, 0)), In: min(offer.In, max(reply.Out, 0))}
}

// putCredit packs a READ credit for a CM message: initiator_depth in the
// low byte, responder_resources in the high one.
func putCredit(c transport.ReadCredit) uint16 {
	return uint16(min(max(c.Out, 0), 0xff)) | uint16(min(max(c.In, 0), 0xff))<<8
}

// getCredit unpacks putCredit's figures; a peer's are bounded again by
// offeredCredit or agreedCredit before use.
func getCredit(v uint32) transport.ReadCredit {
	return transport.ReadCredit{Out: int(v & 0xff), In: int(v >> 8 & 0xff)}
}

type endpoint struct {
	p     *Provider
	addr  string
	used  bool
	offer transport.ReadCredit
}

func (e *endpoint) Device() transport.Device { return e.p.dev }
func (e *endpoint) Close() error             { return nil }

// OfferReadCredit sets the READ credit Connect asks for.
func (e *endpoint) OfferReadCredit(c transport.ReadCredit) { e.offer = boundCredit(c) }

func (e *endpoint) Connect(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	if err := checkPrivate("connect", priv, transport.MaxConnectPrivateData); err != nil {
		return nil, err
	}
	q, err := asQP(e.p.dev, x)
	if err != nil {
		return nil, err
	}
	if st := q.State(); st != transport.QPReset && st != transport.QPInit {
		return nil, fmt.Errorf("emu: connect qp %d in %s: %w", q.num, st, transport.ErrInvalidState)
	}
	if e.used {
		return nil, fmt.Errorf("emu: endpoint already used: %w", transport.ErrInvalidState)
	}
	e.used = true
	// The provider's Close ends a Connect under way, as the ibverbs
	// provider's does (closing its CM channel ends every wait for an
	// event): a consumer that reconnects as its provider closes must
	// not wait out its context.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.p.dev.closedCtx, cancel)
	defer stop()
	var c transport.Conn
	switch e.p.cfg.Wire {
	case WireTCP:
		c, err = dialStream[tcpWire](ctx, e.p, e.addr, q, priv, e.offer)
	case WireShm:
		c, err = dialStream[shmWire](ctx, e.p, e.addr, q, priv, e.offer)
	default:
		c, err = e.p.connectLoop(ctx, e.addr, q, priv, e.offer)
	}
	if err != nil && e.p.isClosed() {
		return nil, fmt.Errorf("emu: connect to %s: provider closed: %w", e.addr, transport.ErrClosed)
	}
	return c, err
}
