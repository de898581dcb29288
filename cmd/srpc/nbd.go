package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/nbd"
)

const nbdLong = `Serve VOLUME over the NBD protocol on a unix socket (--socket PATH) or a
TCP address (--listen HOST:PORT), so that NBD clients use it unchanged:

    srpc nbd --socket /tmp/vol0.sock vol0 &
    nbdinfo 'nbd+unix:///vol0?socket=/tmp/vol0.sock'
    qemu-img convert -n -O raw disk.img nbd:unix:/tmp/vol0.sock:exportname=vol0
    fio --ioengine=nbd --uri='nbd+unix:///vol0?socket=/tmp/vol0.sock' ...

The export name is the volume name (the empty, default name selects it
too). Fixed newstyle negotiation with NBD_OPT_GO; FLUSH, FUA, TRIM,
WRITE_ZEROES, CACHE (a no-op) and multi-conn (every connection shares one
session, so a flush on one is a flush for all). Structured replies and the
base:allocation metadata context tell clients where the volume's holes
are, from srpd's store (pebble knows which blocks were written), so that
sparse-aware tools skip them:

    nbdinfo --map 'nbd+unix:///vol0?socket=/tmp/vol0.sock'
    qemu-img map --output=json nbd:unix:/tmp/vol0.sock:exportname=vol0
    nbdcopy 'nbd+unix:///vol0?socket=/tmp/vol0.sock' sparse.img

(an srpd that predates the extents request has everything reported
allocated). One promise of base:allocation is not kept: srpd's stores
are thin provisioned and pebble writes new data even for an overwrite,
so a write may fail with ENOSPC on a full disk whether or not the
extent was reported allocated. The minimum block size advertised is the
volume's; an unaligned TRIM trims the whole blocks inside it, an unaligned
WRITE_ZEROES writes zeros at its edges. Requests of a connection run
concurrently (up to --qd reach the target at once).

srpc stays in the foreground; SIGTERM or SIGINT stops accepting, answers
the requests in flight, closes the connections and flushes the volume (a
second signal exits at once).

NBD itself has no authentication. Without TLS, serve on a unix socket or
loopback, or behind your own access control. With --tls-cert and
--tls-key, TLS is required (NBD_OPT_STARTTLS; a client that does not
upgrade gets NBD_REP_ERR_TLS_REQD), and with --tls-client-ca only
clients presenting a certificate signed by that CA get in:

    srpc nbd --listen 0.0.0.0:10809 --tls-cert server-cert.pem \
        --tls-key server-key.pem --tls-client-ca ca-cert.pem vol0 &
    nbdinfo 'nbds://host:10809/vol0?tls-certificates=/etc/pki/nbd'

(libnbd's directory holds ca-cert.pem, client-cert.pem, client-key.pem).
TLS with pre-shared keys (nbdkit's --tls-psk) is not offered: Go's
crypto/tls has no TLS-PSK.`

func nbdCommand() *cli.Command {
	var cf serveFlags
	var socket, listen, tlsCert, tlsKey, tlsCA string
	var debug bool
	return &cli.Command{
		Name: "nbd", Args: "VOLUME", Short: "serve a volume over the NBD protocol (qemu, nbdcopy, nbdinfo, fio)",
		Long: nbdLong,
		SetFlags: func(fs *flag.FlagSet) {
			cf.register(fs, "open the volume read-only and export it read-only")
			fs.StringVar(&socket, "socket", "", "serve on the unix socket `PATH`")
			fs.StringVar(&listen, "listen", "", "serve on TCP `HOST:PORT` (no authentication without TLS: keep it on loopback)")
			fs.StringVar(&tlsCert, "tls-cert", "", "require TLS, with the server certificate in PEM `FILE` (and --tls-key)")
			fs.StringVar(&tlsKey, "tls-key", "", "the private key of --tls-cert, in PEM `FILE`")
			fs.StringVar(&tlsCA, "tls-client-ca", "", "admit only clients with a certificate signed by the CA in PEM `FILE` (needs --tls-cert)")
			fs.BoolVar(&debug, "debug", false, "log every connection and refused option")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "VOLUME"); err != nil {
				return err
			}
			if (socket == "") == (listen == "") {
				return cli.Usagef("give exactly one of --socket PATH and --listen HOST:PORT")
			}
			if err := cf.check(); err != nil {
				return err
			}
			tlsConfig, err := nbdTLS(tlsCert, tlsKey, tlsCA)
			if err != nil {
				return err
			}
			network, addr := "unix", socket
			if listen != "" {
				network, addr = "tcp", listen
			} else if err := removeStaleSocket(socket); err != nil {
				return err
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				return fmt.Errorf("cannot serve NBD on %s: %v", addr, errors.Unwrap(err))
			}
			defer ln.Close()

			s, v, err := cf.openCopy(ctx, args[0], cf.ro, cf.qd, min(cf.qd, 256)<<20)
			if err != nil {
				return err
			}
			defer s.Close()
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			srv := &nbd.Server{
				Export: nbd.Export{
					Name:        v.Name(),
					Description: fmt.Sprintf("gosrp volume %s on %s", v.Name(), s.addr),
					Backend:     newNBDVolume(s, v),
				},
				Logger:    log,
				TLSConfig: tlsConfig,
			}
			scheme := "nbd"
			if tlsConfig != nil {
				scheme = "nbds"
			}
			uri := fmt.Sprintf("%s://%s/%s", scheme, ln.Addr(), v.Name())
			if network == "unix" {
				uri = fmt.Sprintf("%s+unix:///%s?socket=%s", scheme, v.Name(), socket)
			}
			fmt.Fprintf(os.Stderr, "srpc: serving %s (%s) over NBD at %s; SIGTERM or Ctrl-C stops\n", v.Name(), cli.FormatSize(v.Size()), uri)

			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			var serveErr error
			select {
			case serveErr = <-served:
			case <-sigs:
				go func() {
					<-sigs
					fmt.Fprintf(os.Stderr, "srpc: second signal: exiting without flushing %s\n", v.Name())
					os.Exit(cli.ExitFailure)
				}()
			}
			sctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				fmt.Fprintf(os.Stderr, "srpc: NBD clients still busy after %s; closed them\n", cf.timeout)
			}
			ferr := v.Flush(sctx)
			v.Close()
			if serveErr != nil && !errors.Is(serveErr, nbd.ErrServerClosed) {
				return fmt.Errorf("NBD server on %s: %v", addr, serveErr)
			}
			if ferr != nil {
				return fmt.Errorf("stopped serving %s, but the final flush failed: %v", v.Name(), ioError(ferr))
			}
			fmt.Fprintf(os.Stderr, "srpc: stopped serving %s; flushed\n", v.Name())
			return nil
		},
	}
}

// nbdTLS builds the server's TLS configuration from the flags: nil
// without --tls-cert; with --tls-client-ca, client certificates signed by
// that CA are required.
func nbdTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "" && caFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, cli.Usagef("give both --tls-cert and --tls-key (and optionally --tls-client-ca)")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %v", certFile, keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate in it", caFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// removeStaleSocket removes a unix socket nobody listens on any more (a
// previous srpc that was killed); anything else at the path is an error.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("--socket %s exists and is not a socket", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("--socket %s: another server is listening there", path)
	}
	return os.Remove(path)
}

// nbdVolume adapts an initiator.Volume (or, with several --target
// paths, an initiator.MultipathVolume) to nbd.Backend, with a pool of
// the session's registered buffers so that NBD payloads reach the target
// without a bounce copy (a Multipath has none: every payload bounces).
type nbdVolume struct {
	v       pathVolume
	s       *session
	maxXfer int

	mu   sync.Mutex
	free map[int][][]byte // by capacity (a power of two)
	reg  map[*byte]bool   // buffers of the registered pool
	out  bool             // the registered pool is exhausted
}

func newNBDVolume(s *session, v pathVolume) *nbdVolume {
	return &nbdVolume{v: v, s: s, maxXfer: s.maxTransfer(), free: map[int][][]byte{}, reg: map[*byte]bool{}}
}

// Size asks the target for the volume's size (Volume.Refresh), so that a
// new NBD negotiation offers the size after any resize even when no
// command has brought the notice yet; the NBD server asks only when a
// connection negotiates or starts transmission, never per I/O. If the
// target does not answer in time, the last size known serves.
func (n *nbdVolume) Size() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), sizeRefreshTimeout)
	defer cancel()
	size, _ := n.v.Refresh(ctx)
	return size
}

// sizeRefreshTimeout bounds the size query of a negotiation.
const sizeRefreshTimeout = 2 * time.Second

func (n *nbdVolume) BlockSize() int { return n.v.BlockSize() }
func (n *nbdVolume) ReadOnly() bool { return n.v.ReadOnly() }

func (n *nbdVolume) GetBuffer(size int) []byte {
	class := 4096
	for class < size {
		class <<= 1
	}
	if class > n.maxXfer {
		return make([]byte, size) // split by the volume anyway
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := n.free[class]; len(l) > 0 {
		b := l[len(l)-1]
		n.free[class] = l[:len(l)-1]
		return b[:size]
	}
	if !n.out {
		if b, err := n.s.allocBuffer(class); err == nil {
			n.reg[unsafe.SliceData(b)] = true
			return b[:size]
		}
		n.out = true
	}
	return make([]byte, size)
}

func (n *nbdVolume) PutBuffer(b []byte) {
	b = b[:cap(b)]
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(b) > 0 && n.reg[unsafe.SliceData(b)] {
		n.free[len(b)] = append(n.free[len(b)], b)
	}
}

// nbdIO is one NBD read or write in flight through Volume.Submit.
type nbdIO struct {
	r    initiator.Request
	done nbd.Completion
}

// nbdIOPool recycles nbdIOs (New is set in init: it refers to complete,
// which puts back into the pool).
var nbdIOPool sync.Pool

func init() {
	nbdIOPool.New = func() any {
		x := new(nbdIO)
		x.r.OnDone = x.complete
		return x
	}
}

// complete runs on the initiator's poller: it only hands the outcome to
// the NBD reply writer.
func (x *nbdIO) complete(r *initiator.Request) {
	done, err := x.done, nbdErr(r.Err, r.Op == initiator.OpWrite)
	x.done, x.r.Buf = nil, nil
	nbdIOPool.Put(x)
	done.Complete(err)
}

// StartIO implements nbd.AsyncBackend: an aligned transfer the session
// takes in one command is submitted as is, so a request costs the NBD
// server no goroutine and the initiator no synchronous waiter. Anything
// else (unaligned, larger than MaxTransfer) takes the blocking path, which
// splits and bounces as needed.
func (n *nbdVolume) StartIO(p []byte, off int64, write, fua bool, done nbd.Completion) bool {
	x := nbdIOPool.Get().(*nbdIO)
	x.r.Op, x.r.Buf, x.r.Offset, x.r.FUA, x.done = initiator.OpRead, p, off, fua, done
	if write {
		x.r.Op = initiator.OpWrite
	}
	if err := n.v.Submit(&x.r); err != nil {
		x.done, x.r.Buf = nil, nil
		nbdIOPool.Put(x)
		return false
	}
	return true
}

func (n *nbdVolume) ReadAt(ctx context.Context, p []byte, off int64) error {
	_, err := n.v.ReadAtContext(ctx, p, off)
	return nbdErr(err, false)
}

func (n *nbdVolume) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	var err error
	if fua {
		_, err = n.v.WriteAtFUA(ctx, p, off)
	} else {
		_, err = n.v.WriteAtContext(ctx, p, off)
	}
	return nbdErr(err, true)
}

// BlockStatus implements nbd.BlockStatuser with the target's extents
// (initiator.Volume.Extents): one round trip answers up to
// wire.MaxExtents extents, and the NBD client asks again for the rest.
func (n *nbdVolume) BlockStatus(ctx context.Context, off, l int64) ([]nbd.Extent, error) {
	exts, err := n.v.Extents(ctx, off, l)
	if err != nil {
		return nil, nbdErr(err, false)
	}
	out := make([]nbd.Extent, len(exts))
	for i, e := range exts {
		out[i].Length = e.Length
		if e.Hole {
			out[i].Flags |= nbd.StateHole
		}
		if e.Zero {
			out[i].Flags |= nbd.StateZero
		}
	}
	return out, nil
}

func (n *nbdVolume) Flush(ctx context.Context) error { return nbdErr(n.v.Flush(ctx), true) }
func (n *nbdVolume) Trim(ctx context.Context, off, l int64) error {
	return nbdErr(n.v.Discard(ctx, off, l), true)
}
func (n *nbdVolume) WriteZeroes(ctx context.Context, off, l int64) error {
	return nbdErr(n.v.WriteZeroes(ctx, off, l), true)
}

// nbdErr gives an initiator error the errno an NBD client understands.
func nbdErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	orig := err
	err = ioError(err)
	var ie *initiator.IOError
	switch {
	case errors.Is(orig, initiator.ErrReadOnly), errors.Is(orig, initiator.ErrAccessDenied), errors.Is(orig, initiator.ErrReservationConflict):
		return nbd.WithErrno(err, nbd.EPERM)
	case errors.Is(orig, initiator.ErrInvalid):
		return nbd.WithErrno(err, nbd.EINVAL)
	case errors.Is(orig, initiator.ErrNoSpace):
		return nbd.WithErrno(err, nbd.ENOSPC)
	case errors.As(orig, &ie):
		switch ie.Sense {
		case initiator.SenseWriteProtected:
			return nbd.WithErrno(err, nbd.EPERM)
		case initiator.SenseUnsupported:
			return nbd.WithErrno(err, nbd.ENOTSUP)
		case initiator.SenseInvalidField, initiator.SenseMisaligned:
			return nbd.WithErrno(err, nbd.EINVAL)
		case initiator.SenseOutOfRange:
			if write {
				return nbd.WithErrno(err, nbd.ENOSPC)
			}
			return nbd.WithErrno(err, nbd.EINVAL)
		}
	}
	return nbd.WithErrno(err, nbd.EIO)
}
