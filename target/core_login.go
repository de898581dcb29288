package target

// The core's login phase: LOGIN, the optional challenge and proof, the
// answer or the reject, and the access policy applied then and on change.

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

func (c *core) loginBuf() ([]byte, uint64) {
	off := len(c.slots) * iuSize
	return c.p.iu[off : off+iuSize], c.p.iuAddr + uint64(off)
}

func (c *core) sendLogin(op wire.Opcode, v any) {
	buf, addr := c.loginBuf()
	b, err := wire.EncodeControl(buf[:0], op, v)
	if err != nil || len(b) > iuSize || len(b) > c.iniRecvIU {
		c.close(fmt.Sprintf("cannot encode %s (%d bytes): %v", op, len(b), err), false)
		return
	}
	if !c.sqReserve(1) {
		return
	}
	c.loginSeq = c.sqPosted
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindLogin, 0), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: []transport.SGE{{Addr: addr, Length: uint32(len(b)), LKey: c.p.iuLKey}}})
}

// rejectGrace bounds how long a LoginReject may take to be acknowledged.
const rejectGrace = int64(2e9)

func (c *core) reject(reason wire.RejectReason, msg string) {
	rej := &wire.LoginReject{Reason: reason, Message: msg}
	if reason == wire.RejectVersion {
		rej.MinVersion, rej.MaxVersion = wire.Version, wire.Version
	}
	c.acts.rejected = true
	c.acts.reason = fmt.Sprintf("login rejected: %s: %s", reason, msg)
	c.sendLogin(wire.OpLoginReject, rej)
	if c.state == connClosed {
		return
	}
	c.setState(connRejecting)
	c.deadline = c.now + rejectGrace
}

const maxNonce = 256

func (c *core) onLogin(buf []byte) {
	var req wire.LoginRequest
	if err := wire.DecodeControl(buf, wire.OpLogin, &req); err != nil {
		c.reject(wire.RejectProtocol, "malformed login request: "+err.Error())
		return
	}
	c.initiator = req.Initiator
	c.reqTarget = req.Target
	c.session, c.channel = req.Session, req.Channel
	if req.MaxRecvIU != 0 {
		c.iniRecvIU = int(req.MaxRecvIU)
	}
	switch {
	case req.Version != wire.Version:
		c.reject(wire.RejectVersion, fmt.Sprintf("protocol version %d unsupported (want %d)", req.Version, wire.Version))
		return
	case req.Target != "" && req.Target != c.p.name:
		c.reject(wire.RejectAccessDenied, fmt.Sprintf("no target named %q here (this is %q)", req.Target, c.p.name))
		return
	case req.MaxIU > iuSize:
		c.reject(wire.RejectIUTooLarge, fmt.Sprintf("initiator IUs of up to %d bytes, target receives %d", req.MaxIU, iuSize))
		return
	case c.iniRecvIU < 256:
		c.iniRecvIU = iuSize // a reject must still be sendable
		c.reject(wire.RejectIUTooLarge, fmt.Sprintf("initiator receives IUs of %d bytes, target needs at least 256", req.MaxRecvIU))
		return
	case len(req.Nonce) > maxNonce:
		c.reject(wire.RejectProtocol, fmt.Sprintf("login nonce of %d bytes (max %d)", len(req.Nonce), maxNonce))
		return
	}
	if req.Credits > 0 {
		c.credits = min(int(req.Credits), c.p.credits)
	}
	if req.MaxTransfer > 0 {
		c.maxXfer = min(req.MaxTransfer, uint32(c.p.maxXfer))
	}
	if req.MaxDesc > 0 {
		c.maxDesc = min(int(req.MaxDesc), c.p.maxDesc)
	}
	c.remoteInv = req.RemoteInvalidate && c.p.offerInv
	c.maxImm = min(req.MaxImmediate, maxImmediate, c.maxXfer)
	c.notices = req.Notices
	c.pathNotices = req.PathNotices
	if c.p.secrets != nil {
		secret, required := c.p.secrets(req.Initiator)
		c.authMark = c.mark(secret, required)
		if required {
			if len(secret) == 0 {
				c.reject(wire.RejectAuthFailed, "authentication required and no secret configured for this initiator")
				return
			}
			c.secret = secret
			c.iniNonce = append([]byte(nil), req.Nonce...)
			c.tgtNonce = make([]byte, 32)
			c.p.rand(c.tgtNonce)
			c.sendLogin(wire.OpLoginChallenge, &wire.LoginChallenge{Method: "hmac-sha256", Nonce: c.tgtNonce})
			if c.state != connClosed {
				c.setState(connChallenge)
			}
			return
		}
	}
	c.accept(nil)
}

func (c *core) onProof(buf []byte) {
	var p wire.LoginProof
	if err := wire.DecodeControl(buf, wire.OpLoginProof, &p); err != nil {
		c.reject(wire.RejectProtocol, "malformed login proof: "+err.Error())
		return
	}
	want := wire.LoginProofFor(c.secret, "initiator", c.initiator, c.reqTarget, c.iniNonce, c.tgtNonce)
	if !hmac.Equal(p.Proof, want) {
		c.reject(wire.RejectAuthFailed, "the proof does not match the secret the target holds for this initiator")
		return
	}
	c.accept(wire.LoginProofFor(c.secret, "target", c.initiator, c.reqTarget, c.iniNonce, c.tgtNonce))
}

func (c *core) accept(proof []byte) {
	c.sendLogin(wire.OpLoginResponse, &wire.LoginResponse{
		Version: wire.Version, Target: c.p.name, Credits: uint32(c.credits),
		MaxIU: iuSize, MaxRecvIU: uint32(min(iuSize, c.iniRecvIU)),
		MaxTransfer: c.maxXfer, MaxDesc: uint8(c.maxDesc), RemoteInvalidate: c.remoteInv,
		SessionID: c.p.id, Proof: proof, MaxImmediate: c.maxImm, Instance: c.p.instance,
		Notices: c.notices, PathNotices: c.pathNotices,
	})
	if c.state == connClosed {
		return
	}
	c.setState(connActive)
	c.secret = nil
	c.acts.loggedIn = true
}

// mark is the keyed digest of a Config.Secrets answer (see authMark).
func (c *core) mark(secret []byte, required bool) [sha256.Size]byte {
	if c.markKey == nil {
		c.markKey = make([]byte, 32)
		c.p.rand(c.markKey)
	}
	h := hmac.New(sha256.New, c.markKey)
	if required {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	h.Write(secret)
	var m [sha256.Size]byte
	h.Sum(m[:0])
	return m
}

// policyChanged re-evaluates the session against the current ACL and
// secrets (Target.SetACL, Target.PolicyChanged). A session whose
// initiator's secret changed or went away ends: it must log in again
// and prove the new one (a login waiting for its proof is rejected). A
// handle whose volume the ACL no longer allows is revoked: its volume is
// closed and its commands are answered AccessDenied; one narrowed to
// read-only answers writes WriteProtected. Commands the volume is
// already running finish. Wider access is not granted to open handles:
// the initiator asked for, and was told, what it has.
func (c *core) policyChanged(now int64) {
	c.now = now
	switch c.state {
	case connChallenge, connActive, connDraining:
	default:
		// Not logged in yet (the login reads the policy afresh), or
		// ending anyway.
		return
	}
	if c.p.secrets != nil {
		if secret, required := c.p.secrets(c.initiator); c.mark(secret, required) != c.authMark {
			const why = "the initiator's secret changed or was removed: it must log in again"
			c.acts.policy = append(c.acts.policy, policyEffect{reason: why})
			if c.state == connChallenge {
				c.reject(wire.RejectAuthFailed, why)
				return
			}
			c.close(why, false)
			return
		}
	}
	if c.state == connChallenge {
		return
	}
	acl := c.p.acl()
	for _, ov := range c.handles {
		if ov == nil || ov.revoked {
			continue
		}
		switch acc := c.allow(acl, ov.name); {
		case acc == AccessNone:
			ov.revoked = true
			c.handlesGen++
			c.acts.closeVols = append(c.acts.closeVols, ov)
			c.acts.policy = append(c.acts.policy, policyEffect{volume: ov.name, handle: ov.handle, access: AccessNone,
				reason: "access revoked: volume closed"})
		case acc == AccessReadOnly && !ov.ro:
			ov.ro = true
			c.acts.policy = append(c.acts.policy, policyEffect{volume: ov.name, handle: ov.handle, access: AccessReadOnly,
				reason: "access narrowed to read-only"})
		}
	}
}
