package initiator

// The synchronous exchange on a new connection, before its loop runs: the
// pool's prologue, the login, and control requests answered on the spot
// (re-opens).

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"fmt"

	"github.com/gosrp/gosrp/internal/clock"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// postChain admits, posts and records a chain outside the core (login,
// the drain marker).
func (c *channel) postChain(chain []transport.SendWR) (int, error) {
	pool := c.core.pool
	if err := pool.Admit(chain); err != nil {
		return 0, err
	}
	n, err := c.qp.PostSend(chain)
	pool.Posted(chain, n)
	return n, err
}

// postPrologue posts what the pool needs first on a new QP (the
// registration fence's barrier, frmr.Pool.Prologue), before anything a
// retry could rewind over.
func (c *channel) postPrologue() error {
	chain := c.core.pool.Prologue(nil)
	if len(chain) == 0 {
		return nil
	}
	if _, err := c.postChain(chain); err != nil {
		return fmt.Errorf("initiator: post the registration fence: %w", err)
	}
	return nil
}

// sendIUSync posts one control IU from the spare send buffer (login only).
func (c *channel) sendIUSync(iu []byte) error {
	if len(iu) > sendIU {
		return fmt.Errorf("initiator: %d-byte IU: %w", len(iu), wire.ErrTooLarge)
	}
	buf := c.arena.Bytes()[c.rqDepth*recvIU:]
	copy(buf, iu)
	c.loginSGE[0] = transport.SGE{Addr: c.mr.Addr() + uint64(c.rqDepth*recvIU), Length: uint32(len(iu)), LKey: c.mr.LKey()}
	c.loginWR[0] = transport.SendWR{ID: sendID(0xfffff, 0), Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: c.loginSGE[:]}
	if _, err := c.postChain(c.loginWR[:]); err != nil {
		return fmt.Errorf("initiator: send %s: %w", wire.Opcode(iu[0]), err)
	}
	return nil
}

// recvIUSync polls until a receive arrives (login only) and returns its
// bytes and index.
func (c *channel) recvIUSync(ctx context.Context) ([]byte, int, error) {
	for {
		n, err := c.cq.Poll(c.wcs[:])
		if err != nil {
			return nil, 0, err
		}
		for i := 0; i < n; i++ {
			wc := &c.wcs[i]
			if wc.ID>>56 != idRecv {
				c.core.pool.OnSendCompletion(wc)
				if wc.Status != transport.StatusSuccess {
					return nil, 0, fmt.Errorf("initiator: login send failed: %s: %w", wc.Status, transport.ErrDisconnected)
				}
				continue
			}
			if wc.Status != transport.StatusSuccess {
				return nil, 0, fmt.Errorf("initiator: login receive failed: %s: %w", wc.Status, transport.ErrDisconnected)
			}
			idx := int(wc.ID & 0xffffff)
			b := c.arena.Bytes()[idx*recvIU : idx*recvIU+int(wc.ByteLen)]
			// Remaining completions of this batch are sends; handle them
			// before returning so none is lost.
			for j := i + 1; j < n; j++ {
				if c.wcs[j].ID>>56 == idRecv {
					if c.wcs[j].Status != transport.StatusSuccess {
						// A receive flushed because the target hung up
						// after this IU (a LoginReject, say): no IU.
						continue
					}
					return nil, 0, fmt.Errorf("initiator: unexpected IU during login: %w", ErrProtocol)
				}
				c.core.pool.OnSendCompletion(&c.wcs[j])
			}
			return b, idx, nil
		}
		if n == 0 {
			if err := c.cq.Wait(ctx); err != nil {
				return nil, 0, fmt.Errorf("initiator: login: %w", err)
			}
		}
	}
}

func (c *channel) repost(idx int) error {
	_, err := c.qp.PostRecv(c.recvWRs[idx : idx+1])
	return err
}

func (c *channel) login(ctx context.Context) error {
	s := c.s
	var nonce [32]byte
	rand.Read(nonce[:])
	req := wire.LoginRequest{Version: wire.Version, Initiator: s.cfg.Name, Credits: uint32(s.cfg.Credits),
		MaxIU: wire.MaxCommandLen, MaxRecvIU: recvIU, MaxTransfer: uint32(s.cfg.MaxTransfer), MaxDesc: 1,
		RemoteInvalidate: !c.localInv, Nonce: nonce[:], Session: s.id, Channel: uint16(c.id),
		Notices: true, PathNotices: true}
	if c.sendSGEs() == 2 {
		req.MaxImmediate = uint32(s.cfg.ImmediateData)
	}
	iu, err := wire.EncodeControl(nil, wire.OpLogin, &req)
	if err != nil {
		return err
	}
	if err := c.sendIUSync(iu); err != nil {
		return err
	}
	var targetNonce []byte
	for {
		b, idx, err := c.recvIUSync(ctx)
		if err != nil {
			return err
		}
		op, _ := wire.PeekOpcode(b)
		switch op {
		case wire.OpLoginChallenge:
			var ch wire.LoginChallenge
			if err := wire.DecodeControl(b, op, &ch); err != nil {
				return fmt.Errorf("initiator: %w: %w", ErrProtocol, err)
			}
			if s.cfg.Secret == nil {
				return fmt.Errorf("initiator: target %s demands authentication and no secret is configured: %w", s.cfg.Addr, ErrAuth)
			}
			if ch.Method != "hmac-sha256" {
				return fmt.Errorf("initiator: unknown authentication method %q: %w", ch.Method, ErrAuth)
			}
			targetNonce = append([]byte(nil), ch.Nonce...)
			proof := wire.LoginProofFor(s.cfg.Secret, "initiator", s.cfg.Name, "", nonce[:], targetNonce)
			iu, err := wire.EncodeControl(nil, wire.OpLoginProof, &wire.LoginProof{Proof: proof})
			if err != nil {
				return err
			}
			if err := c.repost(idx); err != nil {
				return err
			}
			if err := c.sendIUSync(iu); err != nil {
				return err
			}
		case wire.OpLoginReject:
			var rej wire.LoginReject
			if err := wire.DecodeControl(b, op, &rej); err != nil {
				return fmt.Errorf("initiator: %w: %w", ErrProtocol, err)
			}
			return &LoginError{Reason: RejectReason(rej.Reason), Message: rej.Message}
		case wire.OpLoginResponse:
			var rsp wire.LoginResponse
			if err := wire.DecodeControl(b, op, &rsp); err != nil {
				return fmt.Errorf("initiator: %w: %w", ErrProtocol, err)
			}
			if s.cfg.Secret != nil {
				want := wire.LoginProofFor(s.cfg.Secret, "target", s.cfg.Name, "", nonce[:], targetNonce)
				if targetNonce == nil || !hmac.Equal(rsp.Proof, want) {
					return fmt.Errorf("initiator: target %q did not prove the shared secret: %w", rsp.Target, ErrAuth)
				}
			}
			if err := c.repost(idx); err != nil {
				return err
			}
			if rsp.Credits == 0 || rsp.MaxTransfer < uint32(transport.PageSize) {
				return fmt.Errorf("initiator: target granted %d credits, %d-byte transfers: %w", rsp.Credits, rsp.MaxTransfer, ErrProtocol)
			}
			c.maxTransfer = min(int(rsp.MaxTransfer), s.cfg.MaxTransfer, c.regMax)
			c.core.connected(login{
				credits:   min(int(rsp.Credits), s.cfg.Credits),
				remoteInv: rsp.RemoteInvalidate && !c.localInv,
				maxImm:    min(int(rsp.MaxImmediate), int(req.MaxImmediate)),
				at:        clock.Nanos(),
				// rqDepth keeps one receive beyond the credits for them.
				pathNotices: rsp.PathNotices,
			})
			s.noteLogin(c.id, rsp.Target, c.maxTransfer)
			s.noteInstance(c, rsp.Instance)
			return nil
		default:
			return fmt.Errorf("initiator: %s during login: %w", op, ErrProtocol)
		}
	}
}

// controlSync runs a control request on a channel that is not yet
// looping (reconnect); it uses slot 0.
func (c *channel) controlSync(ctx context.Context, req *wire.ControlRequest) (*wire.ControlResponse, error) {
	req.Tag = 0
	iu, err := wire.EncodeControl(nil, wire.OpControl, req)
	if err != nil {
		return nil, err
	}
	if err := c.sendIUSync(iu); err != nil {
		return nil, err
	}
	b, idx, err := c.recvIUSync(ctx)
	if err != nil {
		return nil, err
	}
	var rsp wire.ControlResponse
	if err := wire.DecodeControl(b, wire.OpControlResp, &rsp); err != nil {
		return nil, fmt.Errorf("initiator: %w: %w", ErrProtocol, err)
	}
	return &rsp, c.repost(idx)
}
