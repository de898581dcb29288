package nbd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// errnoError is an error with the errno the client sees.
type errnoError struct {
	errno uint32
	err   error
}

func (e *errnoError) Error() string { return e.err.Error() }
func (e *errnoError) Unwrap() error { return e.err }

// WithErrno makes err reach the client as errno (EIO, EINVAL, ENOSPC,
// EPERM, ENOTSUP...).
func WithErrno(err error, errno uint32) error {
	if err == nil {
		return nil
	}
	return &errnoError{errno: errno, err: err}
}

// Errno is the errno a backend error is reported as: the one WithErrno
// attached, a syscall.Errno the protocol knows, ESHUTDOWN for a cancelled
// context, EIO otherwise.
func Errno(err error) uint32 {
	var ee *errnoError
	if errors.As(err, &ee) {
		return ee.errno
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		switch uint32(se) {
		case EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN:
			return uint32(se)
		case uint32(syscall.EROFS), uint32(syscall.EACCES):
			return EPERM
		}
		return EIO
	}
	if errors.Is(err, context.Canceled) {
		return ESHUTDOWN
	}
	return EIO
}

func errnoName(e uint32) string {
	switch e {
	case 0:
		return "OK"
	case EPERM:
		return "EPERM"
	case EIO:
		return "EIO"
	case ENOMEM:
		return "ENOMEM"
	case EINVAL:
		return "EINVAL"
	case ENOSPC:
		return "ENOSPC"
	case EOVERFLOW:
		return "EOVERFLOW"
	case ENOTSUP:
		return "ENOTSUP"
	case ESHUTDOWN:
		return "ESHUTDOWN"
	}
	return fmt.Sprintf("errno %d", e)
}
