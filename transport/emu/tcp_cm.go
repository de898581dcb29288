package emu

// The tcp wire's connection management: its listener and the messages
// of its connection setup (tcpWire), which the stream wires' shared path
// (stream.go) runs.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// tcpListener and tcpReq are the tcp wire's listener and connection
// request.
type (
	tcpListener = streamListener[tcpWire]
	tcpReq      = streamReq[tcpWire]
)

func (p *Provider) listenTCP(ctx context.Context, addr string) (transport.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emu: listen on %s: %w", addr, err)
	}
	l, err := p.serveTCP(ln)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// serveTCP starts accepting connection requests on ln.
func (p *Provider) serveTCP(ln net.Listener) (*tcpListener, error) {
	return serveStream[tcpWire](p, ln, ln, ln.Addr().String())
}

// tcpWire is the tcp wire's part of connection setup: a CM message is a
// frame header (cmReq, cmRep, cmRej) followed by the private data.
type tcpWire struct{}

func (tcpWire) network() string { return "tcp" }

func (tcpWire) remote(nc net.Conn) string { return nc.RemoteAddr().String() }

func (tcpWire) readRequest(p *Provider, nc net.Conn) ([]byte, transport.ReadCredit, error) {
	var hb [headerLen]byte
	var h header
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		return nil, transport.ReadCredit{}, err
	}
	if err := decodeHeader(hb[:], &h); err != nil || h.kind != cmReq {
		p.counters.badFrms.Add(1)
		p.log.Warn("dropping connection with a bad connect request", "remote", nc.RemoteAddr().String(), "err", err, "kind", h.kind)
		if err == nil {
			err = fmt.Errorf("%w: %s instead of a connect request", errBadFrame, h.kind)
		}
		return nil, transport.ReadCredit{}, err
	}
	priv := make([]byte, h.paylen)
	if _, err := io.ReadFull(nc, priv); err != nil {
		return nil, transport.ReadCredit{}, err
	}
	return priv, getCredit(h.imm), nil
}

func (tcpWire) accept(ctx context.Context, r *sockReq, q *qp, priv []byte) (transport.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		r.nc.SetWriteDeadline(dl)
	}
	if err := writeCM(r.nc, cmRep, priv, r.credit); err != nil {
		r.nc.Close()
		return nil, fmt.Errorf("emu: accept: %w", err)
	}
	r.nc.SetWriteDeadline(time.Time{})
	return startTCP(r.p, q, r.nc, r.priv, r.credit)
}

func (tcpWire) writeReject(nc net.Conn, priv []byte) error {
	return writeCM(nc, cmRej, priv, transport.ReadCredit{})
}

func (tcpWire) writeRequest(nc net.Conn, priv []byte, offer transport.ReadCredit) error {
	return writeCM(nc, cmReq, priv, offer)
}

func (tcpWire) readAnswer(ctx context.Context, p *Provider, nc net.Conn, addr string) (streamAnswer, error) {
	var hb [headerLen]byte
	var h header
	n, err := io.ReadFull(nc, hb[:])
	if n >= 2 && binary.LittleEndian.Uint16(hb[:]) != frameMagic {
		// Not an emu peer at all: whatever listens there said something
		// else, in full or before it hung up.
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: %w", addr, &transport.ForeignPeerError{Answer: bytes.Clone(hb[:min(n, 16)])})
	}
	if err != nil {
		if ctx.Err() != nil {
			return streamAnswer{}, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
		}
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: no answer: %w: %w", addr, transport.ErrDisconnected, err)
	}
	if err := decodeHeader(hb[:], &h); err != nil || (h.kind != cmRep && h.kind != cmRej) {
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: bad answer (%v, kind %s): %w", addr, err, h.kind, transport.ErrDisconnected)
	}
	rp := make([]byte, h.paylen)
	if _, err := io.ReadFull(nc, rp); err != nil {
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: %w", addr, err)
	}
	if h.kind == cmRej {
		return streamAnswer{}, &transport.RejectError{PrivateData: rp}
	}
	return streamAnswer{priv: rp, credit: getCredit(h.imm)}, nil
}

func (tcpWire) release(streamAnswer) {}

func (tcpWire) start(p *Provider, q *qp, nc net.Conn, a streamAnswer, _ string) (transport.Conn, error) {
	return startTCP(p, q, nc, a.priv, a.credit)
}

// writeCM writes a CM message of kind with private data priv and, on a
// request or an accept, the sender's READ credit.
func writeCM(nc net.Conn, kind pktKind, priv []byte, credit transport.ReadCredit) error {
	b := make([]byte, headerLen+len(priv))
	putHeader(b, &header{kind: kind, imm: uint32(putCredit(credit)), paylen: uint32(len(priv))})
	copy(b[headerLen:], priv)
	_, err := nc.Write(b)
	return err
}
