package target

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// The SRP personality is tested with a minimal SRP initiator written
// here from the internal/srp codecs, on every emu profile over the loop
// wire, and on rxe, the profile of the kernel's peers, over the tcp and
// shm wires too.
var srpEnvs = func() []env {
	var l []env
	for _, p := range emu.Profiles() {
		l = append(l, env{emu.WireLoop, p})
	}
	return append(l, env{emu.WireTCP, "rxe"}, env{emu.WireShm, "rxe"})
}()

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
	login srp.LoginResponse
	// credited is the credits SRP_CRED_REQs returned (mustNext).
	credited uint32
}

// mustNext waits for the next IU from the target that is not an
// SRP_CRED_REQ: one of those is answered SRP_CRED_RSP as ib_srp answers
// it (srp_process_cred_req), its credits counted in credited.
func (c *srpClient) mustNext() ([]byte, transport.WC) {
	c.tb.Helper()
	for {
		b, wc := c.client.mustNext()
		if len(b) == 0 || srp.Opcode(b[0]) != srp.OpCredReq {
			return b, wc
		}
		var q srp.CredReq
		if err := q.Decode(b); err != nil {
			c.tb.Fatalf("SRP_CRED_REQ: %v", err)
		}
		c.credited += q.ReqLimDelta
		c.credRsp(q.Tag)
	}
}

// credRsp sends the SRP_CRED_RSP answering the SRP_CRED_REQ tagged tag.
func (c *srpClient) credRsp(tag uint64) {
	c.tb.Helper()
	var b [srp.TargetRspLen]byte
	(&srp.TargetRsp{Op: srp.OpCredRsp, Tag: tag}).Encode(b[:])
	if err := c.sendIU(b[:]); err != nil {
		c.tb.Fatal(err)
	}
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
	if err := sc.login.Decode(c.cm.PrivateData()); err != nil {
		tb.Fatalf("login response: %v", err)
	}
	return sc, nil
}

// srpLoggedIn starts a rig with cfg and logs a client in as ib_srp
// does (srpLoginReq).
func srpLoggedIn(t *testing.T, e env, cfg Config) (*rig, *srpClient) {
	t.Helper()
	r := newRig(t, e, cfg)
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	return r, c
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
		if c.login != want {
			t.Errorf("login response %+v, want %+v", c.login, want)
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
		if c.login.Flags != srp.MultiChanMaintained {
			t.Errorf("login without immediate data, MULTI: flags %#x, want %#x", c.login.Flags, srp.MultiChanMaintained)
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

// TestSRPCredits: an SRP login is granted Config.SRPCredits, by default
// 64 so that ib_srp, which keeps one back for task management and caps
// its queue at the rest, runs its default queue of 62 full (and a QD32
// job all 32); a gosrp login on the same target still gets Credits.
// The SRP channel holds 32 READs outstanding at once.
func TestSRPCredits(t *testing.T) {
	for _, tc := range []struct {
		in, want int
		ok       bool
	}{{0, DefaultSRPCredits, true}, {1, 1, true}, {200, 200, true}, {-1, 0, false}, {MaxCredits + 1, 0, false}} {
		cfg := Config{Catalog: sliceCatalog{}, SRPCredits: tc.in}
		err := cfg.normalize()
		if (err == nil) != tc.ok || (tc.ok && cfg.SRPCredits != tc.want) {
			t.Errorf("SRPCredits %d: got %d, %v; want %d, ok %t", tc.in, cfg.SRPCredits, err, tc.want, tc.ok)
		}
	}
	if DefaultSRPCredits-1 < 62 {
		t.Errorf("DefaultSRPCredits %d leaves ib_srp fewer than its default 62 commands", DefaultSRPCredits)
	}
	r, c := srpLoggedIn(t, srpEnvs[0], Config{SRPCredits: DefaultSRPCredits})
	if c.login.ReqLimDelta != DefaultSRPCredits {
		t.Fatalf("SRP login granted %d credits, want %d", c.login.ReqLimDelta, DefaultSRPCredits)
	}
	if lr := r.dial(t).login("ini"); lr.Credits != 8 {
		t.Errorf("gosrp login granted %d credits beside the SRP session, want Credits 8", lr.Credits)
	}
	const qd = 32
	tags := map[uint64]bool{}
	for i := range qd {
		tags[c.post(c.in(srpCmd(0, rw10(0x28, uint32(i), 1, false)...), i*4096, 4096))] = true
	}
	for range qd {
		r := c.rsp()
		if !tags[r.Tag] || r.Status != uint8(scsi.StatusGood) {
			t.Fatalf("READ answered tag %#x status %#x", r.Tag, r.Status)
		}
		delete(tags, r.Tag)
	}
	if s := r.tgt.Stats(); s.Violations != 0 {
		t.Errorf("%d violations at QD%d", s.Violations, qd)
	}
}

// srpCmd builds an SRP_CMD for lun with cdb.
func srpCmd(lun uint16, cdb ...byte) srp.Cmd {
	return srp.Cmd{LUN: scsi.EncodeLUN(lun), CDB: cdb}
}

// in gives cmd a direct data-in descriptor over client data [off, off+n).
func (c *srpClient) in(cmd srp.Cmd, off, n int) srp.Cmd {
	d := c.desc(off, n)
	cmd.DataIn = srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: d.VA, Key: d.RKey, Len: d.Len}}
	return cmd
}

// out gives cmd a direct data-out descriptor over client data [off, off+n).
func (c *srpClient) out(cmd srp.Cmd, off, n int) srp.Cmd {
	d := c.desc(off, n)
	cmd.DataOut = srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: d.VA, Key: d.RKey, Len: d.Len}}
	return cmd
}

// pieces describes client data [off, off+n) in k pieces, in order.
func (c *srpClient) pieces(off, n, k int) []srp.Descriptor {
	descs := make([]srp.Descriptor, k)
	per := n / k
	for i := range descs {
		l := per
		if i == k-1 {
			l = n - per*(k-1)
		}
		d := c.desc(off+i*per, l)
		descs[i] = srp.Descriptor{VA: d.VA, Key: d.RKey, Len: d.Len}
	}
	return descs
}

// indirect describes client data [off, off+n) in k pieces, as an
// indirect table wholly inline (ib_srp's form for a scatterlist).
func (c *srpClient) indirect(off, n, k int) srp.DataBuffer {
	b := srp.DataBuffer{Format: srp.FormatIndirect, Total: uint32(n),
		Table: srp.Descriptor{VA: 0x1000, Key: 1, Len: uint32(k * srp.DescriptorLen)}}
	if err := b.SetPartial(c.pieces(off, n, k), make([]byte, k*srp.DescriptorLen)); err != nil {
		c.tb.Fatal(err)
	}
	return b
}

// srpTableOff is where in the client's data the tests put indirect
// tables for the target to fetch, away from the data they move.
const srpTableOff = 1 << 20

// fetched is an indirect table of descs of which only the first inline
// ride in the IU, as ib_srp sends one longer than cmd_sg_entries
// (srp_map_data with allow_ext_sg): the whole table is written to client
// memory at srpTableOff, where the target must RDMA READ it with the
// table descriptor's key.
func (c *srpClient) fetched(descs []srp.Descriptor, inline int) srp.DataBuffer {
	tbl := c.data(srpTableOff, len(descs)*srp.DescriptorLen)
	var total uint32
	for i, d := range descs {
		d.Encode(tbl[i*srp.DescriptorLen:])
		total += d.Len
	}
	t := c.desc(srpTableOff, len(tbl))
	b := srp.DataBuffer{Format: srp.FormatIndirect, Total: total, Table: srp.Descriptor{VA: t.VA, Key: t.RKey, Len: t.Len}}
	if err := b.SetPartial(descs[:inline], make([]byte, inline*srp.DescriptorLen)); err != nil {
		c.tb.Fatal(err)
	}
	return b
}

// post sends an SRP_CMD without waiting; it returns the tag.
func (c *srpClient) post(cmd srp.Cmd) uint64 {
	c.tb.Helper()
	c.tag++
	return c.postTag(cmd, c.tag<<8|0x5a) // not a small integer: the tag is opaque
}

// postTag sends an SRP_CMD under tag without waiting; it returns tag.
func (c *srpClient) postTag(cmd srp.Cmd, tag uint64) uint64 {
	c.tb.Helper()
	cmd.Tag = tag
	b := make([]byte, cmd.EncodedLen())
	if _, err := cmd.Encode(b); err != nil {
		c.tb.Fatal(err)
	}
	var extra []transport.SGE
	if cmd.DataOut.Format == srp.FormatImmediate {
		// ib_srp pads to the agreed offset and gathers the data from
		// where it is as a second SGE (srp_map_idb).
		b = append(b, make([]byte, srpImmOffset-len(b))...)
		const stage = cliDataSize - maxImmediate
		copy(c.data(stage, len(cmd.DataOut.Imm)), cmd.DataOut.Imm)
		extra = append(extra, transport.SGE{Addr: c.desc(stage, 0).VA, Length: uint32(len(cmd.DataOut.Imm)), LKey: c.mr.LKey()})
	}
	if err := c.sendIU(b, extra...); err != nil {
		c.tb.Fatal(err)
	}
	return cmd.Tag
}

// rsp waits for the next IU, which must be an SRP_RSP returning one
// credit.
func (c *srpClient) rsp() srp.Rsp {
	c.tb.Helper()
	r := c.next()
	if r.ReqLimDelta != 1 {
		c.tb.Fatalf("SRP_RSP returns %d credits, want 1", r.ReqLimDelta)
	}
	return r
}

// do runs one SRP_CMD and returns its SRP_RSP.
func (c *srpClient) do(cmd srp.Cmd) srp.Rsp {
	c.tb.Helper()
	tag := c.post(cmd)
	r := c.rsp()
	if r.Tag != tag {
		c.tb.Fatalf("SRP_RSP tag %#x, want %#x", r.Tag, tag)
	}
	return r
}

// good fails unless r is GOOD with the residual flags given.
func (c *srpClient) good(what string, r srp.Rsp, flags uint8) {
	c.tb.Helper()
	if r.Status != uint8(scsi.StatusGood) || r.Flags != flags {
		s, _ := scsi.ParseSense(r.Sense)
		c.tb.Fatalf("%s: status %s flags %#x sense %s, want GOOD flags %#x", what, scsi.Status(r.Status), r.Flags, s, flags)
	}
}

// checkSense fails unless r is CHECK CONDITION with sense want.
func (c *srpClient) checkSense(what string, r srp.Rsp, want scsi.Sense) {
	c.tb.Helper()
	s, err := scsi.ParseSense(r.Sense)
	if r.Status != uint8(scsi.StatusCheckCondition) || err != nil || s != want {
		c.tb.Fatalf("%s: status %s sense %s (%v), want CHECK CONDITION %s", what, scsi.Status(r.Status), s, err, want)
	}
}

// The rig's volumes as LUNs, in name order.
const (
	lunRO   = 0 // "ro", read-only
	lunVol0 = 1
	lunVol1 = 2
)

// TestSRPCommands: SCSI commands without block data through an SRP
// session: INQUIRY, REPORT LUNS, TEST UNIT READY, READ CAPACITY 10/16,
// SYNCHRONIZE CACHE and REPORT SUPPORTED OPERATION CODES answer GOOD with their data by RDMA WRITE and
// the residuals of SAM-5; an unknown opcode and a LUN with no volume
// get the standard refusals; a LOGICAL UNIT RESET with nothing in flight
// completes.
func TestSRPCommands(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		clear(c.data(0, 4096))
		rsp := c.do(c.in(srpCmd(lunVol0, 0x12, 0, 0, 0, 96, 0), 0, 200))
		c.good("INQUIRY", rsp, srp.DIUnder)
		if rsp.DataInResid != 200-36 { // standard INQUIRY data is 36 bytes
			t.Errorf("INQUIRY data-in residual %d, want %d", rsp.DataInResid, 200-36)
		}
		if inq := c.data(0, 36); inq[0] != 0 || string(inq[8:13]) != "GOSRP" {
			t.Errorf("INQUIRY data % x", inq)
		}

		clear(c.data(0, 64))
		c.good("REPORT LUNS", c.do(c.in(srpCmd(lunVol0, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0), 0, 40)), srp.DIUnder)
		if got := c.data(0, 32); got[3] != 24 || got[8+1] != 0 || got[16+1] != 1 || got[24+1] != 2 {
			t.Errorf("REPORT LUNS data % x, want 3 LUNs 0, 1, 2", got)
		}

		c.good("TEST UNIT READY", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0)

		c.good("READ CAPACITY(10)", c.do(c.in(srpCmd(lunVol1, 0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0), 0, 8)), 0)
		if got, want := c.data(0, 8), []byte{0, 0, 0, volSize/bs - 1, 0, 0, bs >> 8, 0}; string(got) != string(want) {
			t.Errorf("READ CAPACITY(10) data % x, want % x", got, want)
		}
		// 32 bytes asked for, 16 bytes of descriptor: the rest is DIOVER.
		rsp = c.do(c.in(srpCmd(lunRO, 0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0), 0, 16))
		c.good("READ CAPACITY(16)", rsp, srp.DIOver)
		if rsp.DataInResid != 16 {
			t.Errorf("READ CAPACITY(16) data-in overflow %d, want 16", rsp.DataInResid)
		}
		if got := c.data(0, 12); got[7] != volSize/bs-1 || got[10] != bs>>8 {
			t.Errorf("READ CAPACITY(16) data % x", got)
		}

		c.good("SYNCHRONIZE CACHE(10)", c.do(srpCmd(lunVol0, 0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0)), 0)
		// REPORT SUPPORTED OPERATION CODES, one command, as Linux's
		// sd_read_write_same asks it: WRITE SAME(16) is supported.
		clear(c.data(0, 64))
		c.good("REPORT SUPPORTED OPERATION CODES", c.do(c.in(srpCmd(lunVol0, 0xA3, 0x0C, 1, 0x93, 0, 0, 0, 0, 0, 64, 0, 0), 0, 64)), srp.DIUnder)
		if got := c.data(0, 5); got[1]&7 != 3 || got[3] != 16 || got[4] != 0x93 {
			t.Errorf("REPORT SUPPORTED OPERATION CODES data % x, want WRITE SAME(16) supported", got)
		}
		c.checkSense("opcode 0xC0", c.do(srpCmd(lunVol0, 0xC0, 0, 0, 0, 0, 0)), scsi.SenseInvalidOpcode)
		c.checkSense("TEST UNIT READY on LUN 9", c.do(srpCmd(9, 0, 0, 0, 0, 0, 0)), scsi.SenseLUNotSupported)

		c.tmfRsp("LOGICAL UNIT RESET", c.tmf(srp.TaskLUNReset, lunVol0, 0), srp.TaskComplete, 1)
		c.logout()
	})
}

// rw10 is a READ(10) or WRITE(10) CDB (op 0x28 or 0x2A); fua sets FUA.
func rw10(op byte, lba uint32, blocks uint16, fua bool) []byte {
	cdb := []byte{op, 0, byte(lba >> 24), byte(lba >> 16), byte(lba >> 8), byte(lba), 0, byte(blocks >> 8), byte(blocks), 0}
	if fua {
		cdb[1] = 0x08
	}
	return cdb
}

// rw16 is a READ(16) or WRITE(16) CDB (op 0x88 or 0x8A).
func rw16(op byte, lba uint64, blocks uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], blocks)
	return cdb
}

// TestSRPReadWrite: blocks written through an SRP session (RDMA READ of
// a direct descriptor, of an inline indirect table, and immediate data
// with FUA) read back the same through READ(10) and READ(16) by RDMA
// WRITE, are in the volume after SYNCHRONIZE CACHE, and longer
// descriptors are reported as DOUNDER/DIUNDER; a read-only LUN and an
// LBA past the end are refused with their sense.
func TestSRPReadWrite(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		const n = 64 << 10
		want := pattern(n, 3)
		copy(c.data(0, n), want)
		c.good("WRITE(10) direct", c.do(c.out(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x2A, 4, n/bs, false)}, 0, n)), 0)
		clear(c.data(n, n+bs))
		rsp := c.do(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw16(0x88, 4, n/bs)}, n, n+bs))
		c.good("READ(16) direct", rsp, srp.DIUnder)
		if rsp.DataInResid != bs {
			t.Errorf("READ(16) residual %d, want %d", rsp.DataInResid, bs)
		}
		if !bytes.Equal(c.data(n, n), want) {
			t.Fatal("READ(16) returned other bytes than WRITE(10) wrote")
		}

		want2 := pattern(3*bs, 9)
		copy(c.data(0, 3*bs), want2)
		c.good("WRITE(16) indirect", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw16(0x8A, 10, 3), DataOut: c.indirect(0, 3*bs, 3)}), 0)
		clear(c.data(n, 3*bs))
		c.good("READ(10) indirect", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw10(0x28, 10, 3, false), DataIn: c.indirect(n, 3*bs, 2)}), 0)
		if !bytes.Equal(c.data(n, 3*bs), want2) {
			t.Fatal("READ(10) through an indirect table returned other bytes than were written")
		}

		want3 := pattern(bs, 0x77)
		c.good("WRITE(10) immediate FUA", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw10(0x2A, 0, 1, true),
			DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: bs, Imm: want3}}), 0)
		clear(c.data(0, bs))
		c.good("READ(10) after immediate", c.do(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw10(0x28, 0, 1, false)}, 0, bs)), 0)
		if !bytes.Equal(c.data(0, bs), want3) {
			t.Fatal("READ(10) returned other bytes than the immediate WRITE(10) carried")
		}

		c.checkSense("WRITE(10) to the read-only LUN", c.do(c.out(srp.Cmd{LUN: scsi.EncodeLUN(lunRO), CDB: rw10(0x2A, 0, 1, false)}, 0, bs)), scsi.SenseWriteProtected)
		c.checkSense("READ(10) past the end", c.do(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, volSize/bs, 1, false)}, 0, bs)), scsi.SenseLBAOutOfRange)
		c.good("SYNCHRONIZE CACHE(10)", c.do(srpCmd(lunVol0, 0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0)), 0)
		c.logout()

		for _, x := range []struct {
			vol  string
			off  int64
			want []byte
		}{{"vol0", 4 * bs, want}, {"vol1", 10 * bs, want2}, {"vol1", 0, want3}} {
			v, err := r.store.Open(x.vol)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(x.want))
			if _, err := v.ReadAt(got, x.off); err != nil {
				t.Fatal(err)
			}
			v.Close()
			if !bytes.Equal(got, x.want) {
				t.Errorf("%s at %d: the volume holds other bytes than were written", x.vol, x.off)
			}
		}
	})
}

// TestSRPHostile: malformed SRP requests are answered CHECK CONDITION,
// INVALID FIELD IN CDB without touching the volume or the initiator's
// memory, and the session goes on; an IU too short to carry its tag, or
// with an opcode no initiator sends, ends the connection as a protocol
// violation. Never a hang.
func TestSRPHostile(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		noImm := srpLoginReq(1)
		noImm.Flags &^= srp.ImmediateRequested
		c, err := r.srpDial(t, noImm)
		if err != nil {
			t.Fatal(err)
		}
		lun := scsi.EncodeLUN(lunVol0)
		sentinel := pattern(4*bs, 0xee)
		copy(c.data(0, 4*bs), sentinel)
		badTable := c.indirect(0, 2*bs, 2)
		badTable.Table.Len = 24 // not whole descriptors
		badTotal := c.indirect(0, 2*bs, 2)
		badTotal.Total = bs // the table says 8 KiB
		for _, tc := range []struct {
			name string
			cmd  srp.Cmd
		}{
			{"READ(10) of 4 blocks into a 1-block descriptor", c.in(srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 4, false)}, 0, bs)},
			{"WRITE(10) of 4 blocks from a 1-block descriptor", c.out(srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 4, false)}, 0, bs)},
			{"READ(10) with a data-out descriptor", c.out(srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 1, false)}, 0, bs)},
			{"indirect table of 24 bytes", srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 2, false), DataOut: badTable}},
			{"fetched table summing short of its total", srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 2, false), DataOut: c.fetchedShort()}},
			{"fetched table unlike its inline part", srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 2, false), DataOut: c.fetchedChanged()}},
			{"table of 2049 descriptors", srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 1, false), DataIn: c.fetched(c.pieces(0, 4*bs, srpMaxDesc+1), 4)}},
			{"indirect total unlike its descriptors", srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 1, false), DataIn: badTotal}},
			{"both directions", c.in(c.out(srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, 1, false)}, 0, bs), bs, bs)},
			{"immediate data the login did not accept", srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 1, false),
				DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: bs, Imm: make([]byte, bs)}}},
		} {
			c.checkSense(tc.name, c.do(tc.cmd), scsi.SenseInvalidField)
		}
		if !bytes.Equal(c.data(0, 4*bs), sentinel) {
			t.Error("a refused command wrote to the initiator's memory")
		}
		v, _ := r.store.Open("vol0")
		got := make([]byte, 4*bs)
		v.ReadAt(got, 0)
		v.Close()
		if !bytes.Equal(got, make([]byte, 4*bs)) {
			t.Error("a refused command wrote to the volume")
		}
		c.good("TEST UNIT READY after the refusals", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0)
		c.logout()

		for i, iu := range [][]byte{
			{byte(srp.OpCmd), 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}, // 20 bytes of SRP_CMD
			{byte(srp.OpTaskMgmt), 0, 0, 0},
			{0x7f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			{byte(srp.OpLoginRsp)},
		} {
			c, err := r.srpDial(t, srpLoginReq(2))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.sendIU(iu); err != nil {
				t.Fatal(err)
			}
			c.expectDisconnect()
			waitFor(t, "the violation counted", func() bool { return r.tgt.Stats().Violations == uint64(i+1) })
		}
	})
}

// fetchedShort is a table not wholly inline whose descriptors, once
// fetched, sum to a block less than the IU announces.
func (c *srpClient) fetchedShort() srp.DataBuffer {
	b := c.fetched(c.pieces(0, 2*bs, 2), 1)
	b.Total += bs
	return b
}

// fetchedChanged is a table not wholly inline whose memory copy differs
// from what rode inline (the sum still right).
func (c *srpClient) fetchedChanged() srp.DataBuffer {
	d := c.pieces(0, 2*bs, 2)
	b := c.fetched(d, 1)
	d[0].VA += bs
	d[1].VA -= bs
	c.fetched(d, 0) // the table in memory now lists the pieces swapped
	return b
}

// writeReversed writes k blocks at block 8 of vol0 from the client's
// data cut in n pieces, through a fetched table listing the pieces last
// first with inline of them in the IU, checks the volume holds them in
// that order, and returns what it holds.
func (r *rig) writeReversed(t *testing.T, c *srpClient, k, n, inline int) []byte {
	t.Helper()
	src := pattern(k*bs, byte(n))
	copy(c.data(0, k*bs), src)
	rev := c.pieces(0, k*bs, n)
	slices.Reverse(rev)
	c.good(fmt.Sprintf("WRITE(16) through a fetched table of %d", n),
		c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw16(0x8A, 8, uint32(k)), DataOut: c.fetched(rev, inline)}), 0)
	per := k * bs / n
	want := make([]byte, 0, k*bs) // the client's pieces, last first
	for i := n - 1; i >= 0; i-- {
		want = append(want, src[i*per:(i+1)*per]...)
	}
	v, err := r.store.Open("vol0")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, k*bs)
	v.ReadAt(got, 8*bs)
	v.Close()
	if !bytes.Equal(got, want) {
		t.Fatalf("the volume does not hold the pieces in the order of the fetched table of %d", n)
	}
	return want
}

// TestSRPFetchedTable: an indirect table of which only part rides in
// the SRP_CMD is fetched by RDMA READ with its own key and drives the
// transfer: a WRITE(16) through five descriptors listing the client's
// blocks last first, two inline, lands them in that order in the
// volume; a READ(10) through a table with none inline returns them to
// the pieces it lists; INQUIRY's data-in goes through one too.
func TestSRPFetchedTable(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, c := srpLoggedIn(t, e, Config{})
		const k = 5
		want := r.writeReversed(t, c, k, k, 2)
		clear(c.data(2*k*bs, k*bs))
		c.good("READ(10) through a fetched table", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 8, k, false),
			DataIn: c.fetched(c.pieces(2*k*bs, k*bs, k), 0)}), 0)
		if !bytes.Equal(c.data(2*k*bs, k*bs), want) {
			t.Fatal("READ(10) through a fetched table returned other bytes than were written")
		}

		clear(c.data(0, 64))
		rsp := c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: []byte{0x12, 0, 0, 0, 96, 0}, DataIn: c.fetched(c.pieces(0, 64, 4), 1)})
		c.good("INQUIRY through a fetched table", rsp, srp.DIUnder)
		if inq := c.data(0, 36); string(inq[8:13]) != "GOSRP" || rsp.DataInResid != 64-36 {
			t.Errorf("INQUIRY data % x, residual %d", inq, rsp.DataInResid)
		}
		c.logout()
	})
}

// TestSRPLongTable: tables of more descriptors than a slot's share of
// the send queue (16) move their data in rounds: a WRITE(16) through a
// fetched table of 40 descriptors listing the client's pieces last
// first lands them in that order, a READ(10) through an inline table of
// 24 reads them back, and a WRITE(10) through 2048 descriptors of 4
// bytes (the most, srpMaxDesc) lands too.
func TestSRPLongTable(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r, c := srpLoggedIn(t, e, Config{})
		const k = 5
		want := r.writeReversed(t, c, k, 40, 4)
		clear(c.data(2*k*bs, k*bs))
		c.good("READ(10) through an inline table of 24", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x28, 8, k, false),
			DataIn: c.indirect(2*k*bs, k*bs, 24)}), 0)
		if !bytes.Equal(c.data(2*k*bs, k*bs), want) {
			t.Fatal("READ(10) through an inline table of 24 returned other bytes than were written")
		}

		const most = srpMaxDesc
		copy(c.data(0, most*4), pattern(most*4, 0x53))
		c.good("WRITE(10) through a fetched table of 2048", c.do(srp.Cmd{LUN: scsi.EncodeLUN(lunVol0), CDB: rw10(0x2A, 16, most*4/bs, false),
			DataOut: c.fetched(c.pieces(0, most*4, most), 2)}), 0)
		clear(c.data(most*4, most*4))
		c.good("READ(10) of it", c.do(c.in(srpCmd(lunVol0, rw10(0x28, 16, most*4/bs, false)...), most*4, most*4)), 0)
		if !bytes.Equal(c.data(most*4, most*4), pattern(most*4, 0x53)) {
			t.Fatal("the WRITE through 2048 descriptors did not land")
		}
		c.logout()
	})
}

// TestSRPMultiChannel: channels of one (initiator port, target port)
// pair form one I_T nexus. MULTI joins it (MAINTAINED) and both channels
// serve; SINGLE ends every other channel of the nexus before its accept
// (TERMINATED) and only it serves on; another initiator port's nexus is
// untouched (NO EXISTING CHANNEL).
func TestSRPMultiChannel(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		dial := func(port byte, action uint8) *srpClient {
			t.Helper()
			req := srpLoginReq(port)
			req.Flags = req.Flags&^srp.MultiChanMask | action
			c, err := r.srpDial(t, req)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		tur := func(c *srpClient, what string) { c.good(what, c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0) }
		other := dial(9, srp.MultiChanSingle)
		a := dial(1, srp.MultiChanSingle)
		if f := a.login.Flags & 3; f != srp.MultiChanNoChannel {
			t.Errorf("first channel: multi-channel result %d, want NO EXISTING CHANNEL", f)
		}
		b := dial(1, srp.MultiChanMulti)
		if f := b.login.Flags & 3; f != srp.MultiChanMaintained {
			t.Errorf("MULTI channel: result %d, want MAINTAINED", f)
		}
		tur(a, "first channel")
		tur(b, "second channel")
		c := dial(1, srp.MultiChanSingle)
		if f := c.login.Flags & 3; f != srp.MultiChanTerminated {
			t.Errorf("SINGLE over two channels: result %d, want TERMINATED", f)
		}
		a.expectDisconnect()
		b.expectDisconnect()
		tur(c, "the new single channel")
		tur(other, "another initiator port's channel")
		c.logout()
		other.logout()
	})
}

// TestSRPPolicyChange: the ACL, keyed on the initiator port in hex,
// reaches an SRP session's LUNs at once, as it reaches a gosrp session's
// open volumes: a revoked volume's LUN has no unit any more (and leaves
// REPORT LUNS), a narrowed one refuses writes as WRITE PROTECTED.
func TestSRPPolicyChange(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		write := func() srp.Rsp {
			return c.do(c.out(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw10(0x2A, 0, 1, false)}, 0, bs))
		}
		c.good("WRITE(10) before the change", write(), 0)
		ini := srpInitiatorName(srpPort(1))
		r.tgt.SetACL(&ACL{Rules: []ACLRule{{Initiator: ini, Volume: "vol0", Access: AccessNone},
			{Initiator: ini, Volume: "vol1", Access: AccessReadOnly}}})
		waitFor(t, "the revocation", func() bool {
			rsp := c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0))
			return rsp.Status == uint8(scsi.StatusCheckCondition)
		})
		c.checkSense("TEST UNIT READY on the revoked LUN", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), scsi.SenseLUNotSupported)
		c.checkSense("WRITE(10) on the narrowed LUN", write(), scsi.SenseWriteProtected)
		c.good("READ(10) on the narrowed LUN", c.do(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lunVol1), CDB: rw10(0x28, 0, 1, false)}, 0, bs)), 0)
		clear(c.data(0, 64))
		c.good("REPORT LUNS", c.do(c.in(srpCmd(lunRO, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0), 0, 24)), 0)
		if got := c.data(0, 24); got[3] != 16 || got[8+1] != lunRO || got[16+1] != lunVol1 {
			t.Errorf("REPORT LUNS after the revocation: % x, want LUNs %d and %d", got, lunRO, lunVol1)
		}
		c.logout()
	})
}

// unmapList is an UNMAP parameter list (SBC-3 5.28.2) of (LBA, blocks)
// pairs.
func unmapList(ext ...[2]uint64) []byte {
	b := make([]byte, scsi.UnmapHeaderLen, scsi.UnmapHeaderLen+len(ext)*scsi.UnmapDescriptorLen)
	for _, e := range ext {
		b = binary.BigEndian.AppendUint64(b, e[0])
		b = binary.BigEndian.AppendUint32(b, uint32(e[1]))
		b = append(b, 0, 0, 0, 0)
	}
	binary.BigEndian.PutUint16(b, uint16(len(b)-2))
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)-scsi.UnmapHeaderLen))
	return b
}

// unmapCDB is an UNMAP CDB with a parameter list of n bytes.
func unmapCDB(n int) []byte { return []byte{0x42, 0, 0, 0, 0, 0, 0, byte(n >> 8), byte(n), 0} }

// writeSame16 is a WRITE SAME(16) CDB; flags is byte 1 (0x08 UNMAP,
// 0x01 NDOB).
func writeSame16(flags byte, lba uint64, blocks uint32) []byte {
	cdb := rw16(0x93, lba, blocks)
	cdb[1] = flags
	return cdb
}

// TestSRPProvisioning: on a volume that deallocates, READ CAPACITY(16)
// says LBPME and LBPRZ and VPD 0xB2 offers UNMAP and WRITE SAME with
// UNMAP; UNMAP (parameter list by RDMA READ or immediate data) and
// WRITE SAME(16) with UNMAP make the blocks read as zeros, WRITE
// SAME(16) of a pattern writes it to every block, and the blocks around
// stay. On a volume that does not deallocate the unit is fully
// provisioned: no LBPME, UNMAP is an unknown command, and WRITE SAME
// with UNMAP writes zeros.
func TestSRPProvisioning(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		const blocks = 32
		lun := scsi.EncodeLUN(lunVol0)
		fill := func() []byte {
			want := pattern(blocks*bs, 5)
			copy(c.data(0, blocks*bs), want)
			c.good("WRITE(10)", c.do(c.out(srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, blocks, false)}, 0, blocks*bs)), 0)
			return want
		}
		readBack := func(what string, want []byte) {
			t.Helper()
			clear(c.data(0, blocks*bs))
			c.good("READ(10)", c.do(c.in(srp.Cmd{LUN: lun, CDB: rw10(0x28, 0, blocks, false)}, 0, blocks*bs)), 0)
			for b := 0; b < blocks; b++ {
				if got := c.data(b*bs, bs); !bytes.Equal(got, want[b*bs:(b+1)*bs]) {
					t.Fatalf("%s: block %d reads % x..., want % x...", what, b, got[:8], want[b*bs:b*bs+8])
				}
			}
		}
		zero := func(want []byte, lba, n int) { clear(want[lba*bs : (lba+n)*bs]) }

		clear(c.data(0, 64))
		c.good("READ CAPACITY(16)", c.do(c.in(srpCmd(lunVol0, 0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0), 0, 32)), 0)
		if got := c.data(14, 1)[0]; got != 0xC0 {
			t.Errorf("READ CAPACITY(16) byte 14 %#x, want LBPME|LBPRZ", got)
		}
		c.good("VPD 0xB2", c.do(c.in(srpCmd(lunVol0, 0x12, 1, 0xB2, 0, 8, 0), 0, 8)), 0)
		if got := c.data(5, 1)[0]; got&0xC4 != 0xC4 {
			t.Errorf("VPD 0xB2 byte 5 %#x, want LBPU, LBPWS and LBPRZ", got)
		}
		c.good("VPD 0xB0", c.do(c.in(srpCmd(lunVol0, 0x12, 1, 0xB0, 0, 64, 0), 0, 64)), 0)
		if got := binary.BigEndian.Uint32(c.data(20, 4)); got == 0 {
			t.Error("VPD 0xB0: MAXIMUM UNMAP LBA COUNT 0 on a volume that deallocates")
		}

		want := fill()
		list := unmapList([2]uint64{2, 3}, [2]uint64{10, 1})
		copy(c.data(blocks*bs, len(list)), list)
		c.good("UNMAP by RDMA READ", c.do(c.out(srp.Cmd{LUN: lun, CDB: unmapCDB(len(list))}, blocks*bs, len(list))), 0)
		zero(want, 2, 3)
		zero(want, 10, 1)
		list = unmapList([2]uint64{20, 2})
		c.good("UNMAP by immediate data", c.do(srp.Cmd{LUN: lun, CDB: unmapCDB(len(list)),
			DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: uint32(len(list)), Imm: list}}), 0)
		zero(want, 20, 2)
		c.good("WRITE SAME(16) UNMAP NDOB", c.do(srp.Cmd{LUN: lun, CDB: writeSame16(0x09, 24, 4)}), 0)
		zero(want, 24, 4)
		readBack("after UNMAP and WRITE SAME with UNMAP", want)

		block := pattern(bs, 0x31)
		copy(c.data(blocks*bs, bs), block)
		c.good("WRITE SAME(16) of a pattern", c.do(c.out(srp.Cmd{LUN: lun, CDB: writeSame16(0, 12, 5)}, blocks*bs, bs)), 0)
		for b := 12; b < 17; b++ {
			copy(want[b*bs:], block)
		}
		readBack("after WRITE SAME of a pattern", want)
		c.checkSense("UNMAP past the end", c.do(srp.Cmd{LUN: lun, CDB: unmapCDB(24),
			DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 24, Imm: unmapList([2]uint64{volSize / bs, 1})}}), scsi.SenseLBAOutOfRange)
		readBack("after a refused UNMAP", want)
		c.logout()

		thick := newRig(t, e, Config{})
		thick.cat.wrap = func(v Volume) Volume { return struct{ Volume }{v} } // hides Deallocates
		c, err = thick.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		clear(c.data(0, 64))
		c.good("READ CAPACITY(16), thick", c.do(c.in(srpCmd(lunVol0, 0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0), 0, 32)), 0)
		if got := c.data(14, 1)[0]; got != 0 {
			t.Errorf("READ CAPACITY(16) byte 14 %#x on a thick unit, want 0", got)
		}
		c.checkSense("UNMAP, thick", c.do(srp.Cmd{LUN: lun, CDB: unmapCDB(24),
			DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 24, Imm: unmapList([2]uint64{0, 1})}}), scsi.SenseInvalidOpcode)
		want = fill()
		c.good("WRITE SAME(16) UNMAP NDOB, thick", c.do(srp.Cmd{LUN: lun, CDB: writeSame16(0x09, 0, 3)}), 0)
		zero(want, 0, 3)
		readBack("thick, after WRITE SAME with UNMAP", want)
		c.logout()
	})
}

// tmf sends an SRP_TSK_MGMT and returns its tag.
func (c *srpClient) tmf(fn srp.TaskFunc, lun uint16, task uint64) uint64 {
	c.tb.Helper()
	c.tag++
	tm := srp.TaskMgmt{Tag: c.tag<<8 | 0xa5, LUN: scsi.EncodeLUN(lun), Function: fn, TaskTag: task}
	var b [srp.TaskMgmtLen]byte
	tm.Encode(b[:])
	if err := c.sendIU(b[:]); err != nil {
		c.tb.Fatal(err)
	}
	return tm.Tag
}

// tmfRsp waits for the next IU, which must be the task management
// response tagged tag with response code code and credits credits.
func (c *srpClient) tmfRsp(what string, tag uint64, code uint8, credits uint32) {
	c.tb.Helper()
	b, _ := c.mustNext()
	var r srp.Rsp
	if err := r.Decode(b); err != nil {
		c.tb.Fatalf("%s: SRP_RSP: %v", what, err)
	}
	if r.Tag != tag || r.Flags != srp.RspValid || len(r.Resp) != 4 || r.Resp[3] != code || r.ReqLimDelta != credits {
		c.tb.Fatalf("%s: %+v, want tag %#x, response code %d, %d credits", what, r, tag, code, credits)
	}
}

// TestSRPTaskManagement: ABORT TASK of a READ whose volume job is
// running lets the job finish but sends neither its data nor its
// SRP_RSP, and answers FUNCTION COMPLETE returning both credits, as
// ib_srp (srp_abort) expects; LOGICAL UNIT RESET does the same for every
// command of its LUN and leaves another LUN's alone; an ABORT TASK for a
// tag the target does not hold completes at once; CLEAR ACA is not
// supported. The session serves on.
func TestSRPTaskManagement(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		gate := make(chan struct{})
		entered := make(chan struct{}, 8)
		r.cat.wrap = func(v Volume) Volume { return &gatedVolume{Volume: v, gate: gate, entered: entered} }
		c, err := r.srpDial(t, srpLoginReq(1))
		if err != nil {
			t.Fatal(err)
		}
		sentinel := pattern(4*bs, 0xee)
		copy(c.data(0, 4*bs), sentinel)
		// synced returns once the target has taken the IUs sent so far:
		// a TEST UNIT READY sent after them is answered (the target takes
		// a channel's IUs in order), so a job released afterwards ends
		// after the task management function saw it running.
		synced := func() { c.good("TEST UNIT READY", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0) }
		read := func(lun uint16, lba uint32, off int) uint64 {
			return c.post(c.in(srp.Cmd{LUN: scsi.EncodeLUN(lun), CDB: rw10(0x28, lba, 1, false)}, off, bs))
		}

		tag := read(lunVol0, 0, 0)
		<-entered
		abort := c.tmf(srp.TaskAbortTask, lunVol0, tag)
		synced()
		gate <- struct{}{}
		c.tmfRsp("ABORT TASK of a running READ", abort, srp.TaskComplete, 2)

		read(lunVol0, 1, 0)
		read(lunVol0, 2, bs)
		other := read(lunVol1, 3, 2*bs)
		for range 3 {
			<-entered
		}
		reset := c.tmf(srp.TaskLUNReset, lunVol0, 0)
		synced()
		for range 3 {
			gate <- struct{}{}
		}
		// Two answers, in either order: the reset's and the other LUN's
		// READ's; the aborted READs get none, and their credits come
		// back with the next answers (four credits in all).
		credits := uint32(0)
		for range 2 {
			b, _ := c.mustNext()
			var rsp srp.Rsp
			if err := rsp.Decode(b); err != nil {
				t.Fatal(err)
			}
			switch rsp.Tag {
			case other:
				c.good("the other LUN's READ", rsp, 0)
			case reset:
				if rsp.Flags != srp.RspValid || rsp.Resp[3] != srp.TaskComplete {
					t.Fatalf("LOGICAL UNIT RESET answered %+v, want FUNCTION COMPLETE", rsp)
				}
			default:
				t.Fatalf("response for tag %#x: neither the reset %#x nor the other LUN's READ %#x", rsp.Tag, reset, other)
			}
			credits += rsp.ReqLimDelta
		}
		if credits != 4 {
			t.Errorf("the reset and the other READ returned %d credits, want 4", credits)
		}
		if !bytes.Equal(c.data(0, 2*bs), sentinel[:2*bs]) {
			t.Error("an aborted READ's data reached the initiator's memory")
		}

		c.tmfRsp("ABORT TASK of an unknown tag", c.tmf(srp.TaskAbortTask, lunVol0, 0x1234), srp.TaskComplete, 1)
		c.tmfRsp("CLEAR ACA", c.tmf(srp.TaskClearACA, lunVol0, 0), srp.TaskNotSupported, 1)
		close(gate)
		c.good("TEST UNIT READY after task management", c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), 0)
		c.logout()
	})
}

// TestSRPUnitAttention: a volume resized under two SRP sessions (two
// initiator ports) reports CAPACITY DATA HAS CHANGED once on each, on
// its LUN only, and READ CAPACITY then says the new size; a catalog
// change reports REPORTED LUNS DATA HAS CHANGED once on every LUN of
// each session, INQUIRY leaving it pending (SAM-5 5.14).
func TestSRPUnitAttention(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		var cs []*srpClient
		for _, port := range []byte{1, 2} {
			c, err := r.srpDial(t, srpLoginReq(port))
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		tur := func(c *srpClient, lun uint16) srp.Rsp { return c.do(srpCmd(lun, 0, 0, 0, 0, 0, 0)) }
		// A command answered means the session's LUNs are open: a
		// resize between the accept and their opening is no change to
		// report, since the LUN then opens at the new size.
		for i, c := range cs {
			c.good(fmt.Sprintf("session %d: TEST UNIT READY before the resize", i), tur(c, lunVol1), 0)
		}
		r.resize(t, "vol1", 2*volSize)
		for i, c := range cs {
			c.good(fmt.Sprintf("session %d: TEST UNIT READY on another LUN", i), tur(c, lunVol0), 0)
			c.checkSense(fmt.Sprintf("session %d: TEST UNIT READY after the resize", i), tur(c, lunVol1), scsi.SenseCapacityChanged)
			c.good(fmt.Sprintf("session %d: TEST UNIT READY again", i), tur(c, lunVol1), 0)
			clear(c.data(0, 8))
			c.good("READ CAPACITY(10)", c.do(c.in(srpCmd(lunVol1, 0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0), 0, 8)), 0)
			if got := binary.BigEndian.Uint32(c.data(0, 4)); got != 2*volSize/bs-1 {
				t.Errorf("session %d: READ CAPACITY(10) last LBA %d, want %d", i, got, 2*volSize/bs-1)
			}
		}

		r.tgt.CatalogChanged()
		// CatalogChanged does not wait for the connections: each
		// session is polled until its LUN 0 reports the change.
		reached := func(c *srpClient) func() bool {
			return func() bool {
				// Only REPORTED LUNS DATA HAS CHANGED fails this one;
				// INQUIRY leaves it pending.
				return c.do(c.in(srpCmd(lunVol0, 0x12, 0, 0, 0, 36, 0), 0, 36)).Status == uint8(scsi.StatusGood) &&
					tur(c, lunRO).Status == uint8(scsi.StatusCheckCondition)
			}
		}
		c := cs[0]
		waitFor(t, "the catalog change", reached(c))
		c.checkSense("TEST UNIT READY on LUN 1 after the catalog change", tur(c, lunVol0), scsi.SenseLUNsChanged)
		c.good("TEST UNIT READY on LUN 1 again", tur(c, lunVol0), 0)
		waitFor(t, "the catalog change in session 2", reached(cs[1]))
		c.checkSense("session 2: TEST UNIT READY after the catalog change", tur(cs[1], lunVol1), scsi.SenseLUNsChanged)
		for _, c := range cs {
			c.logout()
		}
	})
}
