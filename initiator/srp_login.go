package initiator

// Logging in to a standard SRP target (T10 SRP r16a, SRP-2 immediate
// data): the SRP_LOGIN_REQ rides in the RDMA-CM connection request's
// private data, as the kernel's ib_srp sends it (srp_send_req), and the
// target answers in the CM exchange itself: SRP_LOGIN_RSP in the
// accept's private data, or SRP_LOGIN_REJ in the reject's.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/transport"
)

// Protocol is the protocol a session speaks (Config.Protocol).
type Protocol uint8

// Protocols.
const (
	// ProtocolGoSRP is gosrp's own protocol (internal/wire), the default.
	ProtocolGoSRP Protocol = iota
	// ProtocolSRP is T10 SRP, to a standard SRP target: volumes are the
	// target's LUNs, named "lun<N>" (Session.Volumes), moved with SCSI
	// READ(16) and WRITE(16), flushed with SYNCHRONIZE CACHE(16) and
	// discarded with UNMAP where the LUN reports it.
	ProtocolSRP
)

func (p Protocol) String() string { return enum.Name(protocolNames[:], p, "Protocol") }

var protocolNames = [...]string{ProtocolGoSRP: "gosrp", ProtocolSRP: "srp"}

// ParseProtocol reads a protocol's name as String writes it.
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "gosrp", "":
		return ProtocolGoSRP, nil
	case "srp":
		return ProtocolSRP, nil
	}
	return 0, fmt.Errorf("initiator: unknown protocol %q (want gosrp or srp): %w", s, ErrInvalid)
}

// SRPPortID derives a stable SRP initiator port identifier from an
// initiator name, for Config.SRPInitiatorPortID left zero: the first 16
// bytes of SHA-256("gosrp SRP initiator port\x00" + name). The same
// name gives the same identifier on every host and run, so a target's
// ACL keyed on it (srpd names it in lower-case hex) follows the name.
func SRPPortID(name string) [16]byte {
	h := sha256.Sum256([]byte("gosrp SRP initiator port\x00" + name))
	return [16]byte(h[:16])
}

// ParseSRPPortID reads a 16-byte SRP port identifier written as 32 hex
// digits (id_ext then ioc_guid for a target port), or as id_ext and
// ioc_guid of 16 hex digits each separated by a comma or a slash.
func ParseSRPPortID(s string) ([16]byte, error) {
	var id [16]byte
	clean := make([]byte, 0, 32)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ',', '/':
			if len(clean) != 16 {
				return id, fmt.Errorf("initiator: SRP port id %q: id_ext is not 16 hex digits: %w", s, ErrInvalid)
			}
		case ':', '-':
		default:
			clean = append(clean, c)
		}
	}
	if len(clean) != 32 {
		return id, fmt.Errorf("initiator: SRP port id %q: want 32 hex digits (id_ext then ioc_guid): %w", s, ErrInvalid)
	}
	if _, err := hex.Decode(id[:], clean); err != nil {
		return id, fmt.Errorf("initiator: SRP port id %q: %v: %w", s, err, ErrInvalid)
	}
	return id, nil
}

// srpMaxITIU is the largest IU this initiator sends: an SRP_CMD with one
// direct descriptor (64 bytes), or with immediate data at srpImmOffset.
func (c *channel) srpMaxITIU() int {
	if imm := c.srpImmediate(); imm > 0 {
		return srpImmOffset + imm
	}
	return srp.CmdLen + srp.DescriptorLen
}

// srpImmediate is how much immediate data the login asks for.
func (c *channel) srpImmediate() int {
	if c.sendSGEs() < 2 {
		return 0
	}
	return c.s.cfg.ImmediateData
}

// connectSRP logs in over SRP on a QP in INIT with its receives posted,
// and re-establishes the session's open volumes (LUNs need no open).
// The first channel asks for SINGLE, ending any older channel of the
// same I_T nexus before the accept (so a write an old channel fetched
// never lands after this one re-issues it); the others join it (MULTI),
// as ib_srp's srp_connect_ch does.
func (c *channel) connectSRP(ctx context.Context, ep transport.Endpoint, qp transport.QP) error {
	s := c.s
	req := srp.LoginRequest{
		Tag:             uint64(c.id),
		MaxITIULen:      uint32(c.srpMaxITIU()),
		BufFormats:      srp.BufFormatDirect,
		InitiatorPortID: s.cfg.SRPInitiatorPortID,
		TargetPortID:    s.cfg.SRPTargetPortID,
	}
	if c.id > 0 {
		req.Flags |= srp.MultiChanMulti
	}
	if c.srpImmediate() > 0 {
		req.Flags |= srp.ImmediateRequested
		req.ImmDataOffset = srpImmOffset
	}
	var priv [srp.LoginRequestRDMALen]byte
	if _, err := req.EncodeRDMA(priv[:]); err != nil {
		return err
	}
	// The target moves a WRITE's data with RDMA READs from this side:
	// offer to serve them (transport.ReadCredit; the default offer, said
	// here because an SRP target refuses a requester that serves none).
	ep.OfferReadCredit(transport.ReadCredit{Out: transport.MaxReadCredit, In: transport.MaxReadCredit})
	var single uint64
	if f := s.fence; f != nil && c.id == 0 {
		single = f.begin()
	}
	conn, err := ep.Connect(ctx, qp, priv[:])
	var joined uint64
	if f := s.fence; f != nil && err == nil && c.id > 0 {
		joined = f.joined() // as the accept came: srpFence.joined
	}
	if err != nil {
		var rej *transport.RejectError
		if errors.As(err, &rej) {
			var lr srp.LoginReject
			if lr.Decode(rej.PrivateData) == nil {
				return srpLoginError(lr.Reason)
			}
		}
		return fmt.Errorf("initiator: SRP connect to %s: %w", s.cfg.Addr, err)
	}
	c.conn = conn
	if err := c.postPrologue(); err != nil {
		return err
	}
	var rsp srp.LoginResponse
	if err := rsp.Decode(conn.PrivateData()); err != nil {
		return fmt.Errorf("initiator: SRP login to %s: the accept carries no SRP_LOGIN_RSP: %w: %w", s.cfg.Addr, ErrProtocol, err)
	}
	switch {
	case rsp.ReqLimDelta >= 1<<31:
		// ib_srp keeps the request limit as a signed 32-bit count
		// (srp_cm_rep_handler): this is a negative limit, not a vast one.
		return fmt.Errorf("initiator: SRP target %s granted a request limit of %d (negative as SRP's signed count): %w", s.cfg.Addr, rsp.ReqLimDelta, ErrProtocol)
	case rsp.ReqLimDelta < 2:
		// One credit is kept back, as ib_srp keeps one for task
		// management (__srp_get_tx_iu).
		return fmt.Errorf("initiator: SRP target %s granted a request limit of %d: %w", s.cfg.Addr, rsp.ReqLimDelta, ErrProtocol)
	case rsp.BufFormats&srp.BufFormatDirect == 0:
		return fmt.Errorf("initiator: SRP target %s does not take direct descriptors (formats %#x): %w", s.cfg.Addr, rsp.BufFormats, ErrProtocol)
	case rsp.MaxITIULen < srp.CmdLen+srp.DescriptorLen:
		return fmt.Errorf("initiator: SRP target %s takes IUs of at most %d bytes: %w", s.cfg.Addr, rsp.MaxITIULen, ErrProtocol)
	case rsp.MaxTIIULen < srp.RspLen:
		// A target that cannot send an SRP_RSP cannot answer. A large
		// MaxTIIULen is no lie to refuse: ib_srpt answers the request's
		// req_it_iu_len in it (srpt_cm_req_recv), 8260 bytes for a login
		// with immediate data, and sends SRP_RSPs of a few hundred bytes;
		// an IU beyond the recvIU-byte receive buffers would fail its
		// receive (a length error), ending the connection, never
		// overrunning memory. (Nor is a MaxITIULen above the one asked
		// for: this initiator never sends more than it asked.)
		return fmt.Errorf("initiator: SRP target %s sends IUs of at most %d bytes, less than an SRP_RSP's %d: %w", s.cfg.Addr, rsp.MaxTIIULen, srp.RspLen, ErrProtocol)
	}
	if f := s.fence; f != nil {
		// Logged in: a SINGLE login's older channels are gone, with
		// their I/O, and the others wait for it no more. An accept
		// without a valid SRP_LOGIN_RSP is not counted: what such a
		// target did with the login is not known.
		if c.id == 0 {
			f.accepted(single)
			c.srpLogin = single
		} else {
			c.srpLogin = joined
		}
	}
	maxImm := 0
	if rsp.Flags&srp.ImmediateSupported != 0 && req.Flags&srp.ImmediateRequested != 0 {
		maxImm = min(c.srpImmediate(), int(rsp.MaxITIULen)-srpImmOffset)
	}
	c.maxTransfer = min(s.cfg.MaxTransfer, c.regMax)
	c.core.connected(login{credits: min(int(rsp.ReqLimDelta)-1, s.cfg.Credits), maxImm: maxImm})
	s.noteLogin(c.id, srpTargetName(s.cfg.SRPTargetPortID), c.maxTransfer)
	// A unit that told its identity is read again before its requests
	// go out (srp_identity.go); the others are addressed at once.
	var check []lateVol
	for _, v := range s.openVolumes() {
		switch {
		case v.checksLUN():
			check = append(check, lateVol{v, "its identity not read again since the re-login"})
		case !v.replaced.Load():
			c.core.setHandle(v, uint32(v.lun))
		}
	}
	c.mu.Lock()
	c.epoch++
	c.mu.Unlock()
	c.startWaiter()
	// The check waits a loss timeout from now, not what is left of the
	// last loss's: after an outage past that deadline (its I/O failed)
	// the re-login is news, and the I/O submitted since must wait for
	// one INQUIRY, not fail on a deadline long gone.
	c.startLate(check, s.cfg.LossTimeout)
	return nil
}

// srpTargetName names an SRP target port as the session's target name.
func srpTargetName(id [16]byte) string {
	return fmt.Sprintf("srp:%x,%x", id[:8], id[8:])
}

// srpLoginError turns an SRP_LOGIN_REJ's reason into a LoginError.
func srpLoginError(r srp.RejectReason) *LoginError {
	reason := RejectUnspecified
	switch r {
	case srp.RejectITIULenTooLarge:
		reason = RejectIUTooLarge
	case srp.RejectInsufficientResources, srp.RejectChannelLimit:
		reason = RejectInsufficientResources
	case srp.RejectUnableToAssociate, srp.RejectUnsupportedFormat, srp.RejectMultiChanUnsupported:
		reason = RejectProtocol
	}
	return &LoginError{Reason: reason, Message: fmt.Sprintf("SRP_LOGIN_REJ: %s (%#x)", r, uint32(r))}
}
