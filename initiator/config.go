package initiator

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/transport"
)

// Config configures a session.
type Config struct {
	// Provider is the verbs provider to connect through.
	Provider transport.Provider
	// Addr is the target's address, in the provider's syntax.
	Addr string
	// Name is the initiator name the target's ACLs and secrets know.
	Name string
	// Secret, if set, answers the target's authentication challenge; a
	// target that does not prove it knows the same secret is refused.
	Secret []byte
	// Channels is the number of connections (QPs) in the session; I/O is
	// spread over them. Default 1.
	Channels int
	// Credits is the number of requests to ask for per channel (the
	// target may grant fewer). Default 32.
	Credits int
	// MaxTransfer is the largest data transfer per command; larger I/Os
	// are split. Default 1 MiB, and at most what the target grants and
	// what one fast registration of the device covers
	// (Session.MaxTransfer says what a session got).
	MaxTransfer int
	// Mechanism selects FRMR or memory windows; default: what the device
	// offers (frmr.Auto).
	Mechanism frmr.Mechanism
	// WindowQuarantine is how many retired memory windows each channel's
	// pool keeps allocated so that their keys cannot come back (frmr's
	// Config.WindowQuarantine; MW only, default 4×Credits). With windows
	// a descriptor the target was handed is refused for
	// WindowQuarantine × 254 registrations of its channel
	// (Stats.FRMR[i].KeyHorizon) on a device that reuses the window
	// index it freed last; raise it where a peer may replay older ones.
	WindowQuarantine int
	// NoRemoteInvalidate stops the initiator from asking the target to
	// invalidate keys with SEND_WITH_INV; every I/O then ends with a
	// signaled LOCAL_INV. It is implied on a device where receiving
	// SEND_WITH_INV is unsafe (transport.Quirks.ReplayOnErr: rxe on the
	// Linux releases transport/ibverbs/kernel.go names) and on one where
	// a retry may register a remotely invalidated key again
	// (transport.Quirks.RetryRepeatsLocalOps: rxe on every release).
	NoRemoteInvalidate bool
	// ImmediateData is the largest WRITE whose data travels inside the
	// command itself (SRP-2 immediate data, as Linux's ib_srp sends writes
	// of up to max_imm_data): no memory registration, no RDMA READ by the
	// target and no invalidation for it. Default 8 KiB; the target may
	// grant less, and a negative value turns it off.
	ImmediateData int
	// IOTimeout bounds one command on the wire; past it the channel is
	// torn down and reconnected (an RDMA operation cannot be aborted any
	// other way). In ProtocolSRP it also bounds the re-issues of a
	// command answered UNIT ATTENTION or TASK ABORTED (another host's
	// reset), counted from its first sending: past it the command fails
	// with os.ErrDeadlineExceeded. A command left unanswered through
	// five I/O timeouts (each ending its connection, the command
	// re-issued on the next) fails with os.ErrDeadlineExceeded too, as
	// Linux's sd and NVMe hosts give up after five retries. Default 30 s.
	IOTimeout time.Duration
	// LossTimeout bounds how long I/O waits for a lost connection to come
	// back before failing with ErrConnectionLost. Default 60 s.
	LossTimeout time.Duration
	// KeepaliveTimeout is how long a channel may hear nothing from the
	// target before it takes the target for dead and tears the
	// connection down (keepalive.go): after half of it in silence the
	// channel sends a ping, whether idle or with requests outstanding,
	// and the target has at least the other half to answer it; any
	// answer is proof of life, so a channel whose I/O completes sends
	// none. A connection it ends
	// counts as lost since the target was last heard from (LossTimeout
	// runs from there). It finds a target that hangs with its
	// connections up (a stopped process) long before IOTimeout does; a
	// target that leaves every credit outstanding for the whole timeout
	// (a store that stalls) is taken for dead too. Default 0: off
	// (Multipath turns it on). ProtocolGoSRP only.
	KeepaliveTimeout time.Duration
	// ConnectTimeout bounds one connection attempt. Default 10 s.
	ConnectTimeout time.Duration
	// BufferBytes sizes the session's registered buffer pool
	// (Session.AllocBuffer); I/O on its buffers needs no bounce copy.
	// Default 0: every I/O goes through a per-credit bounce buffer.
	BufferBytes int
	// ReplayBuffer is the size in bytes of the replay buffer: a copy of
	// every write the target acknowledged since the last successful flush
	// of its volume, re-issued if the target turns out to have restarted
	// (its instance changed) and lost them. Writers wait while the session
	// flushes when it is full. 0 (the default): no copies; a restart that
	// may have lost writes fails the next Flush and FUA write with
	// ErrWriteCacheLost instead. A positive value below MaxTransfer is
	// raised to it. See the package doc.
	ReplayBuffer int
	// Logger receives the session's log. Default slog.Default().
	Logger *slog.Logger
	// Protocol is the protocol the session speaks: ProtocolGoSRP (the
	// default) or ProtocolSRP, T10 SRP to a standard SRP target such as
	// the kernel's ib_srpt or srpd's SRP personality (srp_login.go).
	// Secret, NoRemoteInvalidate and ReplayBuffer's restart detection do
	// not apply to SRP.
	Protocol Protocol
	// SRPInitiatorPortID is the SRP initiator port identifier (SRP r16a
	// 5.3) the login names, the key of the target's ACLs. Zero (the
	// default) derives a stable one from Name (SRPPortID). The pair of
	// ports is SRP's I_T nexus, and a session's first channel logs in
	// SINGLE, ending the nexus's other channels: two sessions that run
	// at once against one target port need ports of their own.
	SRPInitiatorPortID [16]byte
	// SRPTargetPortID is the target port identifier the login asks for:
	// id_ext then ioc_guid, as `srpd status` prints them and as an
	// ib_srp add_target line names them. A target that is not that port
	// rejects the login ("unable to associate").
	SRPTargetPortID [16]byte

	// refusedIsLost: a reconnect that finds nobody listening at Addr
	// (transport.ErrRefused), or another service
	// (transport.ErrForeignPeer), counts as LossTimeout passed, failing
	// the queued I/O at once. Multipath sets it: a refused connection
	// means the gateway's process is gone, not a blip worth waiting for.
	refusedIsLost bool
}

const (
	maxCredits = 1024
	recvIU     = 4096 // receive buffer per credit: control IUs are msgpack
	sendIU     = 4096
	// defaultImmediate is ib_srp's default max_imm_data.
	defaultImmediate = 8 << 10
)

func (c *Config) setDefaults() error {
	if c.Provider == nil || c.Addr == "" {
		return fmt.Errorf("initiator: config needs a Provider and an Addr: %w", transport.ErrInvalidArgument)
	}
	if c.Name == "" {
		c.Name = "gosrp-initiator"
	}
	if c.Protocol == ProtocolSRP && c.SRPInitiatorPortID == ([16]byte{}) {
		c.SRPInitiatorPortID = SRPPortID(c.Name)
	}
	if c.Channels <= 0 {
		c.Channels = 1
	}
	if c.Credits <= 0 {
		c.Credits = 32
	}
	c.Credits = min(c.Credits, maxCredits)
	if c.MaxTransfer <= 0 {
		c.MaxTransfer = 1 << 20
	}
	c.MaxTransfer = (c.MaxTransfer + transport.PageSize - 1) &^ (transport.PageSize - 1)
	switch {
	case c.ImmediateData == 0:
		c.ImmediateData = defaultImmediate
	case c.ImmediateData < 0:
		c.ImmediateData = 0
	}
	c.ImmediateData = min(c.ImmediateData, c.MaxTransfer)
	if c.IOTimeout <= 0 {
		c.IOTimeout = 30 * time.Second
	}
	if c.LossTimeout <= 0 {
		c.LossTimeout = 60 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.ReplayBuffer > 0 {
		// Every write the session sends must fit, or a full ring could
		// never take it.
		c.ReplayBuffer = max(c.ReplayBuffer, c.MaxTransfer)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
