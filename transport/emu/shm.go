package emu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/transport"
)

// ---- control messages on the unix socket ----
//
// Connection management, arena hand-over and disconnect travel on a
// SOCK_SEQPACKET unix socket, one message per datagram; descriptors travel
// in the rings. A message is a 24-byte little-endian header, then private
// data:
//
//	0  magic   u16  'g','M'
//	2  version u8
//	3  kind    u8
//	4  privlen u16
//	6  rsv     u16  zero
//	8  id      u64  MAP: arena ID
//	16 size    u64  MAP: arena bytes; REP: region bytes
//
// MAP and REP carry one file descriptor (SCM_RIGHTS): the arena's memfd,
// the connection region's memfd.
const (
	ctlMagic   = 0x4d67
	ctlVersion = 1
	ctlHdrLen  = 24
	ctlMaxLen  = ctlHdrLen + transport.MaxAcceptPrivateData

	ctlReq  = 1
	ctlRep  = 2
	ctlRej  = 3
	ctlMap  = 4
	ctlDisc = 5
	ctlWake = 6 // doorbell: the peer's ring reader announced it sleeps

	// maxArenaMap bounds the size of a peer arena we agree to map.
	maxArenaMap = 1 << 40
)

type ctlMsg struct {
	kind uint8
	id   uint64
	size uint64
	priv []byte
}

func putCtl(b []byte, m *ctlMsg) []byte {
	b = b[:ctlHdrLen+len(m.priv)]
	binary.LittleEndian.PutUint16(b[0:], ctlMagic)
	b[2] = ctlVersion
	b[3] = m.kind
	binary.LittleEndian.PutUint16(b[4:], uint16(len(m.priv)))
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], m.id)
	binary.LittleEndian.PutUint64(b[16:], m.size)
	copy(b[ctlHdrLen:], m.priv)
	return b
}

// decodeCtl parses a control message from a peer that may be hostile.
// priv aliases b.
func decodeCtl(b []byte, m *ctlMsg) error {
	if len(b) < ctlHdrLen {
		return fmt.Errorf("%w: control message of %d bytes", errBadFrame, len(b))
	}
	if binary.LittleEndian.Uint16(b[0:]) != ctlMagic || b[2] != ctlVersion || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return fmt.Errorf("%w: control header %x", errBadFrame, b[:8])
	}
	n := int(binary.LittleEndian.Uint16(b[4:]))
	if n != len(b)-ctlHdrLen {
		return fmt.Errorf("%w: %d bytes of private data in a %d-byte message", errBadFrame, n, len(b))
	}
	*m = ctlMsg{kind: b[3], id: binary.LittleEndian.Uint64(b[8:]), size: binary.LittleEndian.Uint64(b[16:]), priv: b[ctlHdrLen:]}
	limit := 0
	switch m.kind {
	case ctlReq:
		limit = transport.MaxConnectPrivateData
	case ctlRep:
		limit = transport.MaxAcceptPrivateData
		if m.size != regionLen || m.id != 0 {
			return fmt.Errorf("%w: accept with a region of %d bytes", errBadFrame, m.size)
		}
	case ctlRej:
		limit = transport.MaxRejectPrivateData
	case ctlMap:
		if m.id == 0 || m.size == 0 || m.size > maxArenaMap || m.size%uint64(transport.PageSize) != 0 {
			return fmt.Errorf("%w: MAP of arena %d, %d bytes", errBadFrame, m.id, m.size)
		}
	case ctlDisc, ctlWake:
	default:
		return fmt.Errorf("%w: control kind %d", errBadFrame, m.kind)
	}
	if n > limit {
		return fmt.Errorf("%w: control kind %d with %d bytes of private data", errBadFrame, m.kind, n)
	}
	if m.kind != ctlMap && m.kind != ctlRep && (m.id != 0 || m.size != 0) {
		return fmt.Errorf("%w: control kind %d with id/size", errBadFrame, m.kind)
	}
	return nil
}

func writeCtl(uc *net.UnixConn, m *ctlMsg, fd int) error {
	var b [ctlMaxLen]byte
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := uc.WriteMsgUnix(putCtl(b[:], m), oob, nil)
	return err
}

// readCtl reads one control message and the descriptors passed with it.
// The caller owns (and must close) the descriptors.
func readCtl(uc *net.UnixConn, buf, oob []byte, m *ctlMsg) ([]int, error) {
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	return finishCtl(buf, oob, n, oobn, flags, err, m)
}

// finishCtl checks and decodes a control message received into buf and
// oob.
func finishCtl(buf, oob []byte, n, oobn, flags int, err error, m *ctlMsg) ([]int, error) {
	fds := parseRights(oob[:oobn])
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		closeFDs(fds)
		return nil, err
	}
	if flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
		closeFDs(fds)
		return nil, fmt.Errorf("%w: truncated control message", errBadFrame)
	}
	if err := decodeCtl(buf[:n], m); err != nil {
		closeFDs(fds)
		return nil, err
	}
	return fds, nil
}

// ctlRecv receives control messages on an established link without
// allocating: net.UnixConn.ReadMsgUnix allocates the sender's address on
// every call, and a sleeping ring reader is woken by one message per
// doorbell. It calls recvmsg(2) with no name through the descriptor's
// RawConn, so the netpoller still does the waiting.
type ctlRecv struct {
	rc        syscall.RawConn
	buf, oob  []byte
	iov       unix.Iovec
	msg       unix.Msghdr
	n, oobn   int
	flags     int
	err       error
	recvmsgFn func(fd uintptr) bool // r.recvmsg, bound once
}

func newCtlRecv(uc *net.UnixConn, buf, oob []byte) (*ctlRecv, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &ctlRecv{rc: rc, buf: buf, oob: oob}
	r.recvmsgFn = r.recvmsg
	return r, nil
}

// recvmsg is one non-blocking recvmsg; false asks RawConn.Read to wait
// for the socket to become readable and call again.
func (r *ctlRecv) recvmsg(fd uintptr) bool {
	r.iov.Base = &r.buf[0]
	r.iov.SetLen(len(r.buf))
	r.msg = unix.Msghdr{Iov: &r.iov}
	r.msg.SetIovlen(1)
	r.msg.Control = &r.oob[0]
	r.msg.SetControllen(len(r.oob))
	for {
		n, _, e := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.msg)), unix.MSG_CMSG_CLOEXEC)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			r.n, r.oobn, r.flags, r.err = int(n), int(r.msg.Controllen), int(r.msg.Flags), nil
		default:
			r.n, r.oobn, r.flags, r.err = 0, 0, 0, e
		}
		return true
	}
}

// read receives one control message, as readCtl does.
func (r *ctlRecv) read(m *ctlMsg) ([]int, error) {
	if err := r.rc.Read(r.recvmsgFn); err != nil {
		return nil, err
	}
	return finishCtl(r.buf, r.oob, r.n, r.oobn, r.flags, r.err, m)
}

func parseRights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// mapPeerFD maps size bytes of a memfd the peer passed. It must be sealed
// against shrinking (so the peer cannot make our accesses fault with
// SIGBUS) and at least size bytes long.
func mapPeerFD(fd int, size uint64, prot int) ([]byte, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: passed descriptor is not a memfd: %w", errBadFrame, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("%w: passed memfd is not sealed against shrinking (seals %#x)", errBadFrame, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("emu: fstat passed memfd: %w", err)
	}
	if st.Size < 0 || uint64(st.Size) < size {
		return nil, fmt.Errorf("%w: memfd of %d bytes announced as %d", errBadFrame, st.Size, size)
	}
	m, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("emu: map peer memory of %d bytes: %w", size, err)
	}
	return m, nil
}

// ---- listener ----

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

// ---- the link ----

// Waiting policy of a ring reader with nothing to do: poll for a spin
// budget, then sleep until a doorbell (or at most shmSleep, a safety net;
// peer death is reported by the socket). The budget adapts to how long the
// reader has been waiting for work lately, as an adaptive mutex spins about
// as long as the lock is usually held: twice the recent average wait,
// within [shmSpinMin, shmSpinMax]. A peer that answers in microseconds
// (the other process on another core) is met spinning, with no system call
// on either side; a peer that answers slowly, or shares a core with us,
// finds the reader asleep instead of burning the CPU it needs.
const (
	// shmSpinPolls is how many times a producer retries a full ring, or
	// shutSinks a busy gate, before it starts yielding.
	shmSpinPolls = 128
	shmSpinMin   = 2 * time.Microsecond
	shmSpinMax   = 50 * time.Microsecond
	shmSleep     = time.Second
	// shmMapWait bounds how long a descriptor may wait for the arena MAP
	// the peer promised to send before it.
	shmMapWait = 5 * time.Second
)

// shmSpinAwait is how long a reader whose QP has requests in flight
// polls for their answers before it sleeps, whatever its average wait,
// unless the CPUs are oversubscribed (Config.ShmPoll adaptive): an answer
// comes from the peer's NIC (its ring reader) alone. Waits for new
// requests, which come from the peer's application and may take any time
// (an NBD client, another process on the same cores), get only the
// adaptive budget: spinning through those starved the very processes that
// would send them.
const shmSpinAwait = 200 * time.Microsecond

// shmSpinIdle is how long a reader with no requests in flight polls for
// new ones, past its adaptive budget, while most of its recent waits
// ended without a sleep and the kernel's pressure stall information shows
// no task waiting for a CPU (cpuPressure): then the polling takes CPU
// from nobody and usually ends in work, and a reader that sleeps instead
// costs the peer a wake-up across CPUs for the next request, which on a
// VM without guest halt-polling is tens of microseconds. A reader whose
// waits mostly outlast the polling (a QD1 client behind an NBD hop) gets
// the adaptive budget alone, which also tells it when waits shorten
// again. (The average wait cannot decide this: the sleeps that polling
// avoids are what make it long.)
const shmSpinIdle = 50 * time.Microsecond

// A poll that takes longer than pollPreempted means the reader did not
// run in between. If the kernel ran another thread on this CPU meanwhile
// (cpuPressure tells), the CPUs are oversubscribed, and a reader polling
// for answers takes time from the processes that would produce them, so
// for pollContendedFor after it, the shm and tcp readers do not poll for
// answers.
const (
	pollPreempted    = 20 * time.Microsecond
	pollContendedFor = 50 * time.Millisecond
)

// contention is a polling reader's record of being descheduled.
type contention struct{ until int64 }

// observe records one poll that began at prev and ended at now (clock
// nanoseconds); it reports whether the reader was descheduled in between
// by a thread that wanted its CPU.
func (c *contention) observe(prev, now int64) bool {
	if now-prev > int64(pollPreempted) && cpuPressure.oversubscribed(now) {
		c.until = now + int64(pollContendedFor)
		return true
	}
	return false
}

// contended reports whether polling for answers should stop at now.
func (c *contention) contended(now int64) bool { return now < c.until }

// spinBudget is how long to poll before sleeping, from the average wait.
func spinBudget(avgWait int64) int64 {
	if avgWait > int64(shmSpinMax) {
		return int64(shmSpinMin)
	}
	return min(max(2*avgWait, int64(shmSpinMin)), int64(shmSpinMax))
}

// shmLink is a connected QP's end of the shm wire. The ring reader
// goroutine drains the two incoming rings (requests → responder, responses
// → requester) and is the only user of the peer's mapped arenas; the
// control reader goroutine reads the unix socket (arena MAPs, DREQ, and
// EOF when the peer process dies).
type shmLink struct {
	p      *Provider
	q      *qp
	c      *conn
	uc     *net.UnixConn
	region []byte

	inReq, inResp   ring // consumed by the ring reader
	outReq          ring // produced by the requester goroutine
	outResp         ring // produced by the ring reader (responder)
	myBell, peerBel bell
	myGate, peerGat gate // into my sinks (I open/close), into the peer's (I place)

	// Arenas handed to the peer (MAP sent), by ID; mapsSent counts MAPs.
	mapMu    sync.Mutex
	sent     map[uint64]struct{}
	mapsSent atomic.Uint32
	// One-entry caches of the last arena known to be handed over, one per
	// producer goroutine.
	reqLast, respLast *transport.Arena

	// The peer's arenas mapped here, by the peer's ID.
	peerMu     sync.Mutex
	peer       map[uint64][]byte
	peerClosed bool
	mapsRecv   atomic.Uint32
	mapped     chan struct{}
	lastID     uint64 // ring reader's cache of peer[lastID]
	lastMem    []byte

	// Producer and consumer scratch (each used by one goroutine).
	reqDesc, respDesc, rdesc desc
	reqBuf, respBuf, rbuf    [maxDescSlots * shmSlot]byte
	rpieces                  [maxSGE][]byte
	rpkt                     packet
	// The ring reader's held-back ACK (sendResponse).
	ackHeld bool
	ackPSN  uint32
	ackPkt  packet

	wake    chan struct{} // doorbell rung by the peer (cap 1)
	timer   *time.Timer   // the ring reader's sleep bound
	wakeMsg [ctlHdrLen]byte
	quit    chan struct{}
	gone    chan struct{} // the peer ended the connection (DREQ or EOF)
	goneErr error
	goneOne sync.Once
	closing atomic.Bool
	once    sync.Once
	users   atomic.Int64 // goroutines inside the region; see enter
	release sync.Once
	wg      sync.WaitGroup
}

// newShmLink is side's view of a connection region: its rings, doorbells
// and gates, with the link's own reference taken and its sink gate open.
// It has no QP, socket or goroutines yet.
func newShmLink(region []byte, side int) *shmLink {
	in, out := regionRings+(1-side)*dirLen, regionRings+side*dirLen
	l := &shmLink{region: region,
		inReq: newRing(region, in, shmReqSlots), inResp: newRing(region, in+reqRingLen, shmRespSlots),
		outReq: newRing(region, out, shmReqSlots), outResp: newRing(region, out+reqRingLen, shmRespSlots),
		myBell: newBell(region, side), peerBel: newBell(region, 1-side),
		myGate: newGate(region, side), peerGat: newGate(region, 1-side),
		sent: map[uint64]struct{}{}, peer: map[uint64][]byte{},
		mapped: make(chan struct{}, 1), quit: make(chan struct{}), gone: make(chan struct{}),
		wake: make(chan struct{}, 1), timer: time.NewTimer(time.Hour),
	}
	l.timer.Stop()
	putCtl(l.wakeMsg[:], &ctlMsg{kind: ctlWake})
	l.users.Store(1) // the link's own reference, dropped by disconnect
	l.myGate.open.Store(1)
	return l
}

func startShm(p *Provider, q *qp, uc *net.UnixConn, region []byte, side int, peerPriv []byte, local, remote string) (transport.Conn, error) {
	l := newShmLink(region, side)
	l.p, l.q, l.uc = p, q, uc
	l.c = newConn(q, l, peerPriv, local, remote)
	// Owned before the QP can reach it: disconnect, which disowns, may
	// run as soon as q.connect returns.
	if err := p.own(l); err != nil {
		uc.Close()
		unix.Munmap(region)
		return nil, err
	}
	if err := q.connect(l, l.c); err != nil {
		p.disown(l)
		uc.Close()
		unix.Munmap(region)
		return nil, err
	}
	l.users.Add(1) // the ring reader's
	l.wg.Add(2)
	go l.reader()
	go l.ctlReader()
	return l.c, nil
}

// enter admits a goroutine to the shared region; false once the link is
// closing. The region and the peer's arenas are unmapped when the last
// user leaves a closing link.
func (l *shmLink) enter() bool {
	l.users.Add(1)
	if l.closing.Load() {
		l.exit()
		return false
	}
	return true
}

func (l *shmLink) exit() {
	if l.users.Add(-1) == 0 {
		l.release.Do(l.unmap)
	}
}

func (l *shmLink) unmap() {
	l.peerMu.Lock()
	l.peerClosed = true
	for id, m := range l.peer {
		unix.Munmap(m)
		delete(l.peer, id)
	}
	l.peerMu.Unlock()
	unix.Munmap(l.region)
}

func (l *shmLink) direct() bool { return true }

// place copies READ data into the requester's sinks (the peer's memory)
// if the requester still accepts it. Called by the responder.
func (l *shmLink) place(sinks [][]byte, src []byte) {
	g := l.peerGat
	g.placing.Store(1)
	if g.open.Load() == 1 {
		for _, b := range sinks {
			src = src[copy(b, src):]
		}
	}
	g.placing.Store(0)
}

// closeSinks closes this side's gate and waits out a placement in
// progress (bounded: a peer that never clears its flag is not waited for).
func (l *shmLink) closeSinks() {
	if !l.enter() {
		return // disconnect did it
	}
	l.shutSinks()
	l.exit()
}

// shutSinks is closeSinks for a caller that holds the region mapped.
func (l *shmLink) shutSinks() {
	g := l.myGate
	g.open.Store(0)
	for i := 0; g.placing.Load() != 0 && i < 1_000_000; i++ {
		if i > shmSpinPolls {
			runtime.Gosched()
		}
	}
}

// Close ends the link (provider shutdown).
func (l *shmLink) Close() error {
	l.disconnect(fmt.Errorf("emu: provider closed: %w", transport.ErrDisconnected))
	l.wg.Wait()
	return nil
}

func (l *shmLink) disconnect(err error) {
	l.once.Do(func() {
		l.closing.Store(true)
		close(l.quit)
		l.shutSinks()
		l.uc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		writeCtl(l.uc, &ctlMsg{kind: ctlDisc}, -1) // best effort DREQ
		l.uc.Close()
		l.c.fail(err, errors.Is(err, errLinkLost))
		l.exit()
		l.p.disown(l)
	})
}

// peerDown records that the peer ended the connection; the ring reader
// drains what the peer published before and then disconnects.
func (l *shmLink) peerDown(err error) {
	l.goneOne.Do(func() {
		l.goneErr = err
		close(l.gone)
	})
}

func (l *shmLink) peerGone() bool {
	select {
	case <-l.gone:
		return true
	default:
		return false
	}
}

// hostile handles a descriptor or message no conforming peer sends: the
// QP goes to ERR with a logged reason and the connection is dropped.
func (l *shmLink) hostile(err error) {
	l.p.counters.badFrms.Add(1)
	l.p.log.Warn("malformed descriptor from the shm peer: QP to ERR", "qp", l.q.num, "remote", l.c.remote, "err", err)
	l.q.fatal(transport.EventQPFatal, err.Error())
	l.disconnect(fmt.Errorf("%w: %w", err, transport.ErrDisconnected))
}

func (l *shmLink) flush() {}

func (l *shmLink) sendRequest(p *packet) {
	l.send(&l.outReq, &l.reqDesc, l.reqBuf[:], &l.reqLast, p)
}

// sendResponse publishes a response; an ACK is held back instead (the
// ring reader is the only caller), and a later ACK replaces it, until
// something else goes on the response ring or the reader's poll batch
// ends. The responder may coalesce ACKs (IBA 9.7.5.1.2) and the requester
// completes every SEND and WRITE before an ACK's PSN on it (onResponse,
// as rxe_comp.c check_psn), so answering a burst of requests with one ACK
// saves a descriptor per request on both sides, and the cache lines it
// would move between the two processes' CPUs. A duplicate's ACK (an
// older PSN, after a retry) does not replace the held one: both go, in
// order.
func (l *shmLink) sendResponse(p *packet) {
	if p.kind == pktAck {
		if !l.ackHeld || int32(p.psn-l.ackPSN) <= 0 {
			l.flushAck()
			l.ackHeld = true
		}
		l.ackPSN = p.psn
		return
	}
	l.flushAck()
	l.send(&l.outResp, &l.respDesc, l.respBuf[:], &l.respLast, p)
}

// flushAck publishes the held ACK, if any.
func (l *shmLink) flushAck() {
	if !l.ackHeld {
		return
	}
	l.ackHeld = false
	l.ackPkt = packet{kind: pktAck, psn: l.ackPSN}
	l.send(&l.outResp, &l.respDesc, l.respBuf[:], &l.respLast, &l.ackPkt)
}

// send publishes a packet as a descriptor. Every arena it names is handed
// to the peer first. A ring that stays full for a retry timeout drops the
// packet, as a congested wire would; RC retransmission recovers.
func (l *shmLink) send(r *ring, d *desc, buf []byte, last **transport.Arena, p *packet) {
	if !l.enter() {
		return
	}
	defer l.exit()
	d.kind, d.flags, d.nak, d.psn, d.imm, d.key, d.va = p.kind, p.flags, p.nak, p.psn, p.imm, p.key, p.va
	d.nseg, d.ninline, d.length = 0, 0, 0
	switch {
	case len(p.payload) > maxInline:
		l.p.log.Error("shm: packet payload too large for a descriptor", "qp", l.q.num, "kind", p.kind, "bytes", len(p.payload))
		return
	case len(p.payload) > 0:
		d.ninline = copy(d.inline[:], p.payload)
		d.length = uint32(d.ninline)
	default:
		for _, s := range p.segs {
			if *last != s.arena {
				if !l.handOver(s.arena) {
					return // dropped: the requester retries (and re-checks its lkeys)
				}
				*last = s.arena
			}
			d.segs[d.nseg] = dseg{id: s.arena.ID(), off: uint64(s.off), n: uint32(s.n)}
			d.nseg++
			d.length += uint32(s.n)
		}
	}
	if p.kind == pktRead || p.placed {
		d.length = p.length
	}
	if p.placed {
		d.flags |= dfPlaced
	}
	d.mapSeq = l.mapsSent.Load()
	k := encodeDesc(buf, d)
	var since time.Time
	for i := 0; ; i++ {
		ok, bad := r.space(uint64(k))
		if bad {
			l.hostile(fmt.Errorf("%w: ring head %d beyond tail %d", errBadFrame, r.head.Load(), r.ptail))
			return
		}
		if ok {
			break
		}
		if l.closing.Load() || l.peerGone() {
			return
		}
		switch {
		case i < shmSpinPolls:
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > l.p.cfg.RetryTimeout:
			l.p.log.Debug("shm: ring full, packet dropped", "qp", l.q.num, "kind", p.kind, "psn", p.psn)
			return
		case time.Since(since) < shmSpinMax:
			runtime.Gosched()
		default:
			time.Sleep(20 * time.Microsecond)
		}
	}
	r.put(buf, k)
	if l.peerBel.claim() {
		l.uc.Write(l.wakeMsg[:]) // an error ends the link through the socket reader
	}
}

// handOver passes an arena's memfd to the peer unless it already has it.
func (l *shmLink) handOver(a *transport.Arena) bool {
	l.mapMu.Lock()
	defer l.mapMu.Unlock()
	id := a.ID()
	if _, ok := l.sent[id]; ok {
		return true
	}
	fd := a.MemFD()
	if fd < 0 {
		l.p.log.Warn("shm: arena has no memfd and cannot be shared with the peer process", "qp", l.q.num, "arena", id)
		return false
	}
	if err := writeCtl(l.uc, &ctlMsg{kind: ctlMap, id: id, size: uint64(a.Len())}, fd); err != nil {
		l.disconnect(fmt.Errorf("emu: shm: hand arena to %s: %w (%w): %w", l.c.remote, errLinkLost, transport.ErrDisconnected, err))
		return false
	}
	l.sent[id] = struct{}{}
	l.mapsSent.Add(1)
	return true
}

// ctlReader reads the unix socket until it closes. EOF means the peer
// process is gone (the kernel closes its descriptors when it dies).
func (l *shmLink) ctlReader() {
	defer l.wg.Done()
	rcv, err := newCtlRecv(l.uc, make([]byte, ctlMaxLen), make([]byte, unix.CmsgSpace(4*4)))
	if err != nil {
		l.peerDown(fmt.Errorf("emu: shm link to %s: %w: %w", l.c.remote, errLinkLost, err))
		return
	}
	var m ctlMsg
	for {
		fds, err := rcv.read(&m)
		if err != nil {
			if l.closing.Load() {
				return
			}
			if errors.Is(err, errBadFrame) {
				l.hostile(err)
				return
			}
			l.peerDown(fmt.Errorf("emu: shm peer %s gone: %w (%w): %w", l.c.remote, errLinkLost, transport.ErrDisconnected, err))
			return
		}
		switch {
		case m.kind == ctlWake && len(fds) == 0:
			select {
			case l.wake <- struct{}{}:
			default:
			}
		case m.kind == ctlDisc && len(fds) == 0:
			l.peerDown(fmt.Errorf("emu: peer %s disconnected: %w", l.c.remote, transport.ErrDisconnected))
			return
		case m.kind == ctlMap && len(fds) == 1:
			err = l.mapPeer(m.id, m.size, fds[0])
			unix.Close(fds[0])
			if err != nil {
				l.hostile(err)
				return
			}
		default:
			closeFDs(fds)
			l.hostile(fmt.Errorf("%w: control kind %d with %d descriptors on an established connection", errBadFrame, m.kind, len(fds)))
			return
		}
	}
}

func (l *shmLink) mapPeer(id, size uint64, fd int) error {
	mem, err := mapPeerFD(fd, size, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return err
	}
	l.peerMu.Lock()
	_, dup := l.peer[id]
	if l.peerClosed || dup {
		l.peerMu.Unlock()
		unix.Munmap(mem)
		if dup {
			return fmt.Errorf("%w: arena %d handed over twice", errBadFrame, id)
		}
		return nil
	}
	l.peer[id] = mem
	l.peerMu.Unlock()
	l.mapsRecv.Add(1)
	select {
	case l.mapped <- struct{}{}:
	default:
	}
	return nil
}

// reader is the ring reader: it drains both incoming rings, answering
// requests as the responder and handing responses to the requester, and
// waits adaptively when there is nothing to do.
func (l *shmLink) reader() {
	defer l.wg.Done()
	defer l.exit()
	var avgWait int64 // moving average of idle waits, ns
	var since int64   // start of the current idle wait; 0 while busy
	// awaiting, for this wait: 0 not decided yet, 1 answers are due, 2
	// none are but new requests are worth polling for, 3 neither.
	awaiting := 0
	slept := false   // this wait went to sleep
	var sleepy int64 // moving average of waits that slept, in 1/1024
	var prev int64   // the previous idle poll
	var cont contention
	eager := l.p.cfg.ShmPoll == ShmPollEager
	for !l.closing.Load() {
		n, ok := l.poll()
		if !ok {
			return
		}
		if n > 0 {
			if since != 0 {
				avgWait += (clock.Nanos() - since - avgWait) / 8
				s := int64(0)
				if slept {
					s = 1024
				}
				sleepy += (s - sleepy) / 8
				since, awaiting, slept = 0, 0, false
			}
			continue
		}
		if l.peerGone() {
			// A peer publishes its last answers and then goes: poll once
			// more after seeing it gone, so an answer published between
			// the empty poll and its going is not lost.
			n, ok := l.poll()
			if !ok {
				return
			}
			if n > 0 {
				continue
			}
			l.disconnect(l.goneErr) // everything published before is done
			return
		}
		now := clock.Nanos()
		if since == 0 {
			since, prev = now, now
			continue
		}
		cont.observe(prev, now)
		prev = now
		if now-since < spinBudget(avgWait) {
			runtime.Gosched() // let this process's other goroutines run
			continue
		}
		if awaiting == 0 {
			// Decided once per wait, as the tcp reader decides.
			switch {
			case l.q.awaitingAnswers():
				awaiting = 1
			case sleepy < 512 && !cpuPressure.oversubscribed(now):
				awaiting = 2
			default:
				awaiting = 3
			}
		}
		if awaiting == 1 && now-since < int64(shmSpinAwait) && (eager || !cont.contended(now)) {
			// Our requests are out: the peer's NIC answers them without
			// waiting for anyone, so the answer is worth polling for.
			runtime.Gosched()
			continue
		}
		if awaiting == 2 && now-since < int64(shmSpinIdle) && !cont.contended(now) {
			runtime.Gosched()
			continue
		}
		slept = true
		l.sleep()
	}
}

// sleep waits for the doorbell after announcing it, unless work arrived
// in between (the producer stores its tail and then reads the flag; we
// store the flag and then read the tails: one of us sees the other).
func (l *shmLink) sleep() {
	b := l.myBell
	b.sleeping.Store(1)
	n1, ok1 := l.inReq.avail()
	n2, ok2 := l.inResp.avail()
	if n1+n2 == 0 && ok1 && ok2 {
		l.timer.Reset(shmSleep)
		select {
		case <-l.wake:
		case <-l.quit:
		case <-l.gone:
		case <-l.timer.C:
		}
		l.timer.Stop()
	}
	b.sleeping.Store(0)
}

// poll handles up to a batch of descriptors; false when the link ended.
func (l *shmLink) poll() (int, bool) {
	n := 0
	for n < 64 {
		got := false
		for _, isReq := range [2]bool{false, true} {
			r := &l.inResp
			if isReq {
				r = &l.inReq
			}
			k, ok := r.avail()
			if !ok {
				l.hostile(fmt.Errorf("%w: ring tail %d from head %d", errBadFrame, r.tail.Load(), r.chead))
				return n, false
			}
			if k == 0 {
				continue
			}
			if !l.take(r, k, isReq) {
				return n, false
			}
			got = true
			n++
		}
		if !got {
			break
		}
	}
	l.flushAck()
	return n, true
}

// take copies one descriptor out of the ring, validates it and delivers it.
func (l *shmLink) take(r *ring, avail uint64, isReq bool) bool {
	b := l.rbuf[:]
	copy(b[:shmSlot], r.slot(r.chead))
	extra, err := descExtra(b[:shmSlot])
	if err == nil && uint64(1+extra) > avail {
		err = fmt.Errorf("%w: descriptor of %d slots, %d published", errBadFrame, 1+extra, avail)
	}
	if err != nil {
		l.hostile(err)
		return false
	}
	for i := 1; i <= extra; i++ {
		copy(b[i*shmSlot:(i+1)*shmSlot], r.slot(r.chead+uint64(i)))
	}
	r.release(uint64(1 + extra))
	d := &l.rdesc
	if err := decodeDesc(b[:(1+extra)*shmSlot], d); err != nil {
		l.hostile(err)
		return false
	}
	if d.kind.isRequest() != isReq {
		l.hostile(fmt.Errorf("%w: %s in the wrong ring", errBadFrame, d.kind))
		return false
	}
	pkt := &l.rpkt
	*pkt = packet{kind: d.kind, flags: d.flags &^ dfPlaced, nak: d.nak, psn: d.psn, imm: d.imm, key: d.key, va: d.va, length: d.length,
		placed: d.flags&dfPlaced != 0}
	switch {
	case d.ninline > 0:
		pkt.payload = d.inline[:d.ninline]
	case d.nseg > 0:
		if !l.awaitMaps(d.mapSeq) {
			return false
		}
		for i := 0; i < d.nseg; i++ {
			s := &d.segs[i]
			mem := l.lastMem
			if s.id != l.lastID {
				l.peerMu.Lock()
				m, ok := l.peer[s.id]
				l.peerMu.Unlock()
				if !ok {
					l.hostile(fmt.Errorf("%w: %s names arena %d, never handed over", errBadFrame, d.kind, s.id))
					return false
				}
				l.lastID, l.lastMem, mem = s.id, m, m
			}
			if s.off > uint64(len(mem)) || uint64(s.n) > uint64(len(mem))-s.off {
				l.hostile(fmt.Errorf("%w: %s segment [%d,+%d) outside arena %d of %d bytes", errBadFrame, d.kind, s.off, s.n, s.id, len(mem)))
				return false
			}
			l.rpieces[i] = mem[s.off : s.off+uint64(s.n) : s.off+uint64(s.n)]
		}
		pkt.pieces = l.rpieces[:d.nseg]
	}
	if isReq {
		l.q.onRequest(pkt)
	} else {
		l.q.onResponse(pkt)
	}
	return true
}

// awaitMaps waits until the peer's MAP messages sent before a descriptor
// have been mapped here.
func (l *shmLink) awaitMaps(seq uint32) bool {
	if int32(seq-l.mapsRecv.Load()) <= 0 {
		return true
	}
	t := time.NewTimer(shmMapWait)
	defer t.Stop()
	for int32(seq-l.mapsRecv.Load()) > 0 {
		select {
		case <-l.mapped:
		case <-l.quit:
			return false
		case <-l.gone:
			if int32(seq-l.mapsRecv.Load()) > 0 {
				l.disconnect(l.goneErr)
				return false
			}
		case <-t.C:
			l.hostile(fmt.Errorf("%w: descriptor waits for arena hand-over %d, %d received", errBadFrame, seq, l.mapsRecv.Load()))
			return false
		}
	}
	return true
}
