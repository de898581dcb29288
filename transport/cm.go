package transport

import "context"

// Private data limits of RDMA-CM on InfiniBand and RoCE: the IB CM REQ, REP
// and REJ messages carry 92, 196 and 148 bytes, less the 36-byte rdma_cm
// header on REQ (rdma_connect(3), rdma_accept(3)). Providers enforce them so
// that a protocol built on the software NIC also fits on hardware; anything
// larger (a full login) travels as the first SEND after the connection is
// established.
const (
	MaxConnectPrivateData = 56
	MaxAcceptPrivateData  = 196
	MaxRejectPrivateData  = 148
)

// Listener accepts connection requests (an rdma_cm listening id).
type Listener interface {
	// Accept waits for the next connection request.
	Accept(ctx context.Context) (ConnRequest, error)
	// Addr is the address the listener is bound to, with the port chosen
	// if the caller asked for port 0.
	Addr() string
	// Close stops listening; pending requests are rejected.
	Close() error
}

// ConnRequest is an incoming connection request (RDMA_CM_EVENT_CONNECT_REQUEST).
// The passive side creates its QP on Device and then accepts or rejects.
type ConnRequest interface {
	// Device is the device the request arrived on.
	Device() Device
	// PrivateData is what the active side passed to Connect.
	PrivateData() []byte
	// RemoteAddr is the active side's address.
	RemoteAddr() string
	// Accept connects qp (in RESET or INIT) to the requester, moving it to
	// RTS, and sends private data (at most MaxAcceptPrivateData bytes).
	Accept(ctx context.Context, qp QP, privateData []byte) (Conn, error)
	// Reject refuses the request with private data (at most
	// MaxRejectPrivateData bytes); the requester's Connect returns a
	// *RejectError.
	Reject(privateData []byte) error
}

// Endpoint is an active-side connection id bound to the device that reaches
// the target address.
type Endpoint interface {
	// Device is the device to create the QP on.
	Device() Device
	// Connect connects qp (in RESET or INIT) to the listener, sending
	// private data (at most MaxConnectPrivateData bytes). On success the QP
	// is in RTS. A rejection returns a *RejectError.
	Connect(ctx context.Context, qp QP, privateData []byte) (Conn, error)
	// Close releases the endpoint if it never connected.
	Close() error
}

// Conn is an established connection.
type Conn interface {
	// QP is the connected queue pair.
	QP() QP
	// PrivateData is what the peer sent: the accept's data on the active
	// side, the request's on the passive side.
	PrivateData() []byte
	// LocalAddr and RemoteAddr name the two ends.
	LocalAddr() string
	RemoteAddr() string
	// Done is closed when the connection ends (RDMA_CM_EVENT_DISCONNECTED,
	// link cut, peer gone); Err then says why.
	Done() <-chan struct{}
	// Err is nil while connected, then the reason it ended (wrapping
	// ErrDisconnected).
	Err() error
	// Disconnect ends the connection (rdma_disconnect): the local QP moves to
	// ERR and flushes, the peer sees Done.
	Disconnect() error
}
