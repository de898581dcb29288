package emu

// The shm wire's connection management: its listener on a unix socket
// path and the messages of its connection setup (shmWire), which the
// stream wires' shared path (stream.go) runs.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// shmListeners numbers the sockets of the listeners that pick their own
// path (Listen with "").
var shmListeners atomic.Uint64

// shmListener and shmReq are the shm wire's listener and connection
// request.
type (
	shmListener = streamListener[shmWire]
	shmReq      = streamReq[shmWire]
)

func (p *Provider) listenShm(ctx context.Context, addr string) (transport.Listener, error) {
	if addr == "" {
		addr = filepath.Join(os.TempDir(), fmt.Sprintf("gosrp-shm-%d-%d.sock", os.Getpid(), shmListeners.Add(1)))
	}
	lock, err := lockSocketPath(addr)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unixpacket", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		if err = removeStaleSocket(ctx, addr); err != nil {
			unlockSocketPath(addr, lock)
			return nil, err
		}
		ln, err = lc.Listen(ctx, "unixpacket", addr)
	}
	if err != nil {
		unlockSocketPath(addr, lock)
		return nil, fmt.Errorf("emu: listen on %s: %w", addr, err)
	}
	own, err := ownSocket(ln.(*net.UnixListener), addr, lock)
	if err != nil {
		ln.Close()
		unlockSocketPath(addr, lock)
		return nil, err
	}
	l, err := p.serveShm(own, own, addr)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// lockSocketPath takes the lock that makes one listener at a time the
// owner of a socket path: an flock(2) on path+".lock", held for the
// listener's life and released by the kernel when its process dies. Two
// targets starting at once would otherwise both find a stale socket,
// both remove what is at the path, and the second would remove the
// first's live socket. A path whose lock is held belongs to a live
// listener: ErrBusy, without touching the socket.
//
// The owner removes the lock file when it closes (unlockSocketPath), so
// a clean stop leaves nothing behind. A locker that opened the file
// before that removal then holds a lock on a file no longer at the
// path, and a third could lock a new one: so a lock counts only if the
// path still names the locked file afterwards, else it is taken again
// (the rule of lockfile(1) and systemd's make_lock_file).
func lockSocketPath(path string) (*os.File, error) {
	for {
		f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("emu: listen on %s: lock file: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("emu: listen on %s: address in use by a live listener (it holds %s.lock): %w", path, path, transport.ErrBusy)
			}
			return nil, fmt.Errorf("emu: listen on %s: lock %s.lock: %w", path, path, err)
		}
		var held, named unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("emu: listen on %s: lock %s.lock: %w", path, path, err)
		}
		if unix.Stat(path+".lock", &named) == nil && named.Dev == held.Dev && named.Ino == held.Ino {
			return f, nil
		}
		f.Close() // removed by the owner before us: lock the new file
	}
}

// unlockSocketPath removes the lock file taken by lockSocketPath and
// releases its lock, in that order, so that nobody can lock the file
// and then see it removed.
func unlockSocketPath(path string, f *os.File) {
	os.Remove(path + ".lock")
	f.Close()
}

// ownedSocket is a listening unix socket that, when closed, removes its
// path only if the path still names this socket, and then releases the
// path's lock. Go's own unlink on Close removes whatever the path names
// by then, which may be the socket of the listener that replaced this
// one.
type ownedSocket struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	lock     *os.File
	once     sync.Once
}

func ownSocket(ul *net.UnixListener, path string, lock *os.File) (*ownedSocket, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("emu: listen on %s: %w", path, err)
	}
	ul.SetUnlinkOnClose(false)
	return &ownedSocket{UnixListener: ul, path: path, dev: uint64(st.Dev), ino: st.Ino, lock: lock}, nil
}

// Close closes the socket, removes its path if the path is still ours,
// and releases the lock.
func (o *ownedSocket) Close() error {
	err := o.UnixListener.Close()
	o.once.Do(func() {
		var st unix.Stat_t
		if unix.Stat(o.path, &st) == nil && uint64(st.Dev) == o.dev && st.Ino == o.ino {
			os.Remove(o.path)
		}
		unlockSocketPath(o.path, o.lock)
	})
	return err
}

// serveShm starts accepting connection requests on ln; accept is ln
// itself, or a wrapper of it (tests inject accept errors).
func (p *Provider) serveShm(ln, accept net.Listener, addr string) (*shmListener, error) {
	return serveStream[shmWire](p, ln, accept, addr)
}

// removeStaleSocket removes the socket a listener that died without
// closing (SIGKILL) left at path, so that a new one can bind there. The
// caller holds the path's lock (lockSocketPath), so no live listener of
// ours is there; it still removes only a socket nobody listens on, for a
// listener that takes no lock: connect(2) to a unix socket path fails
// with ECONNREFUSED when no socket listens there (unix(7)), while a live
// listener answers, or fails with EAGAIN when its queue is full; either
// of those, or a path that is not a socket, is left alone and reported as
// ErrBusy.
func removeStaleSocket(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil // gone meanwhile: bind again
	case err != nil:
		return fmt.Errorf("emu: listen on %s: address in use: %w", path, err)
	case fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("emu: listen on %s: address in use by a %s that is not a socket: %w", path, fi.Mode().Type(), transport.ErrBusy)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("emu: listen on %s: address in use by a live listener: %w", path, transport.ErrBusy)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("emu: listen on %s: address in use, and a probe of it failed (%w): %w", path, err, transport.ErrBusy)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("emu: listen on %s: remove the stale socket: %w", path, err)
	}
	return nil
}

func peerPID(uc *net.UnixConn) string {
	raw, err := uc.SyscallConn()
	if err != nil {
		return "shm:pid=?"
	}
	pid := "?"
	raw.Control(func(fd uintptr) {
		if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = strconv.Itoa(int(cr.Pid))
		}
	})
	return "shm:pid=" + pid
}

// shmWire is the shm wire's part of connection setup: control messages
// on the SOCK_SEQPACKET socket (shm_control.go), the accept passing the
// connection region's memfd.
type shmWire struct{}

func (shmWire) network() string { return "unixpacket" }

func (shmWire) remote(nc net.Conn) string { return peerPID(nc.(*net.UnixConn)) }

func (shmWire) readRequest(p *Provider, nc net.Conn) ([]byte, transport.ReadCredit, error) {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil, transport.ReadCredit{}, fmt.Errorf("emu: shm listener accepted a %T", nc)
	}
	var buf [ctlMaxLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var m ctlMsg
	fds, err := readCtl(uc, buf[:], oob, &m)
	closeFDs(fds)
	if err != nil || m.kind != ctlReq {
		if err == nil || errors.Is(err, errBadFrame) {
			p.counters.badFrms.Add(1)
			p.log.Warn("dropping connection with a bad connect request", "err", err, "kind", m.kind)
		}
		if err == nil {
			err = fmt.Errorf("%w: control kind %d instead of a connect request", errBadFrame, m.kind)
		}
		return nil, transport.ReadCredit{}, err
	}
	return append([]byte(nil), m.priv...), m.credit, nil
}

// accept creates the connection region, a sealed memfd, and passes it
// with the accept.
func (shmWire) accept(ctx context.Context, r *sockReq, q *qp, priv []byte) (transport.Conn, error) {
	uc := r.nc.(*net.UnixConn)
	var fd int
	err := r.hs.withRoom(func() (err error) {
		fd, err = unix.MemfdCreate("gosrp-shm-conn", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		return err
	})
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("emu: accept: connection region: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, regionLen); err != nil {
		uc.Close()
		return nil, fmt.Errorf("emu: accept: connection region: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		uc.Close()
		return nil, fmt.Errorf("emu: accept: seal connection region: %w", err)
	}
	region, err := unix.Mmap(fd, 0, regionLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("emu: accept: map connection region: %w", err)
	}
	initRegion(region)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetWriteDeadline(dl)
	}
	if err := writeCtl(uc, &ctlMsg{kind: ctlRep, size: regionLen, priv: priv, credit: r.credit}, fd); err != nil {
		unix.Munmap(region)
		uc.Close()
		return nil, fmt.Errorf("emu: accept: %w", err)
	}
	uc.SetWriteDeadline(time.Time{})
	return startShm(r.p, q, uc, region, 1, r.priv, r.credit, r.at, r.from, r.hs)
}

func (shmWire) writeReject(nc net.Conn, priv []byte) error {
	return writeCtl(nc.(*net.UnixConn), &ctlMsg{kind: ctlRej, priv: priv}, -1)
}

func (shmWire) writeRequest(nc net.Conn, priv []byte, offer transport.ReadCredit) error {
	return writeCtl(nc.(*net.UnixConn), &ctlMsg{kind: ctlReq, priv: priv, credit: offer}, -1)
}

// readAnswer reads the accept and maps the connection region it passes,
// after checking the memfd's seals and size and the region's layout.
func (shmWire) readAnswer(ctx context.Context, p *Provider, nc net.Conn, addr string) (streamAnswer, error) {
	var buf [ctlMaxLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var m ctlMsg
	fds, err := readCtl(nc.(*net.UnixConn), buf[:], oob, &m)
	if err != nil {
		if ctx.Err() != nil {
			return streamAnswer{}, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
		}
		if errors.Is(err, errBadFrame) {
			return streamAnswer{}, fmt.Errorf("emu: connect to %s: bad answer: %w: %w", addr, transport.ErrDisconnected, err)
		}
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: no answer: %w: %w", addr, transport.ErrDisconnected, err)
	}
	switch {
	case m.kind == ctlRej && len(fds) == 0:
		return streamAnswer{}, &transport.RejectError{PrivateData: append([]byte(nil), m.priv...)}
	case m.kind != ctlRep || len(fds) != 1:
		closeFDs(fds)
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: bad answer (kind %d, %d descriptors): %w", addr, m.kind, len(fds), transport.ErrDisconnected)
	}
	region, err := mapPeerFD(fds[0], regionLen, unix.PROT_READ|unix.PROT_WRITE)
	unix.Close(fds[0])
	if err == nil {
		if err = checkRegion(region); err != nil {
			unix.Munmap(region)
		}
	}
	if err != nil {
		p.counters.badFrms.Add(1)
		return streamAnswer{}, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrDisconnected, err)
	}
	return streamAnswer{priv: append([]byte(nil), m.priv...), credit: m.credit, region: region}, nil
}

func (shmWire) release(a streamAnswer) { unix.Munmap(a.region) }

func (shmWire) start(p *Provider, q *qp, nc net.Conn, a streamAnswer, addr string) (transport.Conn, error) {
	return startShm(p, q, nc.(*net.UnixConn), a.region, 0, a.priv, a.credit, "shm:pid="+strconv.Itoa(os.Getpid()), addr, nil)
}
