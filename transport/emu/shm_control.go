package emu

// The shm wire's control protocol: the messages that travel on the unix
// socket (connect, accept, reject, arena MAP, disconnect, doorbell), their
// encoding and checks, and the mapping of a memfd the peer passed.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// Connection management, arena hand-over and disconnect travel on a
// SOCK_SEQPACKET unix socket, one message per datagram; descriptors travel
// in the rings. A message is a 24-byte little-endian header, then private
// data:
//
//	0  magic   u16  'g','M'
//	2  version u8
//	3  kind    u8
//	4  privlen u16
//	6  ord     u8   REQ, REP: initiator_depth (else zero)
//	7  ird     u8   REQ, REP: responder_resources (else zero)
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
	kind   uint8
	id     uint64
	size   uint64
	priv   []byte
	credit transport.ReadCredit // REQ, REP: the sender's offer (wireCredit)
}

func putCtl(b []byte, m *ctlMsg) []byte {
	b = b[:ctlHdrLen+len(m.priv)]
	binary.LittleEndian.PutUint16(b[0:], ctlMagic)
	b[2] = ctlVersion
	b[3] = m.kind
	binary.LittleEndian.PutUint16(b[4:], uint16(len(m.priv)))
	binary.LittleEndian.PutUint16(b[6:], putCredit(m.credit))
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
	if binary.LittleEndian.Uint16(b[0:]) != ctlMagic || b[2] != ctlVersion {
		return fmt.Errorf("%w: control header %x", errBadFrame, b[:8])
	}
	credit := binary.LittleEndian.Uint16(b[6:])
	if credit != 0 && b[3] != ctlReq && b[3] != ctlRep {
		return fmt.Errorf("%w: control header %x", errBadFrame, b[:8])
	}
	n := int(binary.LittleEndian.Uint16(b[4:]))
	if n != len(b)-ctlHdrLen {
		return fmt.Errorf("%w: %d bytes of private data in a %d-byte message", errBadFrame, n, len(b))
	}
	*m = ctlMsg{kind: b[3], id: binary.LittleEndian.Uint64(b[8:]), size: binary.LittleEndian.Uint64(b[16:]), priv: b[ctlHdrLen:], credit: getCredit(uint32(credit))}
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
	if flags&unix.MSG_CTRUNC != 0 && flags&unix.MSG_TRUNC == 0 && len(fds) == 0 {
		// The peer passed descriptors and not one was installed: the
		// kernel's scm_detach_fds sets MSG_CTRUNC when receive_fd fails,
		// that is when this process is out of descriptors (EMFILE). A
		// peer passing more than the buffer holds gets some installed.
		return nil, fmt.Errorf("%w: a descriptor the peer passed was dropped by the kernel", errNoDescriptors)
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
