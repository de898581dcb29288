//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

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

	// ops counts the calls under way that use the channel's ids (a
	// resolve, a listen, a Connect, an Accept, a Reject); once closing,
	// begin refuses new ones. close waits for ops to end before it
	// destroys the ids: rdma_cm frees a destroyed id, and a call on it
	// after that is a use after free. A Connect whose wait the close
	// ended went on to rdma_disconnect its id, freed meanwhile: SIGSEGV
	// (transporttest's CM/ProviderClose).
	opMu    sync.Mutex
	opsDone sync.Cond
	ops     int
	closing bool
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
	fd, err := newStopFD()
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	c := &cmChannel{p: p, ch: ch, stopFD: fd, done: make(chan struct{}), ids: map[uintptr]*cmID{}}
	c.opsDone.L = &c.opMu
	go c.loop()
	return c, nil
}

// begin counts a call that uses the channel's ids, or refuses it once
// the channel is closing; end ends it.
func (c *cmChannel) begin() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.closing {
		return fmt.Errorf("ibverbs: rdma_cm: %w", transport.ErrClosed)
	}
	c.ops++
	return nil
}

func (c *cmChannel) end() {
	c.opMu.Lock()
	if c.ops--; c.ops == 0 {
		c.opsDone.Broadcast()
	}
	c.opMu.Unlock()
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
	var ev C.struct_gosrp_cm_event
	readEvents(int(c.ch.fd), c.stopFD, c.done, func() {
		for C.gosrp_get_cm_event(c.ch, &ev) == 0 {
			c.dispatch(&ev)
		}
	})
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

// close refuses new calls, ends the event loop (which ends every wait
// for an event: cmID.wait), waits for the calls under way to end, then
// destroys every id and the channel.
func (c *cmChannel) close() {
	c.opMu.Lock()
	c.closing = true
	c.opMu.Unlock()
	stopEvents(c.stopFD, c.done)
	c.opMu.Lock()
	for c.ops > 0 {
		c.opsDone.Wait()
	}
	c.opMu.Unlock()
	c.mu.Lock()
	all := slices.Collect(maps.Values(c.ids))
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

// newIDAt parses addr (sockaddr) and creates an id to resolve or bind
// it with; the caller destroys the id.
func (c *cmChannel) newIDAt(addr string) (*cmID, C.struct_sockaddr_storage, error) {
	ss, err := sockaddr(addr)
	if err != nil {
		return nil, ss, err
	}
	cid, err := c.newID()
	return cid, ss, err
}

// connQP is the check Connect and Accept (op) make of the QP they are
// handed: one of this package's on dev, in RESET or INIT (manual-QP mode
// moves it on from there), with at most max bytes of private data.
func connQP(op string, qp transport.QP, dev *Device, privateData []byte, max int) (*QP, error) {
	q, ok := qp.(*QP)
	if !ok || q.d != dev {
		return nil, fmt.Errorf("ibverbs: %s: QP must be on device %s: %w", op, dev.name, transport.ErrInvalidArgument)
	}
	if len(privateData) > max {
		return nil, fmt.Errorf("ibverbs: %s: %d bytes of private data (max %d): %w", op, len(privateData), max, transport.ErrInvalidArgument)
	}
	if st := q.State(); st != transport.QPReset && st != transport.QPInit {
		return nil, fmt.Errorf("ibverbs: %s: QP %d in %s: %w", op, q.num, st, transport.ErrInvalidState)
	}
	return q, nil
}

// toRTS moves q INIT -> RTR -> RTS with the attributes rdma_cm has for
// the connection of id, as librdmacm's ucma_modify_qp_rtr and
// ucma_modify_qp_rts do: resp READs the peer may have outstanding at us
// (RTR), out ours at the peer (RTS).
func (q *QP) toRTS(id *C.struct_rdma_cm_id, resp, out int) error {
	if err := q.cmModify(id, transport.QPInit, -1); err != nil {
		return err
	}
	if err := q.cmModify(id, transport.QPRTR, resp); err != nil {
		return err
	}
	return q.cmModify(id, transport.QPRTS, out)
}

// connParam fills param for rdma_connect or rdma_accept of q with
// privateData and the READ figures (responder_resources, initiator_depth);
// the caller frees the returned copy of privateData once the call is made.
func (cid *cmID) connParam(param *C.struct_rdma_conn_param, q *QP, privateData []byte, respRes, initDepth int) unsafe.Pointer {
	cpd := cBytes(privateData)
	C.gosrp_conn_param(param, cpd, C.int(len(privateData)), C.int(respRes), C.int(initDepth), C.uint32_t(q.num), C.int(cid.c.p.retry), C.int(cid.c.p.rnrRetry))
	return cpd
}

// refuse gives up on a connection the CM has begun, QP included: it
// rejects, destroys the id and moves q to ERR.
func (cid *cmID) refuse(q *QP, err error) (transport.Conn, error) {
	C.rdma_reject(cid.id, nil, 0)
	cid.destroy()
	q.toErr()
	return nil, err
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
