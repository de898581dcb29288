package faults

import (
	"context"

	"github.com/gosrp/gosrp/transport"
)

// listener wraps a listener so that its connection requests are wrapped.
type listener struct {
	transport.Listener
	p *Provider
}

// Accept returns the next connection request.
func (l *listener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &connRequest{ConnRequest: r, p: l.p}, nil
}

// connRequest wraps a connection request: its device is the wrapped one,
// and accepting it connects the QP underneath the consumer's.
type connRequest struct {
	transport.ConnRequest
	p *Provider
}

// Device is the wrapper of the request's device.
func (r *connRequest) Device() transport.Device { return r.p.device(r.ConnRequest.Device()) }

// Accept accepts the request on the QP underneath q.
func (r *connRequest) Accept(ctx context.Context, q transport.QP, privateData []byte) (transport.Conn, error) {
	c, err := r.ConnRequest.Accept(ctx, unwrapQP(q), privateData)
	if err != nil {
		return nil, err
	}
	return connected(c, q), nil
}

// endpoint wraps an endpoint the same way.
type endpoint struct {
	transport.Endpoint
	p *Provider
}

// Device is the wrapper of the endpoint's device.
func (e *endpoint) Device() transport.Device { return e.p.device(e.Endpoint.Device()) }

// Connect connects the QP underneath q.
func (e *endpoint) Connect(ctx context.Context, q transport.QP, privateData []byte) (transport.Conn, error) {
	c, err := e.Endpoint.Connect(ctx, unwrapQP(q), privateData)
	if err != nil {
		return nil, err
	}
	return connected(c, q), nil
}

// connected records the connection under the consumer's QP (for link cuts)
// and returns it naming that QP.
func connected(c transport.Conn, q transport.QP) transport.Conn {
	w, ok := q.(*qp)
	if !ok {
		return c
	}
	w.setConn(c)
	return &conn{Conn: c, qp: w}
}

// conn is a connection whose QP is the consumer's wrapper.
type conn struct {
	transport.Conn
	qp *qp
}

// QP is the consumer's QP.
func (c *conn) QP() transport.QP { return c.qp }
