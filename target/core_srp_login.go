package target

// The core's side of an SRP login: the decision on an SRP_LOGIN_REQ in
// ib_srpt's order of checks, the reject, and the LUNs the accepted
// session gets.

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// srpLoginResult is the core's answer to an SRP_LOGIN_REQ: the private
// data of the accept or the reject, and on accept the volumes the shell
// opens, one per LUN ("" for a LUN the initiator may not see).
type srpLoginResult struct {
	ok     bool
	priv   []byte
	open   []string
	reason string
}

// srpInitiatorName is the initiator name an SRP session has for the ACL
// and the secrets: its 16-byte initiator port identifier in lower-case
// hex (SRP carries no name and no secret).
func srpInitiatorName(port [16]byte) string { return hex.EncodeToString(port[:]) }

// allow is the access the session's initiator has to volume under acl:
// for an SRP session, rules naming its source host count too (ACL).
func (c *core) allow(acl *ACL, volume string) Access {
	if c.srp != nil {
		return acl.AllowFrom(c.initiator, c.p.source, volume)
	}
	return acl.Allow(c.initiator, volume)
}

// srpLogin decides an SRP_LOGIN_REQ, in ib_srpt's order
// (srpt_cm_req_recv): the IU length, the target port, the buffer formats,
// then access. byLUN names the catalog's volumes by LUN number ("" where
// none is; listErr the failure to list or number them), from the
// target's LUN map (lunmap.go): a number names the same volume for
// every initiator, across catalog changes and restarts. On accept the
// session is active at once: SRP has no login SEND.
//
// others is how many channels of the same I_T nexus the target serves:
// a MULTI-CHANNEL ACTION of SINGLE ends them (the shell does, before
// the accept goes out) and is answered TERMINATED when there were any,
// NO EXISTING CHANNEL otherwise; MULTI joins them, MAINTAINED.
func (c *core) srpLogin(req *srp.LoginRequest, byLUN []string, listErr error, others int) srpLoginResult {
	ini := srpInitiatorName(req.InitiatorPortID)
	c.initiator = ini
	refuse := func(r srp.RejectReason, why string) srpLoginResult { return c.srpRefuse(req, r, why) }
	switch {
	case req.MaxITIULen < srpMinITIU || req.MaxITIULen > recvSize:
		return refuse(srp.RejectITIULenTooLarge, fmt.Sprintf("initiator IUs of %d bytes, target takes %d to %d", req.MaxITIULen, srpMinITIU, recvSize))
	case c.p.srpPort != [16]byte{} && req.TargetPortID != c.p.srpPort:
		return refuse(srp.RejectUnableToAssociate, fmt.Sprintf("target port %x is not this target's %x", req.TargetPortID, c.p.srpPort))
	case req.BufFormats&^srpFormats != 0:
		return refuse(srp.RejectUnsupportedFormat, fmt.Sprintf("buffer formats %#x required, target supports %#x", req.BufFormats, srpFormats))
	case req.Flags&srp.MultiChanMask > srp.MultiChanMulti:
		return refuse(srp.RejectMultiChanUnsupported, fmt.Sprintf("multi-channel action %d", req.Flags&srp.MultiChanMask))
	case listErr != nil:
		return refuse(srp.RejectInsufficientResources, "list volumes: "+listErr.Error())
	}
	if c.p.secrets != nil {
		secret, required := c.p.secrets(ini)
		if required {
			return refuse(srp.RejectUnableToEstablish, "the initiator must authenticate, and SRP carries no secret")
		}
		c.authMark = c.mark(secret, required)
	}
	s := &srpSession{port: req.InitiatorPortID, tport: req.TargetPortID}
	acl := c.p.acl()
	any := false
	for i := 0; i < len(byLUN) && i < srpMaxLUNs; i++ {
		name, acc := byLUN[i], AccessNone
		if name != "" {
			acc = acl.AllowFrom(ini, c.p.source, name)
		}
		if acc == AccessNone {
			name = ""
		} else {
			any = true
		}
		s.names = append(s.names, name)
		s.access = append(s.access, acc)
	}
	if !any {
		return refuse(srp.RejectUnableToEstablish, fmt.Sprintf("the access rules let initiator port %s see no volume", ini))
	}
	rsp := srp.LoginResponse{ReqLimDelta: uint32(c.credits), Tag: req.Tag, MaxITIULen: recvSize,
		MaxTIIULen: srpMaxTIIU, BufFormats: srpFormats, Flags: srp.MultiChanNoChannel}
	switch {
	case req.Flags&srp.MultiChanMask == srp.MultiChanMulti:
		rsp.Flags = srp.MultiChanMaintained
	case others > 0:
		rsp.Flags = srp.MultiChanTerminated
	}
	// Immediate data (SRP-2): the data must start after the immediate
	// descriptor and leave room in the receive buffer.
	if off := int(req.ImmDataOffset); req.Flags&srp.ImmediateRequested != 0 &&
		off >= srp.CmdLen+srp.ImmHeaderLen && off < recvSize {
		s.immOffset = off
		c.maxImm = uint32(min(maxImmediate, recvSize-off, int(c.maxXfer)))
		rsp.Flags |= srp.ImmediateSupported
	}
	b := make([]byte, srp.LoginResponseLen)
	rsp.Encode(b)
	c.srp = s
	c.setState(connActive)
	c.acts.loggedIn = true
	return srpLoginResult{ok: true, priv: b, open: s.names}
}

// srpRefuse rejects an SRP login with an SRP_LOGIN_REJ for reason r.
func (c *core) srpRefuse(req *srp.LoginRequest, r srp.RejectReason, why string) srpLoginResult {
	c.acts.rejected = true
	c.close("SRP login rejected: "+why, false)
	return srpLoginResult{priv: srpRejectData(req, r), reason: fmt.Sprintf("%s: %s", r, why)}
}

// srpRejectData is the SRP_LOGIN_REJ answering req for reason r, as the
// reject's private data; it names the buffer formats the target takes, so
// that an initiator refused for them knows what to ask for.
func srpRejectData(req *srp.LoginRequest, r srp.RejectReason) []byte {
	rej := srp.LoginReject{Reason: r, Tag: req.Tag, BufFormats: srpFormats}
	b := make([]byte, srp.LoginRejectLen)
	rej.Encode(b)
	return b
}

// srpVolume is a LUN's volume as the shell opened it (vol nil: absent).
type srpVolume struct {
	vol  Volume
	info VolumeInfo
	// opening says, with vol nil, that the volume's open has not
	// returned yet: the LUN is becoming ready, not absent.
	opening bool
	// mark is the volume's dirty mark (nil when the target keeps none);
	// lost says the volume lost its write cache in the target's
	// previous life and this I_T nexus has not been told.
	mark *volMark
	lost bool
	// state is the volume's path state here (PathStater, Fencer), read
	// by the shell on the run loop just before it hands the volume over,
	// so that no change reported to the core can be older.
	state gwState
	// pr is the volume's reservation state, which every command of the
	// LUN is checked against as a gosrp host's are (nil: none kept).
	pr *prVolume
}

// srpAttach takes the volumes the shell opened for the login's LUNs, in
// LUN order, and makes them the session's logical units, whose unit
// attention state is nx's, the I_T nexus the channel joined (nil: a
// nexus of this channel alone).
func (c *core) srpAttach(nx *srpNexus, vols []srpVolume) {
	s := c.srp
	if nx == nil {
		nx = newSRPNexus(nil, "")
	}
	s.nx = nx
	s.luns = make([]srpLUN, len(s.names))
	for i := range s.luns {
		if i >= len(vols) || vols[i].vol == nil {
			c.handles = append(c.handles, nil)
			c.srpSetOpening(i, i < len(vols) && vols[i].opening)
			continue
		}
		c.handles = append(c.handles, nil)
		c.srpAttachLUN(i, &vols[i], 0)
	}
}

// srpTakeAttached returns the handles attached since it was last called
// (fresh ones, which no other goroutine has seen) and forgets them.
func (c *core) srpTakeAttached() []*openVol {
	a := c.srp.attached
	c.srp.attached = nil
	return a
}

// srpAttachLUN makes v the logical unit of LUN i (its handle i+1, its
// slot in s.luns and c.handles there already), with the access the
// session has in s.access[i]; gen is the catalog change that adds it
// to a live session, 0 at login (srpNexus.unit).
func (c *core) srpAttachLUN(i int, v *srpVolume, gen uint64) {
	s := c.srp
	ov := &openVol{handle: uint32(i + 1), name: s.names[i], vol: v.vol, size: v.info.Size, bs: int64(v.info.BlockSize),
		ro: v.info.ReadOnly || s.access[i] == AccessReadOnly, stats: c.p.volStats(s.names[i]),
		pr: v.pr, owner: c.sessionKey(), ini: c.initiator}
	ov.now = immediate(v.vol)
	if !ov.ro {
		// A volume whose I/O is immediate lives in memory: a restart
		// loses all of it, not a cache, and the host must hear of it
		// all the same (volMark.volatile).
		ov.mark = v.mark
	}
	if bw, ok := v.vol.(BatchWriter); ok && !ov.now && !ov.ro {
		ov.batch = bw
	}
	discard := false
	if d, ok := v.vol.(Deallocator); ok {
		discard = d.Deallocates()
	}
	var group uint16
	if _, ok := v.vol.(PathStater); ok {
		group = c.p.portGroup
	}
	c.handles[i] = ov
	c.nhandles++
	// Published for Target.OpenSessions: a LUN is a volume the host
	// addresses, as a gosrp open is (a shrink once went through under
	// an SRP host unrefused).
	c.handlesGen++
	s.attached = append(s.attached, ov)
	h := fnv.New64a()
	h.Write([]byte(c.p.name + "\x00" + ov.name))
	blocks := uint64(ov.size / ov.bs)
	s.luns[i] = srpLUN{ov: ov, dev: scsi.Device{BlockSize: uint32(ov.bs), Blocks: blocks,
		ReadOnly: ov.ro, WriteCache: true, ID: h.Sum64(), Incarnation: srpIncarnation(ov), MaxTransferBlocks: uint32(int64(c.maxXfer) / ov.bs),
		Discard: discard, DiscardZeroes: discard, MaxWriteSameBlocks: srpMaxWriteSame(ov.bs), PortGroup: group},
		unit: s.nx.unit(ov.name, i, blocks, v.lost, v.state, gen, group != 0)}
	if v.lost && c.p.trace != nil {
		c.p.trace(fmt.Sprintf("LUN %d %s: unit attention %s", i, ov.name, s.luns[i].unit.pending()))
	}
}

// srpIncarnation is the volume's identity (Identifier) for VPD 0x83
// (scsi.Device.Incarnation), by which a host that logs in again tells
// the volume it wrote to from another since given its LUN. A volume
// that lives in memory is made anew by every restart, and whose loss
// the host hears of as a lost write cache (volMark.volatile): it
// reports none, so that it stays the same unit across the restart.
func srpIncarnation(ov *openVol) uint64 {
	if ov.now {
		return 0
	}
	return identity(ov.vol)
}
