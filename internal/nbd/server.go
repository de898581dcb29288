package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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

// BlockStatuser is implemented by a Backend that knows which parts of the
// export hold data; the server answers NBD_CMD_BLOCK_STATUS for the
// base:allocation context from it. A Backend without it has every range
// reported allocated (status 0), which the protocol allows ("a server MAY
// always safely report a status of 0 for any block").
type BlockStatuser interface {
	// BlockStatus describes [off, off+n) as consecutive extents, the
	// first starting at off. It may describe only a prefix of the range
	// (the client asks again for the rest) but describes at least one
	// byte; extents beyond off+n are cut off.
	BlockStatus(ctx context.Context, off, n int64) ([]Extent, error)
}

// Extent is a run of the export with one allocation status.
type Extent struct {
	Length int64
	// Flags is a set of StateHole and StateZero.
	Flags uint32
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

// Server serves one export over the NBD protocol (see the package doc):
// fixed newstyle negotiation, simple or structured replies, and READ,
// WRITE, FLUSH, TRIM, WRITE_ZEROES, CACHE, BLOCK_STATUS and DISC. Requests
// of one connection run concurrently and are answered as they complete.
// Every connection shares the Backend, so the export advertises
// NBD_FLAG_CAN_MULTI_CONN.
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
	// TLSConfig, when set, makes TLS mandatory (proto.md's FORCEDTLS):
	// until the client upgrades with NBD_OPT_STARTTLS every option but
	// NBD_OPT_ABORT is answered NBD_REP_ERR_TLS_REQD. It holds the
	// server's certificate; ClientAuth and ClientCAs make client
	// certificates the authentication NBD itself lacks. Go's crypto/tls
	// has no TLS-PSK, so pre-shared keys are not offered.
	TLSConfig *tls.Config

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
		s: s, raw: c, c: c, ctx: ctx, cancel: cancel,
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
			c.raw.Close()
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
