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
// end the connection; Response.IU hands over the bytes of the response
// itself, to lie in its content (a tag, a credit count, a residual), and
// Script.Accept the private data of each accept, where T10 SRP's login
// response travels. A response is the moment an I/O's key is live and
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
	// Fresh reports that descriptors were recorded since the previous
	// response: at queue depth 1, the last of Descriptors is the live
	// key of the I/O this response answers. Key says the same only when
	// the initiator asked for remote invalidation, which it does not on
	// every device (initiator.Config.NoRemoteInvalidate).
	Fresh bool
	// N counts responses, from 1, across all connections.
	N int

	sends [][]byte
}

// Send has the kit post iu, a request of the target's own (T10 SRP's
// SRP_CRED_REQ or SRP_AER_REQ, say), on the response's QP just ahead of
// the response, unless Respond ends the connection. iu is copied, up to
// MaxSendIU bytes; the kit's QPs have room for SendRoom such requests in
// flight. Their send completions never reach the target, and
// Script.Swallow can keep the initiator's answers from it too.
func (r *Response) Send(iu []byte) error {
	if len(iu) > MaxSendIU {
		return fmt.Errorf("targettest: an IU of %d bytes to send (at most %d): %w", len(iu), MaxSendIU, transport.ErrInvalidArgument)
	}
	r.sends = append(r.sends, append([]byte(nil), iu...))
	return nil
}

// MaxSendIU is the largest IU Response.Send takes; SendRoom is how many
// of them may be in flight on a QP: the kit's QPs and CQs are that much
// deeper than the target asked, as far as the device allows.
const (
	MaxSendIU = 256
	SendRoom  = 64
)

// IU returns the bytes of the response's information unit (the first
// gather entry of its SEND), which Respond may rewrite in place before
// the response is posted: another tag, credit count, status or length
// field, a target request in place of a response. Its length is the
// SEND's and cannot change. Nil if the entry lies in no memory region the
// target registered. The bytes are the target's send buffer, valid
// during the call.
func (r *Response) IU() []byte {
	q, ok := r.QP.(*qp)
	if !ok || len(r.WR.SGL) == 0 {
		return nil
	}
	return q.bytes(r.WR.SGL[0])
}

// Script is a hostile target's behaviour. A nil Respond passes every
// response unchanged; a nil Accept leaves the private data of every
// accept as the target wrote it.
type Script struct {
	Respond func(*Response) Action
	// Accept, if set, may rewrite the private data the target accepts a
	// connection with (a copy, which it returns, changed or not): where
	// a login response travels in the connection exchange itself, as
	// T10 SRP's SRP_LOGIN_RSP over RDMA-CM does, this is the login.
	Accept func(priv []byte) []byte
	// Request, if set, sees each connection request's private data
	// (the login request; valid during the call) before the target
	// does; refuse true rejects the request with reject as the private
	// data, and the target never sees it: a target that refuses some
	// logins (an SRP_LOGIN_REJ in the CM reject) and takes others.
	Request func(priv []byte) (reject []byte, refuse bool)
	// Swallow, if set, sees every IU the target receives before the
	// target does (the bytes, valid during the call); true takes it away:
	// the target never sees it and the kit reposts the receive for it.
	// False hands the target the bytes as Swallow left them: a rewrite
	// in place is what the target receives (a command it then runs
	// otherwise than the initiator asked).
	// A script that sends requests of its own (Response.Send) takes
	// their answers so.
	Swallow func(iu []byte) bool
	// Write, if set, sees the bytes of each RDMA WRITE the target posts
	// (its first gather entry: the data a READ or a SCSI data-in command
	// returns) and may rewrite them in place before they go: an
	// INQUIRY page, a REPORT TARGET PORT GROUPS list or a READ CAPACITY
	// the initiator then parses. Their length cannot change (a
	// response's residual, through Respond, can make them look
	// shorter). The bytes are the target's buffer, valid during the
	// call; nil if the entry lies in no region the target registered.
	Write func(data []byte)
}

// Hostile is a transport.Provider whose targets follow a Script.
type Hostile struct {
	transport.Provider
	script Script

	mu       sync.Mutex
	descs    []Descriptor
	answered int // len(descs) at the last response (Response.Fresh)
	n        int
	devs     map[transport.Device]*device
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
		w = &device{Device: d, h: h, qps: map[uint32]*qp{}}
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
	for {
		r, err := l.Listener.Accept(ctx)
		if err != nil {
			return nil, err
		}
		if f := l.h.script.Request; f != nil {
			if rej, refuse := f(r.PrivateData()); refuse {
				_ = r.Reject(rej) // the requester sees the reject or a lost request; either is a refusal
				continue
			}
		}
		return &connReq{ConnRequest: r, h: l.h}, nil
	}
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
	if f := r.h.script.Accept; f != nil {
		priv = f(append([]byte(nil), priv...))
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

	mu  sync.Mutex
	qps map[uint32]*qp // by QP number (unique on the device), for Swallow
}

// CreateCQ returns a CQ with room for the kit's own sends, whose
// completions (and the receives Script.Swallow takes) it keeps from the
// target.
func (d *device) CreateCQ(depth int) (transport.CQ, error) {
	c, err := d.Device.CreateCQ(max(depth, min(depth+SendRoom, d.Attr().MaxCQE)))
	if err != nil {
		return nil, err
	}
	w := &cq{CQ: c, d: d}
	if n, ok := c.(transport.CQNotifier); ok {
		return &notifyCQ{cq: w, n: n}, nil
	}
	return w, nil
}

// injectID marks the work request IDs of the kit's own sends.
const injectID = 0x7e57 << 48

type cq struct {
	transport.CQ
	d *device
}

type notifyCQ struct {
	*cq
	n transport.CQNotifier
}

func (c *notifyCQ) Notify() <-chan struct{} { return c.n.Notify() }

// under is the device's CQ under the kit's (a notifyCQ's too).
func (c *cq) under() transport.CQ { return c.CQ }

// unwrapCQ is the device's CQ under a kit one, for the device.
func unwrapCQ(c transport.CQ) transport.CQ {
	if w, ok := c.(interface{ under() transport.CQ }); ok {
		return w.under()
	}
	return c
}

// Poll polls the CQ and takes out the kit's own: its sends' completions
// and the receives Script.Swallow took (reposted here).
func (c *cq) Poll(wcs []transport.WC) (int, error) {
	n, err := c.CQ.Poll(wcs)
	k := 0
	for i := range n {
		wc := wcs[i]
		if wc.ID>>48 == injectID>>48 && wc.Opcode != transport.WCRecv {
			continue
		}
		if wc.Opcode == transport.WCRecv && wc.Status == transport.StatusSuccess && c.d.swallow(&wc) {
			continue
		}
		wcs[k] = wc
		k++
	}
	return k, err
}

// swallow reports whether Script.Swallow took the receive wc completes,
// and reposts it if so.
func (d *device) swallow(wc *transport.WC) bool {
	h := d.h
	if h.script.Swallow == nil {
		return false
	}
	d.mu.Lock()
	q := d.qps[wc.QPNum]
	d.mu.Unlock()
	if q == nil {
		return false
	}
	q.rmu.Lock()
	wr, ok := q.recvs[wc.ID]
	q.rmu.Unlock()
	if !ok || len(wr.SGL) == 0 {
		return false
	}
	b := q.bytes(wr.SGL[0])
	if b == nil || int(wc.ByteLen) > len(b) || !h.script.Swallow(b[:wc.ByteLen]) {
		return false
	}
	_, _ = q.PostRecv([]transport.RecvWR{wr}) // a dead QP flushes it, as it would the target's
	return true
}

func (d *device) AllocPD() (transport.PD, error) {
	p, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &pd{PD: p, h: d.h, dev: d, mrs: map[transport.Key]transport.MR{}}, nil
}

type pd struct {
	transport.PD
	h   *Hostile
	dev *device
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
	// The device takes only its own CQs: the kit's wrappers are for the
	// target's polls.
	cfg.SendCQ, cfg.RecvCQ = unwrapCQ(cfg.SendCQ), unwrapCQ(cfg.RecvCQ)
	cfg.MaxSendWR = max(cfg.MaxSendWR, min(cfg.MaxSendWR+SendRoom, p.dev.Attr().MaxQPWR))
	q, err := p.PD.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	w := &qp{QP: q, pd: p, recvs: map[uint64]transport.RecvWR{}}
	p.dev.mu.Lock()
	p.dev.qps[q.Num()] = w
	p.dev.mu.Unlock()
	return w, nil
}

type qp struct {
	transport.QP
	pd *pd

	mu    sync.Mutex
	conn  transport.Conn
	chain []transport.SendWR
	// The kit's own sends: a ring of MaxSendIU-byte buffers registered
	// on the first, and the count of sends so far.
	ring    *transport.Arena
	ringMR  transport.MR
	ringSGE []transport.SGE
	sent    uint64

	rmu   sync.Mutex
	recvs map[uint64]transport.RecvWR // the target's receives, by ID, to repost one Swallow took
}

// ringLen is how many buffers the ring of the kit's sends has: more
// than SendRoom, so none is rewritten while its send may be in flight.
const ringLen = 2 * SendRoom

// PostRecv records the target's receives, then posts them.
func (q *qp) PostRecv(wrs []transport.RecvWR) (int, error) {
	if q.pd.h.script.Swallow != nil {
		q.rmu.Lock()
		for _, wr := range wrs {
			wr.SGL = append([]transport.SGE(nil), wr.SGL...)
			q.recvs[wr.ID] = wr
		}
		q.rmu.Unlock()
	}
	return q.QP.PostRecv(wrs)
}

// Close forgets the QP and releases the kit's ring with it.
func (q *qp) Close() error {
	d := q.pd.dev
	d.mu.Lock()
	if d.qps[q.Num()] == q {
		delete(d.qps, q.Num())
	}
	d.mu.Unlock()
	err := q.QP.Close()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring != nil {
		q.ringMR.Close()
		q.ring.Close()
		q.ring = nil
	}
	return err
}

// inject is the SEND of one of the kit's own IUs (q.mu held).
func (q *qp) inject(iu []byte) (transport.SendWR, error) {
	if q.ring == nil {
		a, err := transport.NewArena(ringLen*MaxSendIU, transport.ArenaOptions{})
		if err != nil {
			return transport.SendWR{}, err
		}
		m, err := q.pd.PD.RegMR(a, 0, a.Len(), transport.AccessLocalWrite)
		if err != nil {
			a.Close()
			return transport.SendWR{}, err
		}
		q.ring, q.ringMR, q.ringSGE = a, m, make([]transport.SGE, ringLen)
	}
	i := int(q.sent % ringLen)
	q.sent++
	copy(q.ring.Bytes()[i*MaxSendIU:], iu)
	q.ringSGE[i] = transport.SGE{Addr: q.ringMR.Addr() + uint64(i*MaxSendIU), Length: uint32(len(iu)), LKey: q.ringMR.LKey()}
	return transport.SendWR{ID: injectID | q.sent, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: q.ringSGE[i : i+1]}, nil
}

// bytes returns the memory a gather entry of the target's names, nil if
// it lies in no region the target registered.
func (q *qp) bytes(s transport.SGE) []byte {
	q.pd.mu.Lock()
	m := q.pd.mrs[s.LKey]
	q.pd.mu.Unlock()
	if m == nil || s.Addr < m.Addr() || s.Addr+uint64(s.Length) > m.Addr()+uint64(m.Len()) {
		return nil
	}
	off := int(s.Addr-m.Addr()) + int(m.Addr()-m.Arena().Addr())
	return m.Arena().Bytes()[off : off+int(s.Length)]
}

// login reports whether a SEND carries a gosrp login response.
func (q *qp) login(wr *transport.SendWR) bool {
	if len(wr.SGL) == 0 {
		return false
	}
	b := q.bytes(wr.SGL[0])
	if b == nil {
		return false
	}
	op, err := wire.PeekOpcode(b)
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
			if wr.Opcode == transport.OpRDMAWrite && h.script.Write != nil && len(wr.SGL) > 0 {
				h.script.Write(q.bytes(wr.SGL[0]))
			}
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
			r.Fresh = len(h.descs) > h.answered
			h.answered = len(h.descs)
			h.mu.Unlock()
			act := h.script.Respond(r)
			if act != Disconnect {
				for _, iu := range r.sends {
					if iwr, err := q.inject(iu); err == nil {
						out = append(out, iwr)
					}
				}
			}
			switch act {
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
