//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gosrp/gosrp/transport"
)

// The passive side of connection management: a listening rdma_cm_id and
// the connection requests it receives, accepted or rejected.

// Listener is a listening rdma_cm_id.
type Listener struct {
	cid    *cmID
	addr   string
	reqs   chan *ConnRequest
	mu     sync.Mutex
	closed bool
	stop   chan struct{}
}

var _ transport.Listener = (*Listener)(nil)

func (c *cmChannel) listen(ctx context.Context, addr string) (*Listener, error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.end()
	cid, ss, err := c.newIDAt(addr)
	if err != nil {
		return nil, err
	}
	if rc, err := C.rdma_bind_addr(cid.id, sa(&ss)); rc != 0 {
		cid.destroy()
		return nil, mapErrno("rdma_bind_addr "+addr, kindCM, errnoOf(err))
	}
	if rc, err := C.rdma_listen(cid.id, 64); rc != 0 {
		cid.destroy()
		return nil, mapErrno("rdma_listen "+addr, kindCM, errnoOf(err))
	}
	l := &Listener{cid: cid, addr: localAddr(cid.id), reqs: make(chan *ConnRequest, 64), stop: make(chan struct{})}
	cid.mu.Lock()
	cid.listener = l
	cid.mu.Unlock()
	return l, nil
}

// Addr is the bound host:port (rdma_get_src_port).
func (l *Listener) Addr() string { return l.addr }

// Accept waits for the next connection request.
func (l *Listener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.stop:
		return nil, fmt.Errorf("ibverbs: listener %s: %w", l.addr, transport.ErrClosed)
	}
}

// Close stops listening and rejects pending requests.
func (l *Listener) Close() error {
	l.cid.destroy()
	l.shut()
	return nil
}

func (l *Listener) shut() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.stop)
	l.mu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
		default:
			return
		}
	}
}

// ConnRequest is an incoming RDMA_CM_EVENT_CONNECT_REQUEST.
type ConnRequest struct {
	cid       *cmID
	dev       *Device
	pd        []byte
	respRes   int
	initDepth int
	remote    string
	local     string
	mu        sync.Mutex
	answered  bool
}

var _ transport.ConnRequest = (*ConnRequest)(nil)

// Device is the device the request arrived on (the same object OpenDevice
// returns for its name).
func (r *ConnRequest) Device() transport.Device { return r.dev }

// PrivateData is the request's private data as rdma_cm delivers it: on
// InfiniBand and RoCE the CM REQ carries a fixed-size field, so it is
// zero-padded to MaxConnectPrivateData bytes.
func (r *ConnRequest) PrivateData() []byte { return r.pd }

// RemoteAddr is the requester's host:port.
func (r *ConnRequest) RemoteAddr() string { return r.remote }

// ReadCredit is the request's READ credit bounded by this device. The
// event's figures are already the local side's (ib_cm swaps them in
// cm_format_req_event): initiator_depth is how many READs we may have
// outstanding at the peer, responder_resources how many it will have at
// us. Taken the other way round, a peer that issues no READs itself
// (ib_srp asks for none) left the target no READ credit at all, and every
// write needing an RDMA READ hung.
func (r *ConnRequest) ReadCredit() transport.ReadCredit {
	return transport.ReadCredit{
		Out: min(max(r.initDepth, 0), r.dev.maxInitRdAtom),
		In:  min(max(r.respRes, 0), r.dev.maxRdAtom),
	}
}

func (r *ConnRequest) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return fmt.Errorf("ibverbs: connection request already answered: %w", transport.ErrInvalidState)
	}
	r.answered = true
	return nil
}

// Accept moves qp INIT -> RTR -> RTS with rdma_cm's attributes and accepts
// with private data; it returns when the connection is ESTABLISHED.
func (r *ConnRequest) Accept(ctx context.Context, qp transport.QP, privateData []byte) (transport.Conn, error) {
	q, err := connQP("accept", qp, r.dev, privateData, transport.MaxAcceptPrivateData)
	if err != nil {
		return nil, err
	}
	if err := r.cid.c.begin(); err != nil {
		return nil, err
	}
	defer r.cid.c.end()
	if err := r.answer(); err != nil {
		return nil, err
	}
	credit := r.ReadCredit()
	respRes, initDepth := credit.In, credit.Out
	if err := q.toRTS(r.cid.id, respRes, initDepth); err != nil {
		return r.cid.refuse(q, err)
	}
	var param C.struct_rdma_conn_param
	defer C.free(r.cid.connParam(&param, q, privateData, respRes, initDepth))
	if rc, err := C.rdma_accept(r.cid.id, &param); rc != 0 {
		return r.cid.refuse(q, mapErrno("rdma_accept", kindCM, errnoOf(err)))
	}
	for {
		e, err := r.cid.wait(ctx)
		if err != nil {
			C.rdma_disconnect(r.cid.id)
			r.cid.destroy()
			q.toErr()
			return nil, err
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_ESTABLISHED:
			return r.cid.attach(q, r.pd, credit, r.local, r.remote), nil
		case C.RDMA_CM_EVENT_REJECTED, C.RDMA_CM_EVENT_CONNECT_ERROR, C.RDMA_CM_EVENT_UNREACHABLE,
			C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL, C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
			r.cid.destroy()
			q.toErr()
			return nil, fmt.Errorf("ibverbs: accept from %s: %s (status %d): %w", r.remote, eventName(e.typ), e.status, transport.ErrDisconnected)
		}
	}
}

// Reject refuses the request with private data (rdma_reject).
func (r *ConnRequest) Reject(privateData []byte) error {
	if len(privateData) > transport.MaxRejectPrivateData {
		return fmt.Errorf("ibverbs: reject: %d bytes of private data (max %d): %w", len(privateData), transport.MaxRejectPrivateData, transport.ErrInvalidArgument)
	}
	if err := r.cid.c.begin(); err != nil {
		return err // the provider's Close destroyed the request's id
	}
	defer r.cid.c.end()
	if err := r.answer(); err != nil {
		return err
	}
	cpd := cBytes(privateData)
	defer C.free(cpd)
	rc, err := C.rdma_reject(r.cid.id, cpd, C.uint8_t(len(privateData)))
	r.cid.destroy()
	if rc != 0 {
		return mapErrno("rdma_reject", kindCM, errnoOf(err))
	}
	return nil
}

// cBytes copies b into C memory (rdma_conn_param may not point at Go
// memory); the caller frees it. It never returns nil.
func cBytes(b []byte) unsafe.Pointer {
	p := C.malloc(C.size_t(max(len(b), 1)))
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	return p
}
