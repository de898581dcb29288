package target

// The core's SRP mode: a connection whose request carried a T10
// SRP_LOGIN_REQ instead of a gosrp hello (docs/srp.md). The login is
// decided here, in the CM exchange; the volumes are the session's LUNs;
// and each SRP_CMD runs through the scsi model onto the same slots, jobs
// and RDMA posting as a gosrp command.

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

const (
	// srpImmOffset is where ib_srp puts an SRP_CMD's immediate data
	// (srp_imm_data_offset: the 48-byte SRP_CMD, 16 bytes of additional
	// CDB, the 4-byte immediate descriptor); the receive buffers hold it
	// plus maxImmediate.
	srpImmOffset = srp.CmdLen + 16 + srp.ImmHeaderLen
	// srpMinITIU is the smallest initiator IU length a login may ask
	// for: an SRP_CMD with one direct descriptor (ib_srpt's lower bound
	// is 64 too, srpt_cm_req_recv).
	srpMinITIU = 64
	// srpMaxTIIU is the largest IU the target sends: an SRP_RSP with
	// response data and fixed-format sense, with room to spare.
	srpMaxTIIU = 256
	// srpMaxLUNs bounds the LUNs of a session (each is an open volume).
	srpMaxLUNs = maxHandles
	// srpFormats are the buffer formats the target takes.
	srpFormats = srp.BufFormatDirect | srp.BufFormatIndirect
)

// srpSession is what an SRP login established: the I_T nexus, the
// immediate data agreement and the logical units.
type srpSession struct {
	port, tport [16]byte
	// immOffset is where immediate data starts in an SRP_CMD; 0 when the
	// login did not agree to immediate data.
	immOffset int
	// names and access are the LUNs as the login saw the catalog, by LUN
	// number: what the shell opens ("" for none), and how.
	names  []string
	access []Access
	luns   []srpLUN
}

// srpLUN is one logical unit: an open volume and its SCSI model.
type srpLUN struct {
	ov  *openVol
	dev scsi.Device
}

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

// srpLogin decides an SRP_LOGIN_REQ, in ib_srpt's order
// (srpt_cm_req_recv): the IU length, the target port, the buffer formats,
// then access. list is the catalog (listErr its failure): the LUNs are
// its volumes in name order, LUN 0 the first, so a LUN names the same
// volume for every initiator while the catalog does not change. On
// accept the session is active at once: SRP has no login SEND.
func (c *core) srpLogin(req *srp.LoginRequest, list []VolumeInfo, listErr error) srpLoginResult {
	ini := srpInitiatorName(req.InitiatorPortID)
	c.initiator = ini
	refuse := func(r srp.RejectReason, why string) srpLoginResult {
		rej := srp.LoginReject{Reason: r, Tag: req.Tag, BufFormats: srpFormats}
		b := make([]byte, srp.LoginRejectLen)
		rej.Encode(b)
		c.acts.rejected = true
		c.close("SRP login rejected: "+why, false)
		return srpLoginResult{priv: b, reason: fmt.Sprintf("%s: %s", r, why)}
	}
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
	list = slices.SortedFunc(slices.Values(list), func(a, b VolumeInfo) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	acl := c.p.acl()
	any := false
	for i := 0; i < len(list) && i < srpMaxLUNs; i++ {
		acc := acl.Allow(ini, list[i].Name)
		name := list[i].Name
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
	if req.Flags&srp.MultiChanMask == srp.MultiChanMulti {
		rsp.Flags = srp.MultiChanMaintained
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

// srpVolume is a LUN's volume as the shell opened it (vol nil: absent).
type srpVolume struct {
	vol  Volume
	info VolumeInfo
}

// srpAttach takes the volumes the shell opened for the login's LUNs, in
// LUN order, and makes them the session's logical units.
func (c *core) srpAttach(vols []srpVolume) {
	s := c.srp
	s.luns = make([]srpLUN, len(s.names))
	for i := range s.luns {
		if i >= len(vols) || vols[i].vol == nil {
			c.handles = append(c.handles, nil)
			continue
		}
		v := &vols[i]
		ov := &openVol{handle: uint32(i + 1), name: s.names[i], vol: v.vol, size: v.info.Size, bs: int64(v.info.BlockSize),
			ro: v.info.ReadOnly || s.access[i] == AccessReadOnly, stats: c.p.volStats(s.names[i])}
		if im, ok := v.vol.(Immediate); ok {
			ov.now = im.Immediate()
		}
		if bw, ok := v.vol.(BatchWriter); ok && !ov.now && !ov.ro {
			ov.batch = bw
		}
		c.handles = append(c.handles, ov)
		c.nhandles++
		h := fnv.New64a()
		h.Write([]byte(c.p.name + "\x00" + ov.name))
		s.luns[i] = srpLUN{ov: ov, dev: scsi.Device{BlockSize: uint32(ov.bs), Blocks: uint64(ov.size / ov.bs),
			ReadOnly: ov.ro, WriteCache: true, ID: h.Sum64(), MaxTransferBlocks: uint32(int64(c.maxXfer) / ov.bs)}}
	}
}

// srpClassify says what an IU of an SRP session is: a request that costs
// a credit (SRP_CMD, SRP_TSK_MGMT), a logout, or neither.
func srpClassify(buf []byte) (iuClass, string) {
	switch op := srp.Opcode(buf[0]); op {
	case srp.OpCmd, srp.OpTaskMgmt:
		return iuRequest, op.String()
	case srp.OpILogout:
		return iuLogout, op.String()
	default:
		return iuOther, op.String()
	}
}

// srpAssign starts the SRP request in receive buffer idx on slot s.
func (c *core) srpAssign(s *slot, idx int32, n uint32, at int64) {
	c.repost(idx)
	c.close("SRP requests are not served yet", true)
}
