//go:build linux && cgo && ibverbs

package ibverbs

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/transport"
)

// errnoKind says where an errno came from, because the same number means
// different things: ENOMEM from ibv_post_send is a full work queue, from a
// create call an exhausted device.
type errnoKind int

const (
	kindCreate  errnoKind = iota // create/alloc/register/modify
	kindPost                     // ibv_post_send / ibv_post_recv
	kindDestroy                  // destroy/dealloc/dereg
	kindCM                       // librdmacm
)

// mapErrno turns an errno at the C boundary into an error wrapping the
// transport sentinel and the unix.Errno, e.g. "ibverbs: ibv_post_send:
// transport: work queue full (cannot allocate memory)". Only this function
// maps errnos.
func mapErrno(op string, kind errnoKind, e int) error {
	if e < 0 {
		e = -e
	}
	if e == 0 {
		e = int(unix.EINVAL)
	}
	errno := unix.Errno(e)
	var s error
	switch errno {
	case unix.ENOMEM, unix.EAGAIN:
		if kind == kindPost {
			s = transport.ErrQueueFull
		} else {
			s = transport.ErrNoMemory
		}
	case unix.EINVAL:
		s = transport.ErrInvalidArgument
		if kind == kindDestroy {
			// rxe refuses ibv_dereg_mr with EINVAL while windows are bound
			// (IBA 10.6.7.2.6); other devices say EBUSY.
			s = transport.ErrBusy
		}
	case unix.EBUSY:
		s = transport.ErrBusy
	case unix.ENOENT, unix.ENODEV, unix.ENXIO, unix.EADDRNOTAVAIL, unix.ENETUNREACH, unix.EHOSTUNREACH:
		s = transport.ErrNotFound
	case unix.EOPNOTSUPP, unix.ENOSYS, unix.EPROTONOSUPPORT, unix.EAFNOSUPPORT:
		s = transport.ErrUnsupported
	case unix.EBADF:
		s = transport.ErrClosed
	case unix.ECONNREFUSED:
		s = transport.ErrRejected
	case unix.ECONNRESET, unix.ECONNABORTED, unix.ETIMEDOUT, unix.ENOTCONN:
		s = transport.ErrDisconnected
	case unix.EPERM, unix.EACCES:
		s = transport.ErrInvalidArgument
	default:
		return fmt.Errorf("ibverbs: %s: %w", op, errno)
	}
	return fmt.Errorf("ibverbs: %s: %w (%w)", op, s, errno)
}
