package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Backend is the storage behind an export. ReadAt and WriteAt take any
// offset and length inside the export; Trim and WriteZeroes are only
// called with ranges aligned to BlockSize (the server trims the aligned
// middle of an unaligned TRIM and writes zeros at the edges of an
// unaligned WRITE_ZEROES). Flush makes every write that has completed
// durable. All methods are called concurrently, from many connections.
//
// An error is reported to the client as an errno: see Errno.
type Backend interface {
	Size() int64
	BlockSize() int
	ReadOnly() bool
	ReadAt(ctx context.Context, p []byte, off int64) error
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	Flush(ctx context.Context) error
	Trim(ctx context.Context, off, n int64) error
	WriteZeroes(ctx context.Context, off, n int64) error
}

// BufferPool is implemented by a Backend whose I/O is cheaper on buffers
// it hands out (registered memory, say). GetBuffer returns a slice of
// length n; PutBuffer gets back every buffer GetBuffer returned.
type BufferPool interface {
	GetBuffer(n int) []byte
	PutBuffer(b []byte)
}

// AsyncBackend is implemented by a Backend that can start reads and
// writes without blocking: the server then runs no goroutine per request,
// and a completion goes from the backend straight to the reply writer.
type AsyncBackend interface {
	// StartIO starts a read into p (write false) or a write from p at off
	// and reports true, or reports false when it cannot start this one
	// (too large, say): the server then calls ReadAt or WriteAt. A
	// started I/O calls done.Complete exactly once, from any goroutine;
	// Complete never blocks.
	StartIO(p []byte, off int64, write, fua bool, done Completion) bool
}

// Completion receives the outcome of an I/O an AsyncBackend started.
type Completion interface {
	Complete(err error)
}

// Export is the one export a Server offers.
type Export struct {
	// Name is the export name; the empty name (the default export) selects
	// it too.
	Name string
	// Description is shown by NBD_OPT_LIST and NBD_INFO_DESCRIPTION.
	Description string
	// Backend serves the I/O.
	Backend Backend
}

// Default limits.
const (
	// DefaultMaxPayload is the largest READ or WRITE accepted (and the
	// maximum block size advertised): the protocol's default, 32 MiB.
	DefaultMaxPayload = 32 << 20
	// DefaultMaxInFlight requests run at once per connection.
	DefaultMaxInFlight = 256
	// DefaultMaxBuffered bytes of READ and WRITE payload are held at once
	// per connection.
	DefaultMaxBuffered = 64 << 20
	// DefaultHandshakeTimeout bounds option haggling.
	DefaultHandshakeTimeout = 30 * time.Second
)

// Server serves one export over the NBD protocol: fixed newstyle
// negotiation (NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST,
// NBD_OPT_ABORT; others are refused with NBD_REP_ERR_UNSUP), simple
// replies, and READ, WRITE (with FUA), FLUSH, TRIM, WRITE_ZEROES (with
// NO_HOLE) and DISC. Requests of one connection run concurrently and are
// answered as they complete. Every connection shares the Backend, so the
// export advertises NBD_FLAG_CAN_MULTI_CONN.
type Server struct {
	Export Export
	// Logger receives connection events and errors. Default slog.Default().
	Logger *slog.Logger
	// MaxPayload, MaxInFlight, MaxBuffered and HandshakeTimeout default
	// to the constants above.
	MaxPayload       int
	MaxInFlight      int
	MaxBuffered      int64
	HandshakeTimeout time.Duration

	mu      sync.Mutex
	closing bool
	lns     map[net.Listener]struct{}
	conns   map[*conn]struct{}
	wg      sync.WaitGroup
	nextID  atomic.Uint64
	stats   Stats
	initErr error
	once    sync.Once
}

// Stats are cumulative counters of a Server.
type Stats struct {
	Conns, Requests, Errors atomic.Uint64
}

// Stats returns the server's counters.
func (s *Server) Stats() *Stats { return &s.stats }

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("nbd: server closed")

func (s *Server) init() error {
	s.once.Do(func() {
		if s.Logger == nil {
			s.Logger = slog.Default()
		}
		if s.MaxPayload <= 0 {
			s.MaxPayload = DefaultMaxPayload
		}
		if s.MaxInFlight <= 0 {
			s.MaxInFlight = DefaultMaxInFlight
		}
		if s.MaxBuffered <= 0 {
			s.MaxBuffered = DefaultMaxBuffered
		}
		if s.MaxBuffered < int64(s.MaxPayload) {
			s.MaxBuffered = int64(s.MaxPayload)
		}
		if s.HandshakeTimeout <= 0 {
			s.HandshakeTimeout = DefaultHandshakeTimeout
		}
		s.lns = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
		b := s.Export.Backend
		switch {
		case b == nil:
			s.initErr = errors.New("nbd: export has no backend")
		case b.BlockSize() <= 0 || b.BlockSize()&(b.BlockSize()-1) != 0:
			s.initErr = fmt.Errorf("nbd: block size %d is not a power of two", b.BlockSize())
		case b.Size() < 0:
			s.initErr = fmt.Errorf("nbd: negative export size %d", b.Size())
		case len(s.Export.Name) > maxExportNameLen:
			s.initErr = fmt.Errorf("nbd: export name longer than %d bytes", maxExportNameLen)
		}
	})
	return s.initErr
}

// Serve accepts connections on ln until Shutdown (then it returns
// ErrServerClosed) or an accept error.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.init(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.Logger.Warn("nbd: accept failed; retrying", "err", err, "in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		go s.ServeConn(c)
	}
}

// ServeConn serves one connection until the client disconnects, breaks
// the protocol, or the server shuts down; it closes c.
func (s *Server) ServeConn(c net.Conn) {
	if err := s.init(); err != nil {
		c.Close()
		s.Logger.Error("nbd: cannot serve", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cn := &conn{
		s: s, c: c, ctx: ctx, cancel: cancel,
		id: s.nextID.Add(1),
	}
	cn.log = s.Logger.With("conn", cn.id, "peer", peerName(c))
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		cancel()
		return
	}
	s.conns[cn] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	s.stats.Conns.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.conns, cn)
		s.mu.Unlock()
		cancel()
		s.wg.Done()
	}()
	cn.serve()
}

// Shutdown stops accepting, stops reading new requests, lets the requests
// in flight finish and be answered, and closes every connection. If ctx
// ends first, the remaining connections are closed at once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	s.mu.Lock()
	s.closing = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.stop()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.cancel()
			c.c.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

func peerName(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return a.String()
	}
	if a := c.LocalAddr(); a != nil {
		return "unix:" + a.String()
	}
	return "?"
}

// conn is one client connection.
type conn struct {
	s      *Server
	c      net.Conn
	id     uint64
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	stopping atomic.Bool
	br       *bufio.Reader
	bw       *bufio.Writer

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
	c.c.SetReadDeadline(time.Now())
}

func (c *conn) serve() {
	defer c.c.Close()
	c.br = bufio.NewReaderSize(c.c, 128<<10)
	c.bw = bufio.NewWriterSize(c.c, 128<<10)
	c.c.SetDeadline(time.Now().Add(c.s.HandshakeTimeout))
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
	c.c.SetDeadline(time.Time{})
	if c.stopping.Load() {
		c.c.SetReadDeadline(time.Now())
	}
	c.transmit()
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ---- negotiation ----

func (c *conn) transmissionFlags() uint16 {
	f := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn
	if c.s.Export.Backend.ReadOnly() {
		f |= FlagReadOnly
	}
	return f
}

func (c *conn) nameMatches(name string) bool {
	return name == "" || name == c.s.Export.Name
}

func (c *conn) reply(opt, typ uint32, data []byte) error {
	if _, err := c.bw.Write(appendOptReply(make([]byte, 0, optReplyLen+len(data)), opt, typ, data)); err != nil {
		return err
	}
	return nil
}

func (c *conn) replyErr(opt, typ uint32, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	c.log.Debug("nbd: option refused", "option", optName(opt), "reply", typ&^repErr, "msg", msg)
	if err := c.reply(opt, typ, []byte(msg)); err != nil {
		return err
	}
	return c.bw.Flush()
}

// blockSizes returns the minimum, preferred and maximum block sizes.
func (c *conn) blockSizes() (uint32, uint32, uint32) {
	bs := uint32(c.s.Export.Backend.BlockSize())
	pref := max(bs, 4096)
	mx := uint32(c.s.MaxPayload) / bs * bs
	if mx < pref {
		mx = pref
	}
	return bs, pref, mx
}

// handshake runs the fixed newstyle negotiation. It returns true when the
// transmission phase starts, false after NBD_OPT_ABORT.
func (c *conn) handshake() (bool, error) {
	var hello [18]byte
	be.PutUint64(hello[0:], magicInit)
	be.PutUint64(hello[8:], magicOpt)
	be.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.c.Write(hello[:]); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return false, err
	}
	cflags := be.Uint32(cf[:])
	if cflags&^clientFlagsAllowed != 0 {
		return false, fmt.Errorf("%w: unknown client flags %#x", errProtocol, cflags)
	}
	noZeroes := cflags&clientNoZeroes != 0
	fixed := cflags&clientFixed != 0
	exp := &c.s.Export
	var hdr [optHeaderLen]byte
	data := make([]byte, 0, 256)
	for n := 0; ; n++ {
		if n >= 4096 {
			return false, fmt.Errorf("%w: more than %d options without choosing an export", errProtocol, n)
		}
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return false, err
		}
		h, err := decodeOptHeader(hdr[:])
		if err != nil {
			return false, err
		}
		data = data[:0]
		if h.Length > 0 {
			data = append(data, make([]byte, h.Length)...)
			if _, err := io.ReadFull(c.br, data); err != nil {
				return false, err
			}
		}
		if !fixed && h.Option != OptExportName {
			return false, fmt.Errorf("%w: %s from a client without fixed newstyle", errProtocol, optName(h.Option))
		}
		switch h.Option {
		case OptExportName:
			name := string(data)
			if !c.nameMatches(name) {
				// This option cannot fail politely: the protocol says close.
				return false, fmt.Errorf("NBD_OPT_EXPORT_NAME for unknown export %q (this server serves %q)", name, exp.Name)
			}
			var b []byte
			b = be.AppendUint64(b, uint64(exp.Backend.Size()))
			b = be.AppendUint16(b, c.transmissionFlags())
			if !noZeroes {
				b = append(b, make([]byte, exportNamePad)...)
			}
			if _, err := c.bw.Write(b); err != nil {
				return false, err
			}
			if err := c.bw.Flush(); err != nil {
				return false, err
			}
			c.log.Debug("nbd: client chose the export", "via", "NBD_OPT_EXPORT_NAME")
			return true, nil
		case OptAbort:
			c.reply(h.Option, RepAck, nil)
			c.bw.Flush()
			c.log.Debug("nbd: client aborted negotiation")
			return false, nil
		case OptList:
			if len(data) != 0 {
				if err := c.replyErr(h.Option, RepErrInvalid, "NBD_OPT_LIST takes no data"); err != nil {
					return false, err
				}
				continue
			}
			var b []byte
			b = be.AppendUint32(b, uint32(len(exp.Name)))
			b = append(b, exp.Name...)
			b = append(b, exp.Description...)
			if err := c.reply(h.Option, RepServer, b); err != nil {
				return false, err
			}
			if err := c.reply(h.Option, RepAck, nil); err != nil {
				return false, err
			}
			if err := c.bw.Flush(); err != nil {
				return false, err
			}
		case OptInfo, OptGo:
			ir, err := decodeInfoRequest(data)
			if err != nil {
				if err := c.replyErr(h.Option, RepErrInvalid, "%s: %v", optName(h.Option), err); err != nil {
					return false, err
				}
				continue
			}
			if !c.nameMatches(ir.Name) {
				if err := c.replyErr(h.Option, RepErrUnknown, "no export %q: this server serves %q", ir.Name, exp.Name); err != nil {
					return false, err
				}
				continue
			}
			if err := c.sendInfo(h.Option, ir); err != nil {
				return false, err
			}
			if h.Option == OptGo {
				c.log.Debug("nbd: client chose the export", "via", "NBD_OPT_GO")
				return true, nil
			}
		case OptStartTLS:
			if err := c.replyErr(h.Option, RepErrUnsup, "TLS is not supported by this server (use a unix socket or loopback)"); err != nil {
				return false, err
			}
		default:
			if err := c.replyErr(h.Option, RepErrUnsup, "%s is not supported", optName(h.Option)); err != nil {
				return false, err
			}
		}
	}
}

func (c *conn) sendInfo(opt uint32, ir infoRequest) error {
	exp := &c.s.Export
	var b []byte
	b = be.AppendUint16(b, InfoExport)
	b = be.AppendUint64(b, uint64(exp.Backend.Size()))
	b = be.AppendUint16(b, c.transmissionFlags())
	if err := c.reply(opt, RepInfo, b); err != nil {
		return err
	}
	for _, i := range ir.Infos {
		switch i {
		case InfoName:
			b = be.AppendUint16(b[:0], InfoName)
			b = append(b, exp.Name...)
		case InfoDescription:
			if exp.Description == "" {
				continue
			}
			b = be.AppendUint16(b[:0], InfoDescription)
			b = append(b, exp.Description...)
		default:
			continue // BLOCK_SIZE is always sent below; unknown ones are ignored
		}
		if err := c.reply(opt, RepInfo, b); err != nil {
			return err
		}
	}
	// Sent whether or not it was asked for, as the protocol allows: the
	// client then knows TRIM and WRITE_ZEROES work in whole blocks.
	mn, pref, mx := c.blockSizes()
	b = be.AppendUint16(b[:0], InfoBlockSize)
	b = be.AppendUint32(b, mn)
	b = be.AppendUint32(b, pref)
	b = be.AppendUint32(b, mx)
	if err := c.reply(opt, RepInfo, b); err != nil {
		return err
	}
	if err := c.reply(opt, RepAck, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

// ---- transmission ----

// op is one request on its way through the backend to the writer.
type op struct {
	c     *conn
	req   request
	errno uint32
	data  []byte // READ: the payload to send; WRITE: the payload received
	buf   []byte // to give back to the pool (nil: none)
	held  int64  // bytes of budget held
}

// budget bounds the payload bytes a connection holds.
type budget struct {
	mu    sync.Mutex
	cond  sync.Cond
	used  int64
	limit int64
}

func (b *budget) acquire(n int64) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (c *conn) getBuf(n int) []byte {
	if c.pool != nil {
		return c.pool.GetBuffer(n)
	}
	return make([]byte, n)
}

func (c *conn) transmit() {
	c.b = c.s.Export.Backend
	c.pool, _ = c.b.(BufferPool)
	c.async, _ = c.b.(AsyncBackend)
	c.size = uint64(c.b.Size())
	c.bs = uint64(c.b.BlockSize())
	c.readOnly = c.b.ReadOnly()
	c.replies = make(chan *op, c.s.MaxInFlight+1)
	c.slots = make(chan struct{}, c.s.MaxInFlight)
	c.budget.limit = c.s.MaxBuffered
	c.budget.cond.L = &c.budget.mu
	wdone := make(chan struct{})
	go func() { c.writer(); close(wdone) }()

	reason, err := c.reader()
	c.inflight.Wait()
	close(c.replies)
	<-wdone
	if werr := c.werr.Load(); werr != nil && err == nil && reason == "" {
		err = *werr
	}
	switch {
	case reason != "":
		c.log.Debug("nbd: connection done", "reason", reason)
	case c.stopping.Load():
		c.log.Debug("nbd: connection closed: server shutting down")
	case err == nil || isEOF(err):
		c.log.Debug("nbd: client disconnected without NBD_CMD_DISC", "err", err)
	default:
		c.log.Warn("nbd: closing connection", "reason", err)
	}
}

// reader reads requests and starts them; it returns why it stopped.
func (c *conn) reader() (string, error) {
	var hdr [requestLen]byte
	for {
		if c.stopping.Load() {
			return "server shutting down", nil
		}
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			if c.stopping.Load() {
				return "server shutting down", nil
			}
			return "", err
		}
		r, err := decodeRequest(hdr[:])
		if err != nil {
			return "", err
		}
		c.s.stats.Requests.Add(1)
		if r.Type == CmdDisc {
			return "client sent NBD_CMD_DISC", nil
		}
		o := &op{c: c, req: r}
		if r.Type == CmdWrite {
			if r.Length > uint32(c.s.MaxPayload) {
				return "", fmt.Errorf("%w: WRITE of %d bytes, above the advertised maximum %d", errProtocol, r.Length, c.s.MaxPayload)
			}
			if errno := c.check(r); errno != 0 {
				if _, err := c.br.Discard(int(r.Length)); err != nil {
					return "", err
				}
				c.finish(o, errno)
				continue
			}
			o.held = int64(r.Length)
			c.budget.acquire(o.held)
			o.buf = c.getBuf(int(r.Length))
			o.data = o.buf
			if _, err := io.ReadFull(c.br, o.data); err != nil {
				c.putBuf(o)
				return "", err
			}
		} else if errno := c.check(r); errno != 0 {
			c.finish(o, errno)
			continue
		} else if r.Type == CmdRead && r.Length > 0 {
			o.held = int64(r.Length)
			c.budget.acquire(o.held)
			o.buf = c.getBuf(int(r.Length))
			o.data = o.buf
		}
		c.slots <- struct{}{}
		c.inflight.Add(1)
		if c.async != nil && (r.Type == CmdRead || r.Type == CmdWrite) && r.Length > 0 &&
			c.async.StartIO(o.data, int64(r.Offset), r.Type == CmdWrite, r.Flags&CmdFlagFUA != 0, o) {
			continue
		}
		go c.exec(o)
	}
}

// check validates a request and returns the errno to fail it with.
func (c *conn) check(r request) uint32 {
	allowed := CmdFlagFUA
	switch r.Type {
	case CmdRead, CmdFlush:
	case CmdWrite, CmdTrim:
		if c.readOnly {
			return EPERM
		}
	case CmdWriteZeroes:
		if c.readOnly {
			return EPERM
		}
		allowed |= CmdFlagNoHole
	default:
		return EINVAL // CACHE, BLOCK_STATUS and unknown commands are not offered
	}
	if r.Flags&^allowed != 0 {
		return EINVAL
	}
	if r.Type == CmdFlush {
		return 0
	}
	if r.Type == CmdRead && r.Length > uint32(c.s.MaxPayload) {
		return EINVAL
	}
	if r.Offset > c.size || uint64(r.Length) > c.size-r.Offset {
		if r.Type == CmdWrite || r.Type == CmdWriteZeroes {
			return ENOSPC
		}
		return EINVAL
	}
	return 0
}

func (c *conn) putBuf(o *op) {
	if o.buf != nil && c.pool != nil {
		c.pool.PutBuffer(o.buf)
	}
	o.buf, o.data = nil, nil
	c.budget.release(o.held)
	o.held = 0
}

// finish queues the reply of a request.
func (c *conn) finish(o *op, errno uint32) {
	o.errno = errno
	if errno != 0 {
		c.s.stats.Errors.Add(1)
	}
	c.replies <- o
}

// Complete implements Completion: an AsyncBackend finished the op.
func (o *op) Complete(err error) {
	c := o.c
	if o.req.Type == CmdWrite {
		c.putBuf(o) // the payload is written: give the memory back before the reply
	}
	c.done(o, err)
	<-c.slots
	c.inflight.Done()
}

// done queues the reply of an executed op.
func (c *conn) done(o *op, err error) {
	errno := uint32(0)
	if err != nil {
		errno = Errno(err)
		r := o.req
		c.log.Warn("nbd: request failed", "cmd", cmdName(r.Type), "offset", r.Offset, "length", r.Length, "errno", errnoName(errno), "err", err)
	}
	c.finish(o, errno)
}

func (c *conn) exec(o *op) {
	defer func() {
		<-c.slots
		c.inflight.Done()
	}()
	r := o.req
	off, n := int64(r.Offset), int64(r.Length)
	fua := r.Flags&CmdFlagFUA != 0
	var err error
	switch r.Type {
	case CmdRead:
		if n > 0 {
			err = c.b.ReadAt(c.ctx, o.data, off)
		}
	case CmdWrite:
		if n > 0 {
			err = c.b.WriteAt(c.ctx, o.data, off, fua)
		}
		c.putBuf(o) // the payload is written: give the memory back before the reply
	case CmdFlush:
		err = c.b.Flush(c.ctx)
	case CmdTrim:
		start, end := roundUp(r.Offset, c.bs), roundDown(r.Offset+uint64(r.Length), c.bs)
		if end > start {
			err = c.b.Trim(c.ctx, int64(start), int64(end-start))
		}
		if err == nil && fua && n > 0 {
			err = c.b.Flush(c.ctx)
		}
	case CmdWriteZeroes:
		err = c.writeZeroes(off, n, r.Flags&CmdFlagNoHole != 0)
		if err == nil && fua && n > 0 {
			err = c.b.Flush(c.ctx)
		}
	}
	c.done(o, err)
}

var zeros = make([]byte, 1<<20)

// writeZeroes zeroes [off, off+n): zeros written at unaligned edges (and
// everywhere with NO_HOLE, which asks for the range to stay allocated),
// the backend's WriteZeroes for the aligned middle.
func (c *conn) writeZeroes(off, n int64, noHole bool) error {
	if n == 0 {
		return nil
	}
	end := off + n
	bs := int64(c.bs)
	start, stop := (off+bs-1)/bs*bs, end/bs*bs
	if noHole || stop <= start {
		return c.writeZeroData(off, end)
	}
	if off < start {
		if err := c.writeZeroData(off, start); err != nil {
			return err
		}
	}
	if err := c.b.WriteZeroes(c.ctx, start, stop-start); err != nil {
		return err
	}
	if stop < end {
		return c.writeZeroData(stop, end)
	}
	return nil
}

func (c *conn) writeZeroData(off, end int64) error {
	for off < end {
		k := min(end-off, int64(len(zeros)))
		if err := c.b.WriteAt(c.ctx, zeros[:k], off, false); err != nil {
			return err
		}
		off += k
	}
	return nil
}

func roundUp(x, a uint64) uint64   { return (x + a - 1) / a * a }
func roundDown(x, a uint64) uint64 { return x / a * a }

// writer sends replies as requests complete, batching small ones into one
// write while more are ready.
func (c *conn) writer() {
	var hdr [simpleReplyLen]byte
	failed := false
	fail := func(err error) {
		if !failed {
			failed = true
			c.werr.Store(&err)
			c.cancel()
			c.c.Close() // unblocks the reader
		}
	}
	for o := range c.replies {
		if !failed {
			putSimpleReply(hdr[:], o.errno, o.req.Cookie)
			var err error
			if o.req.Type == CmdRead && o.errno == 0 && len(o.data) > 32<<10 {
				if err = c.bw.Flush(); err == nil {
					bufs := net.Buffers{hdr[:], o.data}
					_, err = bufs.WriteTo(c.c)
				}
			} else {
				_, err = c.bw.Write(hdr[:])
				if err == nil && o.req.Type == CmdRead && o.errno == 0 {
					_, err = c.bw.Write(o.data)
				}
			}
			if err == nil && len(c.replies) == 0 {
				err = c.bw.Flush()
			}
			if err != nil {
				fail(err)
			}
		}
		c.putBuf(o)
	}
	if !failed {
		if err := c.bw.Flush(); err != nil {
			fail(err)
		}
	}
}
