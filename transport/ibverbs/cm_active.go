//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// The active side of connection management and the connection itself:
// resolving a target, connecting a QP, and the established Conn.

// Endpoint is a resolved active-side rdma_cm_id.
type Endpoint struct {
	cid    *cmID
	dev    *Device
	remote string
	offer  transport.ReadCredit // what Connect asks for (OfferReadCredit)
	mu     sync.Mutex
	used   bool
}

var _ transport.Endpoint = (*Endpoint)(nil)

func (c *cmChannel) resolve(ctx context.Context, addr string) (*Endpoint, error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.end()
	cid, ss, err := c.newIDAt(addr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Endpoint, error) {
		cid.destroy()
		return nil, err
	}
	if rc, err := C.rdma_resolve_addr(cid.id, nil, sa(&ss), timeoutMS(ctx)); rc != 0 {
		return fail(mapErrno("rdma_resolve_addr "+addr, kindCM, errnoOf(err)))
	}
	e, err := cid.wait(ctx)
	if err != nil {
		return fail(err)
	}
	if e.typ != C.RDMA_CM_EVENT_ADDR_RESOLVED {
		return fail(fmt.Errorf("ibverbs: resolve %s: %s (status %d): %w", addr, eventName(e.typ), e.status, transport.ErrNotFound))
	}
	if rc, err := C.rdma_resolve_route(cid.id, timeoutMS(ctx)); rc != 0 {
		return fail(mapErrno("rdma_resolve_route "+addr, kindCM, errnoOf(err)))
	}
	if e, err = cid.wait(ctx); err != nil {
		return fail(err)
	}
	if e.typ != C.RDMA_CM_EVENT_ROUTE_RESOLVED {
		return fail(fmt.Errorf("ibverbs: resolve route %s: %s (status %d): %w", addr, eventName(e.typ), e.status, transport.ErrNotFound))
	}
	name := C.gosrp_id_device(cid.id)
	if name == nil {
		return fail(fmt.Errorf("ibverbs: resolve %s: no device: %w", addr, transport.ErrNotFound))
	}
	dev, err := c.p.openDevice(C.GoString(name))
	if err != nil {
		return fail(err)
	}
	ep := &Endpoint{cid: cid, dev: dev, remote: addr}
	ep.OfferReadCredit(transport.ReadCredit{Out: transport.MaxReadCredit, In: transport.MaxReadCredit})
	return ep, nil
}

// Device is the device that reaches the target.
func (ep *Endpoint) Device() transport.Device { return ep.dev }

// OfferReadCredit sets the READ credit Connect asks for, bounded by the
// device (max_qp_init_rd_atom, max_qp_rd_atom).
func (ep *Endpoint) OfferReadCredit(c transport.ReadCredit) {
	ep.offer = transport.ReadCredit{
		Out: min(max(c.Out, 0), ep.dev.maxInitRdAtom),
		In:  min(max(c.In, 0), ep.dev.maxRdAtom),
	}
}

// IB CM reject reasons (IBTA table 112) that Connect tells apart.
const (
	// rejInvalidServiceID: the peer's CM has no listener for the port
	// (cm_req_handler's answer when cm_find_listen finds none).
	rejInvalidServiceID = 8
	// rejConsumer, "consumer defined": the peer called rdma_reject.
	rejConsumer = 28
)

// Connect connects qp (RESET or INIT) in manual-QP mode: INIT, then
// rdma_connect with qp_num; on CONNECT_RESPONSE, RTR and RTS with
// rdma_cm's attributes and rdma_establish.
func (ep *Endpoint) Connect(ctx context.Context, qp transport.QP, privateData []byte) (transport.Conn, error) {
	q, err := connQP("connect", qp, ep.dev, privateData, transport.MaxConnectPrivateData)
	if err != nil {
		return nil, err
	}
	if err := ep.cid.c.begin(); err != nil {
		return nil, err
	}
	defer ep.cid.c.end()
	ep.mu.Lock()
	if ep.used {
		ep.mu.Unlock()
		return nil, fmt.Errorf("ibverbs: endpoint already used: %w", transport.ErrInvalidState)
	}
	ep.used = true
	ep.mu.Unlock()
	cid := ep.cid
	fail := func(err error) (transport.Conn, error) {
		cid.destroy()
		q.toErr()
		return nil, err
	}
	if err := q.cmModify(cid.id, transport.QPInit, -1); err != nil {
		return fail(err)
	}
	respRes, initDepth := ep.offer.In, ep.offer.Out
	var param C.struct_rdma_conn_param
	defer C.free(cid.connParam(&param, q, privateData, respRes, initDepth))
	if rc, err := C.rdma_connect(cid.id, &param); rc != 0 {
		return fail(mapErrno("rdma_connect "+ep.remote, kindCM, errnoOf(err)))
	}
	for {
		e, err := cid.wait(ctx)
		if err != nil {
			C.rdma_disconnect(cid.id)
			return fail(err)
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_CONNECT_RESPONSE:
			// As librdmacm's ucma_modify_qp_rtr: INIT again with the
			// connection's attributes (access flags), then RTR and RTS.
			// The reply's figures are the local side's, as the
			// request's are at the passive side (cm_format_rep_event):
			// responder_resources bounds the READs the peer will have
			// outstanding at us, initiator_depth ours at the peer.
			credit := transport.ReadCredit{Out: min(initDepth, max(e.initDepth, 0)), In: min(respRes, max(e.respRes, 0))}
			if err := q.toRTS(cid.id, credit.In, credit.Out); err != nil {
				return cid.refuse(q, err)
			}
			if rc, err := C.rdma_establish(cid.id); rc != 0 {
				return cid.refuse(q, mapErrno("rdma_establish", kindCM, errnoOf(err)))
			}
			return cid.attach(q, e.pd, credit, localAddr(cid.id), peerAddr(cid.id)), nil
		case C.RDMA_CM_EVENT_ESTABLISHED:
			// Without a CONNECT_RESPONSE first (not in manual-QP mode):
			// the figures asked for, the best this side can say.
			return cid.attach(q, e.pd, ep.offer, localAddr(cid.id), peerAddr(cid.id)), nil
		case C.RDMA_CM_EVENT_REJECTED:
			if e.status == rejConsumer {
				return fail(&transport.RejectError{PrivateData: e.pd})
			}
			if e.status == rejInvalidServiceID {
				return fail(fmt.Errorf("ibverbs: connect %s: rejected by the peer's CM: no listener at that port: %w", ep.remote, transport.ErrRefused))
			}
			return fail(fmt.Errorf("ibverbs: connect %s: rejected by the CM (reason %d): %w", ep.remote, e.status, transport.ErrNotFound))
		case C.RDMA_CM_EVENT_UNREACHABLE, C.RDMA_CM_EVENT_CONNECT_ERROR:
			return fail(fmt.Errorf("ibverbs: connect %s: %s (status %d): %w", ep.remote, eventName(e.typ), e.status, transport.ErrNotFound))
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			return fail(fmt.Errorf("ibverbs: connect %s: %s: %w", ep.remote, eventName(e.typ), transport.ErrDisconnected))
		}
	}
}

// Close releases the endpoint if it never connected.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	used := ep.used
	ep.used = true
	ep.mu.Unlock()
	if !used {
		ep.cid.destroy()
	}
	return nil
}

// attach turns an id into an established connection, then replays any
// teardown event that raced in before the Conn existed.
func (cid *cmID) attach(q *QP, pd []byte, credit transport.ReadCredit, local, remote string) *Conn {
	c := &Conn{cid: cid, qp: q, pd: pd, credit: credit, local: local, remote: remote, done: make(chan struct{})}
	if lh, _, err := net.SplitHostPort(local); err == nil {
		if rh, _, err := net.SplitHostPort(remote); err == nil && lh == rh {
			q.loopback.Store(true) // both ends on this host's device
		}
	}
	cid.mu.Lock()
	cid.conn = c
	cid.mu.Unlock()
	for {
		select {
		case e := <-cid.evs:
			c.event(e)
		default:
			return c
		}
	}
}

// Conn is an established connection.
type Conn struct {
	cid    *cmID
	qp     *QP
	pd     []byte
	credit transport.ReadCredit
	local  string
	remote string
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	err    error
}

var _ transport.Conn = (*Conn)(nil)

func (c *Conn) QP() transport.QP      { return c.qp }
func (c *Conn) PrivateData() []byte   { return c.pd }
func (c *Conn) LocalAddr() string     { return c.local }
func (c *Conn) RemoteAddr() string    { return c.remote }
func (c *Conn) Done() <-chan struct{} { return c.done }

// ReadCredit is the READ credit the QP was moved to RTR and RTS with.
func (c *Conn) ReadCredit() transport.ReadCredit { return c.credit }

// Err is nil while connected, then why the connection ended.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Conn) end(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

// event handles a CM event after establishment (dispatcher goroutine).
func (c *Conn) event(e cmEvent) {
	switch e.typ {
	case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL, C.RDMA_CM_EVENT_TIMEWAIT_EXIT,
		C.RDMA_CM_EVENT_ADDR_CHANGE:
		c.cid.mu.Lock()
		if !c.cid.destroyed {
			C.rdma_disconnect(c.cid.id) // answers the peer's DREQ
			c.qp.toErr()
			c.cid.destroyLocked()
		}
		c.cid.mu.Unlock()
		c.end(fmt.Errorf("ibverbs: connection %s-%s: %s: %w", c.local, c.remote, eventName(e.typ), transport.ErrDisconnected))
	}
}

// Disconnect sends a DREQ (rdma_disconnect) and moves the QP to ERR so that
// outstanding work flushes.
func (c *Conn) Disconnect() error {
	c.cid.mu.Lock()
	if !c.cid.destroyed {
		C.rdma_disconnect(c.cid.id)
	}
	c.cid.mu.Unlock()
	c.qp.toErr()
	c.end(fmt.Errorf("ibverbs: connection %s-%s: local disconnect: %w", c.local, c.remote, transport.ErrDisconnected))
	return nil
}
