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
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// Connection management runs on one rdma_cm event channel per provider. A
// dispatcher goroutine reads events (non-blocking fd, poll(2) with a stop
// eventfd), copies them out, acks them at once (so rdma_destroy_id never
// waits on us) and routes them by rdma_cm_id to the waiting Listen, Accept
// or Connect, or to the established Conn.
//
// QPs are the contract's own (ibv_create_qp on the consumer's PD, created in
// RESET), so rdma_cm runs in "manual QP" mode: rdma_init_qp_attr computes
// the attributes of each transition and ibv_modify_qp applies them, the QP
// number travels in rdma_conn_param.qp_num, and the active side calls
// rdma_establish after RDMA_CM_EVENT_CONNECT_RESPONSE.

type cmEvent struct {
	typ       int
	status    int
	respRes   int
	initDepth int
	pd        []byte
}

type cmChannel struct {
	p      *Provider
	ch     *C.struct_rdma_event_channel
	stopFD int
	done   chan struct{}

	mu  sync.Mutex
	ids map[uintptr]*cmID
}

// cmID is one rdma_cm_id and whoever waits for its events.
type cmID struct {
	c         *cmChannel
	id        *C.struct_rdma_cm_id
	evs       chan cmEvent
	mu        sync.Mutex
	destroyed bool
	conn      *Conn
	listener  *Listener
}

func newCMChannel(p *Provider) (*cmChannel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, mapErrno("rdma_create_event_channel (is rdma_ucm loaded?)", kindCM, errnoOf(err))
	}
	if rc := C.gosrp_set_nonblock(ch.fd); rc != 0 {
		C.rdma_destroy_event_channel(ch)
		return nil, mapErrno("fcntl rdma_cm channel", kindCM, int(rc))
	}
	fd, e := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if e != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: eventfd: %w", e)
	}
	c := &cmChannel{p: p, ch: ch, stopFD: fd, done: make(chan struct{}), ids: map[uintptr]*cmID{}}
	go c.loop()
	return c, nil
}

func (c *cmChannel) newID() (*cmID, error) {
	var id *C.struct_rdma_cm_id
	if rc := C.gosrp_create_id(c.ch, &id); rc != 0 {
		return nil, mapErrno("rdma_create_id", kindCM, int(rc))
	}
	return c.register(id), nil
}

func (c *cmChannel) register(id *C.struct_rdma_cm_id) *cmID {
	cid := &cmID{c: c, id: id, evs: make(chan cmEvent, 16)}
	c.mu.Lock()
	c.ids[uintptr(unsafe.Pointer(id))] = cid
	c.mu.Unlock()
	return cid
}

func (c *cmChannel) lookup(id *C.struct_rdma_cm_id) *cmID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[uintptr(unsafe.Pointer(id))]
}

// destroy unregisters and destroys the id once. Caller holds cid.mu.
func (cid *cmID) destroyLocked() {
	if cid.destroyed {
		return
	}
	cid.destroyed = true
	cid.c.mu.Lock()
	delete(cid.c.ids, uintptr(unsafe.Pointer(cid.id)))
	cid.c.mu.Unlock()
	C.rdma_destroy_id(cid.id)
}

func (cid *cmID) destroy() {
	cid.mu.Lock()
	cid.destroyLocked()
	cid.mu.Unlock()
}

func (c *cmChannel) loop() {
	defer close(c.done)
	fds := []unix.PollFd{{Fd: int32(c.ch.fd), Events: unix.POLLIN}, {Fd: int32(c.stopFD), Events: unix.POLLIN}}
	var ev C.struct_gosrp_cm_event
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		for C.gosrp_get_cm_event(c.ch, &ev) == 0 {
			c.dispatch(&ev)
		}
	}
}

func (c *cmChannel) dispatch(ev *C.struct_gosrp_cm_event) {
	e := cmEvent{typ: int(ev._type), status: int(ev.status),
		respRes: int(ev.responder_resources), initDepth: int(ev.initiator_depth)}
	if ev.pd_len > 0 {
		e.pd = C.GoBytes(unsafe.Pointer(&ev.pd[0]), C.int(ev.pd_len))
	}
	if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		c.connectRequest(ev.listen_id, ev.id, e)
		return
	}
	cid := c.lookup(ev.id)
	if cid == nil {
		return
	}
	cid.mu.Lock()
	conn := cid.conn
	cid.mu.Unlock()
	if conn != nil {
		conn.event(e)
		return
	}
	select {
	case cid.evs <- e:
	default: // nobody is waiting for a flood of events on this id
	}
}

func (c *cmChannel) connectRequest(listenID, id *C.struct_rdma_cm_id, e cmEvent) {
	lid := c.lookup(listenID)
	var l *Listener
	if lid != nil {
		lid.mu.Lock()
		l = lid.listener
		lid.mu.Unlock()
	}
	refuse := func() {
		C.rdma_reject(id, nil, 0)
		C.rdma_destroy_id(id)
	}
	if l == nil {
		refuse()
		return
	}
	name := C.gosrp_id_device(id)
	if name == nil {
		refuse()
		return
	}
	dev, err := c.p.openDevice(C.GoString(name))
	if err != nil {
		refuse()
		return
	}
	cid := c.register(id)
	req := &ConnRequest{cid: cid, dev: dev, pd: e.pd, respRes: e.respRes, initDepth: e.initDepth,
		remote: peerAddr(id), local: localAddr(id)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		req.Reject(nil)
		return
	}
	select {
	case l.reqs <- req:
	default:
		req.Reject(nil)
	}
}

func (c *cmChannel) close() {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	_, _ = unix.Write(c.stopFD, one)
	<-c.done
	c.mu.Lock()
	all := make([]*cmID, 0, len(c.ids))
	for _, cid := range c.ids {
		all = append(all, cid)
	}
	c.mu.Unlock()
	for _, cid := range all {
		cid.mu.Lock()
		conn, l := cid.conn, cid.listener
		if conn != nil && !cid.destroyed {
			C.rdma_disconnect(cid.id)
			conn.qp.toErr()
		}
		cid.destroyLocked()
		cid.mu.Unlock()
		if conn != nil {
			conn.end(fmt.Errorf("ibverbs: provider closed: %w", transport.ErrDisconnected))
		}
		if l != nil {
			l.shut()
		}
	}
	C.rdma_destroy_event_channel(c.ch)
	unix.Close(c.stopFD)
}

// wait returns the next event of cid, or the context's error.
func (cid *cmID) wait(ctx context.Context) (cmEvent, error) {
	select {
	case e := <-cid.evs:
		return e, nil
	case <-ctx.Done():
		return cmEvent{}, ctx.Err()
	case <-cid.c.done:
		return cmEvent{}, fmt.Errorf("ibverbs: rdma_cm: %w", transport.ErrClosed)
	}
}

func eventName(t int) string { return C.GoString(C.rdma_event_str(uint32(t))) }

func ipString(b []byte, n int) string {
	if n == 4 || n == 16 {
		return net.IP(b[:n]).String()
	}
	return "?"
}

func localAddr(id *C.struct_rdma_cm_id) string {
	var b [16]byte
	n := int(C.gosrp_local_ip(id, (*C.uint8_t)(&b[0])))
	return net.JoinHostPort(ipString(b[:], n), strconv.Itoa(int(C.gosrp_src_port(id))))
}

func peerAddr(id *C.struct_rdma_cm_id) string {
	var b [16]byte
	n := int(C.gosrp_peer_ip(id, (*C.uint8_t)(&b[0])))
	return net.JoinHostPort(ipString(b[:], n), strconv.Itoa(int(C.gosrp_dst_port(id))))
}

// sockaddr parses host:port into a sockaddr (no Go pointers inside, so it
// may be passed to C).
func sockaddr(addr string) (C.struct_sockaddr_storage, error) {
	var ss C.struct_sockaddr_storage
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return ss, fmt.Errorf("ibverbs: address %q: %v: %w", addr, err, transport.ErrInvalidArgument)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return ss, fmt.Errorf("ibverbs: address %q: bad port: %w", addr, transport.ErrInvalidArgument)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return ss, fmt.Errorf("ibverbs: address %q: cannot resolve host: %w", addr, transport.ErrNotFound)
		}
		ip = ips[0]
	}
	raw := []byte(ip.To16())
	if v4 := ip.To4(); v4 != nil {
		raw = []byte(v4)
	}
	C.gosrp_sockaddr(&ss, (*C.uint8_t)(&raw[0]), C.int(len(raw)), C.int(port))
	return ss, nil
}

func sa(ss *C.struct_sockaddr_storage) *C.struct_sockaddr {
	return (*C.struct_sockaddr)(unsafe.Pointer(ss))
}

// timeoutMS is the rdma_resolve_* timeout: the context's remaining time,
// clamped to [100 ms, 10 s], 2 s without a deadline.
func timeoutMS(ctx context.Context) C.int {
	d := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = min(max(time.Until(dl), 100*time.Millisecond), 10*time.Second)
	}
	return C.int(d / time.Millisecond)
}

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
	ss, err := sockaddr(addr)
	if err != nil {
		return nil, err
	}
	cid, err := c.newID()
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
	q, ok := qp.(*QP)
	if !ok || q.d != r.dev {
		return nil, fmt.Errorf("ibverbs: accept: QP must be on device %s: %w", r.dev.name, transport.ErrInvalidArgument)
	}
	if len(privateData) > transport.MaxAcceptPrivateData {
		return nil, fmt.Errorf("ibverbs: accept: %d bytes of private data (max %d): %w", len(privateData), transport.MaxAcceptPrivateData, transport.ErrInvalidArgument)
	}
	if st := q.State(); st != transport.QPReset && st != transport.QPInit {
		return nil, fmt.Errorf("ibverbs: accept: QP %d in %s: %w", q.num, st, transport.ErrInvalidState)
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	respRes := min(r.initDepth, r.dev.maxRdAtom)
	initDepth := min(r.respRes, r.dev.maxInitRdAtom)
	fail := func(err error) (transport.Conn, error) {
		C.rdma_reject(r.cid.id, nil, 0)
		r.cid.destroy()
		q.toErr()
		return nil, err
	}
	if err := q.cmModify(r.cid.id, transport.QPInit, -1); err != nil {
		return fail(err)
	}
	if err := q.cmModify(r.cid.id, transport.QPRTR, respRes); err != nil {
		return fail(err)
	}
	if err := q.cmModify(r.cid.id, transport.QPRTS, initDepth); err != nil {
		return fail(err)
	}
	var param C.struct_rdma_conn_param
	cpd := cBytes(privateData)
	defer C.free(cpd)
	C.gosrp_conn_param(&param, cpd, C.int(len(privateData)), C.int(respRes), C.int(initDepth), C.uint32_t(q.num), C.int(r.cid.c.p.retry), C.int(r.cid.c.p.rnrRetry))
	if rc, err := C.rdma_accept(r.cid.id, &param); rc != 0 {
		return fail(mapErrno("rdma_accept", kindCM, errnoOf(err)))
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
			return r.cid.attach(q, r.pd, r.local, r.remote), nil
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

// Endpoint is a resolved active-side rdma_cm_id.
type Endpoint struct {
	cid    *cmID
	dev    *Device
	remote string
	mu     sync.Mutex
	used   bool
}

var _ transport.Endpoint = (*Endpoint)(nil)

func (c *cmChannel) resolve(ctx context.Context, addr string) (*Endpoint, error) {
	ss, err := sockaddr(addr)
	if err != nil {
		return nil, err
	}
	cid, err := c.newID()
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
	return &Endpoint{cid: cid, dev: dev, remote: addr}, nil
}

// Device is the device that reaches the target.
func (ep *Endpoint) Device() transport.Device { return ep.dev }

// IB CM reject reason "consumer defined": the peer called rdma_reject.
const rejConsumer = 28

// Connect connects qp (RESET or INIT) in manual-QP mode: INIT, then
// rdma_connect with qp_num; on CONNECT_RESPONSE, RTR and RTS with
// rdma_cm's attributes and rdma_establish.
func (ep *Endpoint) Connect(ctx context.Context, qp transport.QP, privateData []byte) (transport.Conn, error) {
	q, ok := qp.(*QP)
	if !ok || q.d != ep.dev {
		return nil, fmt.Errorf("ibverbs: connect: QP must be on device %s: %w", ep.dev.name, transport.ErrInvalidArgument)
	}
	if len(privateData) > transport.MaxConnectPrivateData {
		return nil, fmt.Errorf("ibverbs: connect: %d bytes of private data (max %d): %w", len(privateData), transport.MaxConnectPrivateData, transport.ErrInvalidArgument)
	}
	if st := q.State(); st != transport.QPReset && st != transport.QPInit {
		return nil, fmt.Errorf("ibverbs: connect: QP %d in %s: %w", q.num, st, transport.ErrInvalidState)
	}
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
	respRes := min(ep.dev.maxRdAtom, 16)
	initDepth := min(ep.dev.maxInitRdAtom, 16)
	var param C.struct_rdma_conn_param
	cpd := cBytes(privateData)
	defer C.free(cpd)
	C.gosrp_conn_param(&param, cpd, C.int(len(privateData)), C.int(respRes), C.int(initDepth), C.uint32_t(q.num), C.int(cid.c.p.retry), C.int(cid.c.p.rnrRetry))
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
			resp := min(respRes, max(e.initDepth, 0))
			if err := q.cmModify(cid.id, transport.QPInit, -1); err != nil {
				return ep.abort(q, err)
			}
			if err := q.cmModify(cid.id, transport.QPRTR, resp); err != nil {
				return ep.abort(q, err)
			}
			if err := q.cmModify(cid.id, transport.QPRTS, min(initDepth, e.respRes)); err != nil {
				return ep.abort(q, err)
			}
			if rc, err := C.rdma_establish(cid.id); rc != 0 {
				return ep.abort(q, mapErrno("rdma_establish", kindCM, errnoOf(err)))
			}
			return cid.attach(q, e.pd, localAddr(cid.id), peerAddr(cid.id)), nil
		case C.RDMA_CM_EVENT_ESTABLISHED:
			return cid.attach(q, e.pd, localAddr(cid.id), peerAddr(cid.id)), nil
		case C.RDMA_CM_EVENT_REJECTED:
			if e.status == rejConsumer {
				return fail(&transport.RejectError{PrivateData: e.pd})
			}
			return fail(fmt.Errorf("ibverbs: connect %s: rejected by the CM (reason %d, no listener?): %w", ep.remote, e.status, transport.ErrNotFound))
		case C.RDMA_CM_EVENT_UNREACHABLE, C.RDMA_CM_EVENT_CONNECT_ERROR:
			return fail(fmt.Errorf("ibverbs: connect %s: %s (status %d): %w", ep.remote, eventName(e.typ), e.status, transport.ErrNotFound))
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			return fail(fmt.Errorf("ibverbs: connect %s: %s: %w", ep.remote, eventName(e.typ), transport.ErrDisconnected))
		}
	}
}

func (ep *Endpoint) abort(q *QP, err error) (transport.Conn, error) {
	C.rdma_reject(ep.cid.id, nil, 0)
	ep.cid.destroy()
	q.toErr()
	return nil, err
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
func (cid *cmID) attach(q *QP, pd []byte, local, remote string) *Conn {
	c := &Conn{cid: cid, qp: q, pd: pd, local: local, remote: remote, done: make(chan struct{})}
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
