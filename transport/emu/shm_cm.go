package emu

// The shm wire's connection management: the listener on a unix socket
// path, its connection requests, and the active side's connect.

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

var shmListeners atomic.Uint64

type shmListener struct {
	p    *Provider
	ln   *net.UnixListener
	path string
	reqs chan *shmReq
	done chan struct{}
	fail *listenFail
	once sync.Once
	wg   sync.WaitGroup
}

func (p *Provider) listenShm(ctx context.Context, addr string) (transport.Listener, error) {
	if addr == "" {
		addr = filepath.Join(os.TempDir(), fmt.Sprintf("gosrp-shm-%d-%d.sock", os.Getpid(), shmListeners.Add(1)))
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unixpacket", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		if err = removeStaleSocket(ctx, addr); err != nil {
			return nil, err
		}
		ln, err = lc.Listen(ctx, "unixpacket", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("emu: listen on %s: %w", addr, err)
	}
	l, err := p.serveShm(ln.(*net.UnixListener), ln, addr)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// serveShm starts accepting connection requests on ln; accept is ln
// itself, or a wrapper of it (tests inject accept errors).
func (p *Provider) serveShm(ln *net.UnixListener, accept net.Listener, addr string) (*shmListener, error) {
	l := &shmListener{p: p, ln: ln, path: addr, reqs: make(chan *shmReq, 64), done: make(chan struct{}), fail: newListenFail()}
	if err := p.own(l); err != nil {
		ln.Close()
		return nil, err
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		p.acceptLoop(accept, addr, l.done, l.fail, func(nc net.Conn) {
			l.wg.Add(1)
			go l.handshake(nc.(*net.UnixConn))
		})
	}()
	return l, nil
}

func (l *shmListener) Addr() string { return l.path }

// removeStaleSocket removes the socket a listener that died without
// closing (SIGKILL) left at path, so that a new one can bind there. It
// removes only a socket nobody listens on: connect(2) to a unix socket
// path fails with ECONNREFUSED when no socket listens there (unix(7)),
// while a live listener answers, or fails with EAGAIN when its queue is
// full; either of those, or a path that is not a socket, is left alone
// and reported as ErrBusy.
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

func (l *shmListener) handshake(uc *net.UnixConn) {
	defer l.wg.Done()
	uc.SetReadDeadline(time.Now().Add(cmTimeout))
	var buf [ctlMaxLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var m ctlMsg
	fds, err := readCtl(uc, buf[:], oob, &m)
	closeFDs(fds)
	if err != nil || m.kind != ctlReq {
		if err == nil || errors.Is(err, errBadFrame) {
			l.p.counters.badFrms.Add(1)
			l.p.log.Warn("dropping connection with a bad connect request", "err", err, "kind", m.kind)
		}
		uc.Close()
		return
	}
	uc.SetReadDeadline(time.Time{})
	r := &shmReq{l: l, uc: uc, priv: append([]byte(nil), m.priv...), from: peerPID(uc)}
	select {
	case l.reqs <- r:
	case <-l.done:
		r.Reject(nil)
	}
}

func (l *shmListener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	return acceptFrom(ctx, l.reqs, l.done, l.fail, l.path)
}

func (l *shmListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.wg.Wait()
		rejectPending(l.reqs)
		l.p.disown(l)
	})
	return nil
}

type shmReq struct {
	l    *shmListener
	uc   *net.UnixConn
	priv []byte
	from string

	mu       sync.Mutex
	answered bool
}

func (r *shmReq) Device() transport.Device { return r.l.p.dev }
func (r *shmReq) PrivateData() []byte      { return r.priv }
func (r *shmReq) RemoteAddr() string       { return r.from }

func (r *shmReq) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return fmt.Errorf("emu: request already answered: %w", transport.ErrInvalidState)
	}
	r.answered = true
	return nil
}

func (r *shmReq) Accept(ctx context.Context, x transport.QP, priv []byte) (transport.Conn, error) {
	if err := checkPrivate("accept", priv, transport.MaxAcceptPrivateData); err != nil {
		return nil, err
	}
	q, err := asQP(r.l.p.dev, x)
	if err != nil {
		return nil, err
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("gosrp-shm-conn", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		r.uc.Close()
		return nil, fmt.Errorf("emu: accept: connection region: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, regionLen); err != nil {
		r.uc.Close()
		return nil, fmt.Errorf("emu: accept: connection region: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		r.uc.Close()
		return nil, fmt.Errorf("emu: accept: seal connection region: %w", err)
	}
	region, err := unix.Mmap(fd, 0, regionLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		r.uc.Close()
		return nil, fmt.Errorf("emu: accept: map connection region: %w", err)
	}
	initRegion(region)
	if dl, ok := ctx.Deadline(); ok {
		r.uc.SetWriteDeadline(dl)
	}
	if err := writeCtl(r.uc, &ctlMsg{kind: ctlRep, size: regionLen, priv: priv}, fd); err != nil {
		unix.Munmap(region)
		r.uc.Close()
		return nil, fmt.Errorf("emu: accept: %w", err)
	}
	r.uc.SetWriteDeadline(time.Time{})
	return startShm(r.l.p, q, r.uc, region, 1, r.priv, r.l.path, r.from)
}

func (r *shmReq) Reject(priv []byte) error {
	if err := checkPrivate("reject", priv, transport.MaxRejectPrivateData); err != nil {
		return err
	}
	if err := r.answer(); err != nil {
		return err
	}
	r.uc.SetWriteDeadline(time.Now().Add(cmTimeout))
	err := writeCtl(r.uc, &ctlMsg{kind: ctlRej, priv: priv}, -1)
	r.uc.Close()
	if err != nil {
		return fmt.Errorf("emu: reject: %w", err)
	}
	return nil
}

func (p *Provider) connectShm(ctx context.Context, addr string, q *qp, priv []byte) (transport.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", addr)
	if err != nil {
		return nil, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrNotFound, err)
	}
	uc := nc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	if err := writeCtl(uc, &ctlMsg{kind: ctlReq, priv: priv}, -1); err != nil {
		uc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, err)
	}
	var buf [ctlMaxLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var m ctlMsg
	fds, err := readCtl(uc, buf[:], oob, &m)
	if err != nil {
		uc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
		}
		if errors.Is(err, errBadFrame) {
			return nil, fmt.Errorf("emu: connect to %s: bad answer: %w: %w", addr, transport.ErrDisconnected, err)
		}
		return nil, fmt.Errorf("emu: connect to %s: no answer: %w: %w", addr, transport.ErrDisconnected, err)
	}
	switch {
	case m.kind == ctlRej && len(fds) == 0:
		uc.Close()
		return nil, &transport.RejectError{PrivateData: append([]byte(nil), m.priv...)}
	case m.kind != ctlRep || len(fds) != 1:
		closeFDs(fds)
		uc.Close()
		return nil, fmt.Errorf("emu: connect to %s: bad answer (kind %d, %d descriptors): %w", addr, m.kind, len(fds), transport.ErrDisconnected)
	}
	region, err := mapPeerFD(fds[0], regionLen, unix.PROT_READ|unix.PROT_WRITE)
	unix.Close(fds[0])
	if err == nil {
		if err = checkRegion(region); err != nil {
			unix.Munmap(region)
		}
	}
	if err != nil {
		uc.Close()
		p.counters.badFrms.Add(1)
		return nil, fmt.Errorf("emu: connect to %s: %w: %w", addr, transport.ErrDisconnected, err)
	}
	if !stop() {
		unix.Munmap(region)
		uc.Close()
		return nil, fmt.Errorf("emu: connect to %s: %w", addr, ctx.Err())
	}
	uc.SetDeadline(time.Time{})
	return startShm(p, q, uc, region, 0, m.priv, "shm:pid="+strconv.Itoa(os.Getpid()), addr)
}
