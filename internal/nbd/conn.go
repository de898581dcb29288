package nbd

// A connection: its state, its life from greeting to close.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// conn is one client connection.
type conn struct {
	s *Server
	// raw is the accepted connection: deadlines and forced closes go to
	// it. c is the stream the protocol runs on: raw, or the TLS
	// connection over it after NBD_OPT_STARTTLS (swapped by the serving
	// goroutine during negotiation, before the writer exists).
	raw    net.Conn
	c      net.Conn
	id     uint64
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	stopping atomic.Bool
	br       *bufio.Reader
	bw       *bufio.Writer

	// negotiated: set during the handshake, read-only afterwards
	structured bool // NBD_OPT_STRUCTURED_REPLY acknowledged
	metaAlloc  bool // base:allocation selected by NBD_OPT_SET_META_CONTEXT
	tls        bool // NBD_OPT_STARTTLS done: c is a *tls.Conn

	// transmission phase
	b        Backend
	pool     BufferPool
	async    AsyncBackend
	size     uint64
	bs       uint64
	readOnly bool
	replies  chan *op
	slots    chan struct{}
	inflight sync.WaitGroup
	budget   budget
	werr     atomic.Pointer[error]
}

// stop makes the reader stop at the next request boundary (or now, if it
// waits for one).
func (c *conn) stop() {
	c.stopping.Store(true)
	c.raw.SetReadDeadline(time.Now())
}

func (c *conn) serve() {
	// Closing the TLS connection, once there is one, sends close_notify
	// first (proto.md: the server shuts TLS down before closing).
	defer func() { c.c.Close() }()
	c.br = bufio.NewReaderSize(c.c, 128<<10)
	c.bw = bufio.NewWriterSize(c.c, 128<<10)
	c.raw.SetDeadline(time.Now().Add(c.s.HandshakeTimeout))
	ok, err := c.handshake()
	if err != nil {
		if c.stopping.Load() {
			c.log.Debug("nbd: connection closed during negotiation: server shutting down")
		} else if isEOF(err) {
			c.log.Debug("nbd: client left during negotiation", "err", err)
		} else {
			c.log.Warn("nbd: closing connection during negotiation", "reason", err)
		}
		return
	}
	if !ok {
		return // NBD_OPT_ABORT
	}
	c.raw.SetDeadline(time.Time{})
	if c.stopping.Load() {
		c.raw.SetReadDeadline(time.Now())
	}
	c.transmit()
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
