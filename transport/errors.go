package transport

import (
	"errors"
	"fmt"
)

// Sentinel errors a consumer acts on. Providers wrap them with context;
// test with errors.Is.
var (
	// ErrClosed: the object (or the device or provider under it) is closed.
	ErrClosed = errors.New("transport: closed")
	// ErrInvalidArgument: a request is malformed (EINVAL).
	ErrInvalidArgument = errors.New("transport: invalid argument")
	// ErrInvalidState: the QP's state does not allow the operation, e.g. a
	// post in RESET on a strict device or an illegal state transition.
	ErrInvalidState = errors.New("transport: invalid QP state")
	// ErrQueueFull: the work queue has no room for the request (ENOMEM from
	// ibv_post_send). Nothing from the failing request on was posted.
	ErrQueueFull = errors.New("transport: work queue full")
	// ErrNoMemory: the device could not allocate the object (ENOMEM on
	// create/alloc, or an injected allocation failure).
	ErrNoMemory = errors.New("transport: device out of resources")
	// ErrUnsupported: the device lacks the capability (see Capability).
	ErrUnsupported = errors.New("transport: not supported by device")
	// ErrNotFound: no such provider, device or address.
	ErrNotFound = errors.New("transport: not found")
	// ErrRefused: Connect reached the address and nothing listens there:
	// the peer's CM answered a REJ with IB_CM_REJ_INVALID_SERVICE_ID
	// (IBTA 12.11.2, what cm_req_handler sends for a service ID with no
	// listener), or the socket layer refused (ECONNREFUSED, or no socket
	// at a unix path). Unlike a timeout it is a definite answer: a caller
	// with another path to try can try it at once.
	ErrRefused = errors.New("transport: connection refused (nothing listens there)")
	// ErrBusy: the object is still in use (e.g. an MR with windows bound).
	ErrBusy = errors.New("transport: resource busy")
	// ErrRejected: the passive side rejected the connection; see
	// RejectError for its private data.
	ErrRejected = errors.New("transport: connection rejected")
	// ErrDisconnected: the connection is gone (DREQ, link cut, peer died).
	ErrDisconnected = errors.New("transport: disconnected")
	// ErrForeignPeer: Connect reached a listener that answered in another
	// protocol (an HTTP or NVMe/TCP server on the port): a definite
	// answer, as ErrRefused is, and one no retry will change. Only a
	// provider whose connection exchange has a signature of its own can
	// tell (emu's TCP wire). See ForeignPeerError for what it said.
	ErrForeignPeer = errors.New("transport: the peer answered in another protocol")
	// ErrCQOverrun: the completion queue overflowed and is unusable
	// (IBV_EVENT_CQ_ERR); destroy it and everything attached.
	ErrCQOverrun = errors.New("transport: completion queue overrun")
)

// RejectError is returned by Dial when the peer rejected the connection; it
// carries the peer's private data (for example a login reject IU).
type RejectError struct {
	PrivateData []byte
}

// Error says the connection was rejected and how much private data came.
func (e *RejectError) Error() string {
	return fmt.Sprintf("transport: connection rejected (%d bytes of private data)", len(e.PrivateData))
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *RejectError) Unwrap() error { return ErrRejected }

// ForeignPeerError is returned by Connect when the listener answered in
// another protocol (ErrForeignPeer); it carries the start of what the
// listener said, for a message that names the service.
type ForeignPeerError struct {
	Answer []byte
}

// Error quotes what the listener answered.
func (e *ForeignPeerError) Error() string {
	return fmt.Sprintf("%v: it answered %q", ErrForeignPeer, e.Answer)
}

// Unwrap makes errors.Is(err, ErrForeignPeer) true.
func (e *ForeignPeerError) Unwrap() error { return ErrForeignPeer }
