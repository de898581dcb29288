// Package targettest is a hostile-peer kit: it turns any target built on
// the verbs contract (package target, or an embedder's own) into one that
// attacks its initiators, for the project's tests and for its users'.
//
// Wrap the provider the target serves on:
//
//	h := targettest.Wrap(prov, targettest.Script{
//		Respond: func(r *targettest.Response) targettest.Action {
//			// r.Key is the key the target invalidates with, r.Descriptors
//			// every (rkey, va, len) the initiators ever handed it.
//			r.WR.InvalidateKey = r.Key.Bump() // invalidate the wrong key
//			return targettest.Pass
//		},
//	})
//	tgt.Serve(ctx, mustListen(h.Listen(ctx, "")))
//
// The target runs unchanged; the kit sits between it and the verbs layer.
// It records every descriptor the target uses for data movement (the
// RDMA READ or WRITE's remote key, address and length: exactly what an
// initiator handed out), and before each response the target posts it
// calls Script.Respond, which may rewrite the response (another key to
// invalidate, a SEND without invalidation), drop it, send it twice, or
// end the connection. A response is the moment an I/O's key is live and
// about to be invalidated, the moment a hostile target would fire its
// strays: Response.Descriptors hands them over, and on the software NIC
// emu.Provider.Probe fires one at the initiator's QP without a wire,
// completion or state change on either side.
package targettest

import (
	"context"
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// Descriptor is one (rkey, va, length) an initiator handed the target.
type Descriptor struct {
	RKey transport.Key
	VA   uint64
	Len  uint32
}

// Action is what happens to a response.
type Action int

const (
	// Pass posts the response (as Respond may have changed it).
	Pass Action = iota
	// Drop never posts it; the initiator's I/O stays outstanding.
	Drop
	// Duplicate posts it twice: the second names a completed request.
	Duplicate
	// Disconnect ends the connection instead of answering.
	Disconnect
)

// Response is one response the target is about to post.
type Response struct {
	// WR is the SEND or SEND_WITH_INV; Respond may change its opcode and
	// InvalidateKey.
	WR *transport.SendWR
	// Key is the key the target meant to invalidate (zero for a plain
	// SEND).
	Key transport.Key
	// Login reports a login response: the connection is not yet in use.
	Login bool
	// QP is the target's QP the response goes out on.
	QP transport.QP
	// Descriptors are all the descriptors recorded so far, oldest first;
	// the slice is the kit's, valid during the call.
	Descriptors []Descriptor
	// N counts responses, from 1, across all connections.
	N int
}

// Script is a hostile target's behaviour. A nil Respond passes every
// response unchanged.
type Script struct {
	Respond func(*Response) Action
}

// Hostile is a transport.Provider whose targets follow a Script.
type Hostile struct {
	transport.Provider
	script Script

	mu    sync.Mutex
	descs []Descriptor
	n     int
	devs  map[transport.Device]*device
}

// Wrap returns p with its targets' responses under s.
func Wrap(p transport.Provider, s Script) *Hostile {
	return &Hostile{Provider: p, script: s, devs: map[transport.Device]*device{}}
}

// Descriptors returns a copy of every descriptor recorded so far.
func (h *Hostile) Descriptors() []Descriptor {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Descriptor(nil), h.descs...)
}

func (h *Hostile) device(d transport.Device) *device {
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok := h.devs[d]
	if !ok {
		w = &device{Device: d, h: h}
		h.devs[d] = w
	}
	return w
}

// OpenDevice returns the wrapped device.
func (h *Hostile) OpenDevice(name string) (transport.Device, error) {
	d, err := h.Provider.OpenDevice(name)
	if err != nil {
		return nil, err
	}
	return h.device(d), nil
}

// Listen returns a listener whose connection requests hand out wrapped
// devices.
func (h *Hostile) Listen(ctx context.Context, addr string) (transport.Listener, error) {
	l, err := h.Provider.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: l, h: h}, nil
}

type listener struct {
	transport.Listener
	h *Hostile
}

func (l *listener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &connReq{ConnRequest: r, h: l.h}, nil
}

type connReq struct {
	transport.ConnRequest
	h *Hostile
}

func (r *connReq) Device() transport.Device { return r.h.device(r.ConnRequest.Device()) }

func (r *connReq) Accept(ctx context.Context, q transport.QP, priv []byte) (transport.Conn, error) {
	w, ok := q.(*qp)
	if !ok {
		return r.ConnRequest.Accept(ctx, q, priv)
	}
	c, err := r.ConnRequest.Accept(ctx, w.QP, priv)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.conn = c
	w.mu.Unlock()
	return &conn{Conn: c, q: w}, nil
}

type conn struct {
	transport.Conn
	q *qp
}

func (c *conn) QP() transport.QP { return c.q }

type device struct {
	transport.Device
	h *Hostile
}

func (d *device) AllocPD() (transport.PD, error) {
	p, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &pd{PD: p, h: d.h, mrs: map[transport.Key]transport.MR{}}, nil
}

type pd struct {
	transport.PD
	h   *Hostile
	mu  sync.Mutex
	mrs map[transport.Key]transport.MR // by lkey, to read the IUs the target sends
}

func (p *pd) RegMR(a *transport.Arena, off, length int, access transport.Access) (transport.MR, error) {
	m, err := p.PD.RegMR(a, off, length, access)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.mrs[m.LKey()] = m
	p.mu.Unlock()
	return &mr{MR: m, pd: p}, nil
}

type mr struct {
	transport.MR
	pd *pd
}

func (m *mr) Close() error {
	m.pd.mu.Lock()
	delete(m.pd.mrs, m.MR.LKey())
	m.pd.mu.Unlock()
	return m.MR.Close()
}

func (p *pd) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	q, err := p.PD.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return &qp{QP: q, pd: p}, nil
}

type qp struct {
	transport.QP
	pd *pd

	mu    sync.Mutex
	conn  transport.Conn
	chain []transport.SendWR
}

// login reports whether a SEND carries a login response.
func (q *qp) login(wr *transport.SendWR) bool {
	if len(wr.SGL) == 0 {
		return false
	}
	s := wr.SGL[0]
	q.pd.mu.Lock()
	m := q.pd.mrs[s.LKey]
	q.pd.mu.Unlock()
	if m == nil || s.Addr < m.Addr() || s.Addr+uint64(s.Length) > m.Addr()+uint64(m.Len()) {
		return false
	}
	off := int(s.Addr-m.Addr()) + int(m.Addr()-m.Arena().Addr())
	op, err := wire.PeekOpcode(m.Arena().Bytes()[off : off+int(s.Length)])
	return err == nil && op == wire.OpLoginResponse
}

// PostSend records the data movement, runs the script on each response
// and posts what it decided. Counts returned are of the target's own WRs,
// so its bad_wr accounting still holds.
func (q *qp) PostSend(wrs []transport.SendWR) (int, error) {
	h := q.pd.h
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.chain[:0]
	index := make([]int, 0, len(wrs)) // out position of each wrs[i], -1 if dropped
	disconnect := false
	for i := range wrs {
		wr := wrs[i]
		switch wr.Opcode {
		case transport.OpRDMARead, transport.OpRDMAWrite:
			var n uint32
			for _, s := range wr.SGL {
				n += s.Length
			}
			h.mu.Lock()
			h.descs = append(h.descs, Descriptor{RKey: wr.RKey, VA: wr.RemoteAddr, Len: n})
			h.mu.Unlock()
		case transport.OpSend, transport.OpSendWithInv:
			if h.script.Respond == nil || disconnect {
				break
			}
			r := &Response{WR: &wr, QP: q, Login: q.login(&wr)}
			if wr.Opcode == transport.OpSendWithInv {
				r.Key = wr.InvalidateKey
			}
			h.mu.Lock()
			h.n++
			r.N = h.n
			r.Descriptors = h.descs
			h.mu.Unlock()
			switch h.script.Respond(r) {
			case Drop:
				index = append(index, -1)
				continue
			case Duplicate:
				out = append(out, wr)
			case Disconnect:
				disconnect = true
				index = append(index, -1)
				continue
			}
		}
		index = append(index, len(out))
		out = append(out, wr)
	}
	q.chain = out[:0]
	if disconnect {
		// As if the connection died under the target: nothing of this
		// chain is accepted, so the target waits for nothing it posted.
		q.QP.Modify(transport.QPErr)
		if q.conn != nil {
			q.conn.Disconnect()
		}
		return 0, fmt.Errorf("targettest: the script ended the connection: %w", transport.ErrInvalidState)
	}
	n, err := q.QP.PostSend(out)
	if n == len(out) {
		return len(wrs), err
	}
	// Map the failure back onto the target's own chain.
	for i, j := range index {
		if j >= n {
			return i, err
		}
	}
	return len(wrs), err
}
