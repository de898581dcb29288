package srp

import (
	"fmt"
)

// Sizes of the login IUs.
const (
	// LoginRequestLen is SRP_LOGIN_REQ as SRP r16a 6.2 lays it out, the
	// form the IB CM carries in a REQ's private data.
	LoginRequestLen = 64
	// LoginRequestRDMALen is the RDMA-CM form (struct srp_login_req_rdma):
	// RDMA-CM over IB leaves 92-36 = 56 bytes of REQ private data, so the
	// kernel's ib_srp drops SRP_LOGIN_REQ's reserved bytes and reorders
	// the rest to fit (srp_send_req).
	LoginRequestRDMALen = 56
	// LoginResponseLen is SRP_LOGIN_RSP (SRP r16a 6.3).
	LoginResponseLen = 52
	// LoginRejectLen is SRP_LOGIN_REJ (SRP r16a 6.4).
	LoginRejectLen = 32
)

// Login request flags (REQ_FLAGS, SRP r16a 6.2; SRP-2 adds IMMED).
const (
	// MultiChanMask selects the MULTI-CHANNEL ACTION code in the flags.
	MultiChanMask uint8 = 0x03
	// MultiChanSingle: end every other channel of this I_T nexus.
	MultiChanSingle uint8 = 0
	// MultiChanMulti: keep the other channels; this one joins them.
	MultiChanMulti uint8 = 1
	// ImmediateRequested: the initiator wants to send immediate data at
	// ImmDataOffset (SRP-2, SRP_IMMED_REQUESTED).
	ImmediateRequested uint8 = 0x80
)

// Login response flags (RSP_FLAGS, SRP r16a 6.3; SRP-2 adds IMMED).
const (
	// MultiChanNoChannel: there were no other channels.
	MultiChanNoChannel uint8 = 0
	// MultiChanTerminated: the target ended the nexus's other channels.
	MultiChanTerminated uint8 = 1
	// MultiChanMaintained: the other channels go on beside this one.
	MultiChanMaintained uint8 = 2
	// ImmediateSupported: the target accepts immediate data at the
	// offset the request named (SRP_LOGIN_RSP_IMMED_SUPP).
	ImmediateSupported uint8 = 0x80
)

// LoginRequest is SRP_LOGIN_REQ: an initiator port asks a target port for
// a channel. It arrives in the connection request's private data, in one
// of two layouts (EncodeIB, EncodeRDMA).
type LoginRequest struct {
	Tag uint64
	// MaxITIULen is REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH: the
	// largest IU the initiator will send (an SRP_CMD with its descriptors
	// and any immediate data).
	MaxITIULen uint32
	// BufFormats is REQUIRED BUFFER FORMATS (BufFormatDirect|...).
	BufFormats uint16
	// Flags: the multi-channel action and ImmediateRequested.
	Flags uint8
	// ImmDataOffset is where an SRP_CMD's immediate data starts, counted
	// from the IU's first byte (SRP-2; ib_srp uses 68: a 48-byte SRP_CMD,
	// 16 bytes of additional CDB and the 4-byte immediate descriptor).
	ImmDataOffset uint16
	// InitiatorPortID and TargetPortID name the I_T nexus (SRP r16a
	// 5.3: ib_srp sends initiator_ext then the port GUID, and id_ext then
	// ioc_guid).
	InitiatorPortID [16]byte
	TargetPortID    [16]byte
}

// EncodeIB writes r in SRP r16a's layout into b, which must hold
// LoginRequestLen bytes:
//
//	0  opcode u8 = 0x00
//	1  reserved [7]
//	8  tag u64
//	16 req_it_iu_len u32
//	20 reserved [4]
//	24 req_buf_fmt u16
//	26 req_flags u8
//	27 reserved
//	28 imm_data_offset u16
//	30 reserved [2]
//	32 initiator_port_id [16]
//	48 target_port_id [16]
func (r *LoginRequest) EncodeIB(b []byte) (int, error) {
	if err := room(b, LoginRequestLen, OpLoginReq); err != nil {
		return 0, err
	}
	b = b[:LoginRequestLen]
	clear(b)
	b[0] = byte(OpLoginReq)
	be.PutUint64(b[8:], r.Tag)
	be.PutUint32(b[16:], r.MaxITIULen)
	be.PutUint16(b[24:], r.BufFormats)
	b[26] = r.Flags
	be.PutUint16(b[28:], r.ImmDataOffset)
	copy(b[32:48], r.InitiatorPortID[:])
	copy(b[48:64], r.TargetPortID[:])
	return LoginRequestLen, nil
}

// DecodeIB parses the layout EncodeIB writes. b may be longer (the IB CM
// pads private data to 92 bytes); reserved bytes are not checked (SRP
// r16a 5.1).
func (r *LoginRequest) DecodeIB(b []byte) error {
	if err := need(b, LoginRequestLen, OpLoginReq); err != nil {
		return err
	}
	r.Tag = be.Uint64(b[8:])
	r.MaxITIULen = be.Uint32(b[16:])
	r.BufFormats = be.Uint16(b[24:])
	r.Flags = b[26]
	r.ImmDataOffset = be.Uint16(b[28:])
	copy(r.InitiatorPortID[:], b[32:48])
	copy(r.TargetPortID[:], b[48:64])
	return nil
}

// EncodeRDMA writes r in the RDMA-CM layout (struct srp_login_req_rdma)
// into b, which must hold LoginRequestRDMALen bytes. The opcode is not
// first: the kernel put the tag first, for alignment.
//
//	0  tag u64
//	8  req_buf_fmt u16
//	10 req_flags u8
//	11 opcode u8 = 0x00
//	12 req_it_iu_len u32
//	16 initiator_port_id [16]
//	32 target_port_id [16]
//	48 imm_data_offset u16
//	50 reserved [6]
func (r *LoginRequest) EncodeRDMA(b []byte) (int, error) {
	if err := room(b, LoginRequestRDMALen, OpLoginReq); err != nil {
		return 0, err
	}
	b = b[:LoginRequestRDMALen]
	clear(b)
	be.PutUint64(b, r.Tag)
	be.PutUint16(b[8:], r.BufFormats)
	b[10] = r.Flags
	b[11] = byte(OpLoginReq)
	be.PutUint32(b[12:], r.MaxITIULen)
	copy(b[16:32], r.InitiatorPortID[:])
	copy(b[32:48], r.TargetPortID[:])
	be.PutUint16(b[48:], r.ImmDataOffset)
	return LoginRequestRDMALen, nil
}

// DecodeRDMA parses the layout EncodeRDMA writes, as a target finds it in
// a connection request's private data (ib_srpt's srpt_rdma_cm_req_recv).
// b may be longer; the opcode byte must say SRP_LOGIN_REQ, which is what
// tells this form from a gosrp hello of the same length.
func (r *LoginRequest) DecodeRDMA(b []byte) error {
	if len(b) < LoginRequestRDMALen {
		return fmt.Errorf("%w: RDMA-CM SRP_LOGIN_REQ of %d bytes, want at least %d", ErrMalformed, len(b), LoginRequestRDMALen)
	}
	if Opcode(b[11]) != OpLoginReq {
		return fmt.Errorf("%w: RDMA-CM login opcode (byte 11) is %s, not SRP_LOGIN_REQ", ErrMalformed, Opcode(b[11]))
	}
	r.Tag = be.Uint64(b)
	r.BufFormats = be.Uint16(b[8:])
	r.Flags = b[10]
	r.MaxITIULen = be.Uint32(b[12:])
	copy(r.InitiatorPortID[:], b[16:32])
	copy(r.TargetPortID[:], b[32:48])
	r.ImmDataOffset = be.Uint16(b[48:])
	return nil
}

// LoginResponse is SRP_LOGIN_RSP: the target accepts the channel. It
// travels in the accept's private data.
type LoginResponse struct {
	// ReqLimDelta is the initial request limit: how many IUs the
	// initiator may send before the target returns credits.
	ReqLimDelta uint32
	Tag         uint64
	// MaxITIULen is the largest IU the target accepts; MaxTIIULen the
	// largest it sends (the initiator sizes its receive buffers so).
	MaxITIULen uint32
	MaxTIIULen uint32
	// BufFormats is SUPPORTED BUFFER FORMATS.
	BufFormats uint16
	// Flags: the multi-channel result and ImmediateSupported.
	Flags uint8
}

// Encode writes r into b, which must hold LoginResponseLen bytes:
//
//	0  opcode u8 = 0xC0
//	1  reserved [3]
//	4  req_lim_delta u32
//	8  tag u64
//	16 max_it_iu_len u32
//	20 max_ti_iu_len u32
//	24 sup_buf_fmt u16
//	26 rsp_flags u8
//	27 reserved [25]
func (r *LoginResponse) Encode(b []byte) (int, error) {
	if err := room(b, LoginResponseLen, OpLoginRsp); err != nil {
		return 0, err
	}
	b = b[:LoginResponseLen]
	clear(b)
	b[0] = byte(OpLoginRsp)
	be.PutUint32(b[4:], r.ReqLimDelta)
	be.PutUint64(b[8:], r.Tag)
	be.PutUint32(b[16:], r.MaxITIULen)
	be.PutUint32(b[20:], r.MaxTIIULen)
	be.PutUint16(b[24:], r.BufFormats)
	b[26] = r.Flags
	return LoginResponseLen, nil
}

// Decode parses the layout Encode writes.
func (r *LoginResponse) Decode(b []byte) error {
	if err := need(b, LoginResponseLen, OpLoginRsp); err != nil {
		return err
	}
	r.ReqLimDelta = be.Uint32(b[4:])
	r.Tag = be.Uint64(b[8:])
	r.MaxITIULen = be.Uint32(b[16:])
	r.MaxTIIULen = be.Uint32(b[20:])
	r.BufFormats = be.Uint16(b[24:])
	r.Flags = b[26]
	return nil
}

// RejectReason is SRP_LOGIN_REJ's REASON (SRP r16a 6.4).
type RejectReason uint32

// Reject reasons.
const (
	RejectUnableToEstablish     RejectReason = 0x00010000 // unable to establish the channel, no reason given
	RejectInsufficientResources RejectReason = 0x00010001
	RejectITIULenTooLarge       RejectReason = 0x00010002 // requested initiator-to-target IU length too large
	RejectUnableToAssociate     RejectReason = 0x00010003 // unable to associate the channel with the I_T nexus (wrong target port)
	RejectUnsupportedFormat     RejectReason = 0x00010004 // a required buffer format is not supported
	RejectMultiChanUnsupported  RejectReason = 0x00010005 // multiple channels are not supported
	RejectChannelLimit          RejectReason = 0x00010006 // no more channels for this I_T nexus
)

// rejectNames names the reasons from RejectUnableToEstablish on, in
// order: they start at 0x00010000 (SRP r16a 6.4), too far up for a table
// indexed by value.
var rejectNames = [...]string{
	"unable to establish RDMA channel",
	"insufficient resources",
	"requested maximum initiator to target IU length too large",
	"unable to associate RDMA channel with I_T nexus",
	"requested descriptor format not supported",
	"multiple RDMA channels not supported",
	"no more RDMA channels for this I_T nexus",
}

// String names the reason ("insufficient resources"), or
// RejectReason(0x...) for one SRP r16a does not define.
func (r RejectReason) String() string {
	if i := r - RejectUnableToEstablish; i < RejectReason(len(rejectNames)) {
		return rejectNames[i]
	}
	return fmt.Sprintf("RejectReason(%#x)", uint32(r))
}

// LoginReject is SRP_LOGIN_REJ: the target refuses the channel, in the
// CM reject's private data (consumer-defined reason, as ib_srpt sends it).
type LoginReject struct {
	Reason RejectReason
	Tag    uint64
	// BufFormats is SUPPORTED BUFFER FORMATS, so an initiator rejected
	// for RejectUnsupportedFormat knows what to ask for.
	BufFormats uint16
}

// Encode writes r into b, which must hold LoginRejectLen bytes:
//
//	0  opcode u8 = 0xC2
//	1  reserved [3]
//	4  reason u32
//	8  tag u64
//	16 reserved [8]
//	24 sup_buf_fmt u16
//	26 reserved [6]
func (r *LoginReject) Encode(b []byte) (int, error) {
	if err := room(b, LoginRejectLen, OpLoginReject); err != nil {
		return 0, err
	}
	b = b[:LoginRejectLen]
	clear(b)
	b[0] = byte(OpLoginReject)
	be.PutUint32(b[4:], uint32(r.Reason))
	be.PutUint64(b[8:], r.Tag)
	be.PutUint16(b[24:], r.BufFormats)
	return LoginRejectLen, nil
}

// Decode parses the layout Encode writes.
func (r *LoginReject) Decode(b []byte) error {
	if err := need(b, LoginRejectLen, OpLoginReject); err != nil {
		return err
	}
	r.Reason = RejectReason(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	r.BufFormats = be.Uint16(b[24:])
	return nil
}
