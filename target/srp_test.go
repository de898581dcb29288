package target

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// The SRP personality is tested with a minimal SRP initiator written
// here from the internal/srp codecs, on one profile over the tcp and shm
// wires (the data path under it is the gosrp one, tested on every
// profile).
var srpEnvs = []env{{emu.WireTCP, "rxe"}, {emu.WireShm, "rxe"}}

func forSRPEnvs(t *testing.T, f func(t *testing.T, e env)) {
	for _, e := range srpEnvs {
		t.Run(e.String(), func(t *testing.T) {
			t.Parallel()
			f(t, e)
		})
	}
}

// srpTargetPort is the target port the SRP tests' targets are set to.
var srpTargetPort = [16]byte{0: 0x0a, 15: 0x01}

// srpPort is an initiator port identifier ending in b.
func srpPort(b byte) [16]byte { return [16]byte{0: 0xfe, 8: 0x11, 15: b} }

// srpLoginReq is a login as ib_srp sends it over RDMA CM with immediate
// data (srp_send_req): both buffer formats, a single channel.
func srpLoginReq(port byte) srp.LoginRequest {
	return srp.LoginRequest{Tag: 0x5150, MaxITIULen: srpImmOffset + maxImmediate, BufFormats: srpFormats,
		Flags: srp.MultiChanSingle | srp.ImmediateRequested, ImmDataOffset: srpImmOffset,
		InitiatorPortID: srpPort(port), TargetPortID: srpTargetPort}
}

// srpClient is the test's SRP initiator: the rig's raw client speaking
// SRP IUs.
type srpClient struct {
	*client
	rsp srp.LoginResponse
}

// srpDial connects with req in the connection request's private data
// and returns the client and the login response, or the transport's
// error (a *transport.RejectError for an SRP_LOGIN_REJ).
func (r *rig) srpDial(tb testing.TB, req srp.LoginRequest) (*srpClient, error) {
	tb.Helper()
	b := make([]byte, srp.LoginRequestRDMALen)
	if _, err := req.EncodeRDMA(b); err != nil {
		tb.Fatal(err)
	}
	c, err := r.dialHello(tb, b)
	if err != nil {
		return nil, err
	}
	sc := &srpClient{client: c}
	if err := sc.rsp.Decode(c.cm.PrivateData()); err != nil {
		tb.Fatalf("login response: %v", err)
	}
	return sc, nil
}

// srpReject dials with req and returns the SRP_LOGIN_REJ it must get.
func (r *rig) srpReject(tb testing.TB, req srp.LoginRequest) srp.LoginReject {
	tb.Helper()
	_, err := r.srpDial(tb, req)
	var rerr *transport.RejectError
	if !errors.As(err, &rerr) {
		tb.Fatalf("login answered %v, want a reject", err)
	}
	var rej srp.LoginReject
	if err := rej.Decode(rerr.PrivateData); err != nil {
		tb.Fatalf("reject private data: %v", err)
	}
	return rej
}

func (c *srpClient) logout() {
	c.tb.Helper()
	var b [srp.LogoutLen]byte
	(&srp.ILogout{Tag: 99}).Encode(b[:])
	if err := c.sendIU(b[:]); err != nil {
		c.tb.Fatal(err)
	}
	c.expectDisconnect()
}

// TestSRPLogin: an SRP_LOGIN_REQ in the RDMA-CM form is answered with an
// SRP_LOGIN_RSP in the accept (credits, IU limits, formats, immediate
// data at ib_srp's offset), or with an SRP_LOGIN_REJ naming why, in
// ib_srpt's order of checks; SRP_I_LOGOUT ends the channel.
func TestSRPLogin(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		denied := srpInitiatorName(srpPort(0xdd))
		r := newRig(t, e, Config{SRPTargetPortID: srpTargetPort,
			ACL: &ACL{Rules: []ACLRule{{Initiator: denied, Volume: "*", Access: AccessNone}}}})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		want := srp.LoginResponse{ReqLimDelta: 8, Tag: 0x5150, MaxITIULen: recvSize, MaxTIIULen: srpMaxTIIU,
			BufFormats: srpFormats, Flags: srp.MultiChanNoChannel | srp.ImmediateSupported}
		if c.rsp != want {
			t.Errorf("login response %+v, want %+v", c.rsp, want)
		}
		waitFor(t, "the SRP session in Stats", func() bool {
			s := r.tgt.Stats()
			return len(s.Conns) == 1 && s.Conns[0].Initiator == srpInitiatorName(srpPort(1)) && s.Conns[0].OpenVolumes == 3
		})
		c.logout()

		noImm := srpLoginReq(2)
		noImm.Flags = srp.MultiChanMulti
		c, err = r.srpDial(t, noImm)
		if err != nil {
			t.Fatal(err)
		}
		if c.rsp.Flags != srp.MultiChanMaintained {
			t.Errorf("login without immediate data, MULTI: flags %#x, want %#x", c.rsp.Flags, srp.MultiChanMaintained)
		}
		c.logout()

		for _, tc := range []struct {
			name string
			edit func(*srp.LoginRequest)
			want srp.RejectReason
		}{
			{"it_iu_len 0", func(r *srp.LoginRequest) { r.MaxITIULen = 0 }, srp.RejectITIULenTooLarge},
			{"it_iu_len too large", func(r *srp.LoginRequest) { r.MaxITIULen = recvSize + 1 }, srp.RejectITIULenTooLarge},
			{"another target port", func(r *srp.LoginRequest) { r.TargetPortID[15] = 2 }, srp.RejectUnableToAssociate},
			{"unknown buffer format", func(r *srp.LoginRequest) { r.BufFormats |= 1 << 3 }, srp.RejectUnsupportedFormat},
			{"multi-channel action 3", func(r *srp.LoginRequest) { r.Flags |= 3 }, srp.RejectMultiChanUnsupported},
			{"ACL denies every volume", func(r *srp.LoginRequest) { r.InitiatorPortID = srpPort(0xdd) }, srp.RejectUnableToEstablish},
		} {
			req := srpLoginReq(3)
			tc.edit(&req)
			rej := r.srpReject(t, req)
			if rej.Reason != tc.want || rej.Tag != req.Tag || rej.BufFormats != srpFormats {
				t.Errorf("%s: reject %+v, want reason %s, tag %#x", tc.name, rej, tc.want, req.Tag)
			}
		}
		if s := r.tgt.Stats(); s.Rejected != 6 || s.Accepted != 2 {
			t.Errorf("stats: %d accepted, %d rejected; want 2 and 6", s.Accepted, s.Rejected)
		}
	})
}
