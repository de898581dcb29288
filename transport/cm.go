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
	// ReadCredit is the RDMA READ credit the request offers, from this
	// side's view and already bounded by this device: Accept gives the
	// connection exactly this. Out is zero when the requester serves no
	// RDMA READs at all, and then no READ this side posts ever executes.
	ReadCredit() ReadCredit
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
	// OfferReadCredit sets the RDMA READ credit Connect asks for (by
	// default the most the device allows, MaxReadCredit at most); the
	// connection gets the smaller of each figure and the peer's. Call it
	// before Connect.
	OfferReadCredit(c ReadCredit)
	// Close releases the endpoint if it never connected.
	Close() error
}

// MaxReadCredit bounds each figure of a ReadCredit that providers offer by
// default: 16 READs outstanding each way, what rdma_cm consumers commonly
// ask for (the kernel's NVMe-oF host asks for its device's maximum, capped
// by the target's).
const MaxReadCredit = 16

// ReadCredit is a connection's RDMA READ credit as RDMA-CM negotiates it
// (rdma_conn_param's initiator_depth and responder_resources, carried in
// the IB CM REQ and REP fields of those names, IBA vol. 1 chapter 12), from
// one side's view. A requester holds at most Out READs outstanding at the
// peer: a READ posted beyond that waits in the send queue, and everything
// posted after it waits behind it, until an earlier READ's response
// returns a credit. With Out zero the first READ and the queue behind it
// wait for ever (the kernel's rxe does exactly that: rxe_requester's
// rd_atomic check). In is how many READs the peer may hold outstanding
// here.
type ReadCredit struct {
	Out int // READs this side may have outstanding at the peer (its QP's max_rd_atomic)
	In  int // READs the peer may have outstanding here (max_dest_rd_atomic)
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
	// ReadCredit is the RDMA READ credit the connection was established
	// with, from this side's view.
	ReadCredit() ReadCredit
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
