package emu

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// The tcp wire carries one frame per packet, siw-style: a fixed 36-byte
// little-endian header, then the payload.
//
//	0  magic   u16  'g','S'
//	2  version u8
//	3  kind    u8   pktKind or a CM message
//	4  flags   u8
//	5  nak     u8
//	6  rsv     u16  zero
//	8  psn     u32
//	12 imm     u32
//	16 key     u32
//	20 va      u64
//	28 length  u32  RDMA READ length
//	32 paylen  u32
//
// A CM_REQ or CM_REP carries the sender's RDMA READ credit in imm:
// initiator_depth in bits 0-7, responder_resources in bits 8-15 (putCredit).
const (
	frameMagic   = 0x5367
	frameVersion = 1
	headerLen    = 36
)

// CM messages share the frame format on the tcp wire.
const (
	cmReq pktKind = 0x40 + iota
	cmRep
	cmRej
)

var errBadFrame = errors.New("emu: malformed frame")

// errNoDescriptors marks a connection this process could not go on with
// for want of file descriptors (EMFILE): its own resource limit, not the
// peer's fault.
var errNoDescriptors = errors.New("emu: out of file descriptors")

type header struct {
	kind   pktKind
	flags  uint8
	nak    uint8
	psn    uint32
	imm    uint32
	key    transport.Key
	va     uint64
	length uint32
	paylen uint32
}

func putHeader(b []byte, h *header) {
	binary.LittleEndian.PutUint16(b[0:], frameMagic)
	b[2] = frameVersion
	b[3] = byte(h.kind)
	b[4] = h.flags
	b[5] = h.nak
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint32(b[8:], h.psn)
	binary.LittleEndian.PutUint32(b[12:], h.imm)
	binary.LittleEndian.PutUint32(b[16:], uint32(h.key))
	binary.LittleEndian.PutUint64(b[20:], h.va)
	binary.LittleEndian.PutUint32(b[28:], h.length)
	binary.LittleEndian.PutUint32(b[32:], h.paylen)
}

// decodeHeader parses and validates a frame header from a peer that may be
// hostile: every field that sizes a later read or copy is bounded here.
func decodeHeader(b []byte, h *header) error {
	if len(b) < headerLen {
		return fmt.Errorf("%w: header of %d bytes", errBadFrame, len(b))
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != frameMagic {
		return fmt.Errorf("%w: magic %#04x", errBadFrame, m)
	}
	if b[2] != frameVersion {
		return fmt.Errorf("%w: version %d", errBadFrame, b[2])
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return fmt.Errorf("%w: reserved bits %#x", errBadFrame, r)
	}
	*h = header{
		kind:   pktKind(b[3]),
		flags:  b[4],
		nak:    b[5],
		psn:    binary.LittleEndian.Uint32(b[8:]),
		imm:    binary.LittleEndian.Uint32(b[12:]),
		key:    transport.Key(binary.LittleEndian.Uint32(b[16:])),
		va:     binary.LittleEndian.Uint64(b[20:]),
		length: binary.LittleEndian.Uint32(b[28:]),
		paylen: binary.LittleEndian.Uint32(b[32:]),
	}
	if h.flags&^(pfImm|pfInv|pfSolicited) != 0 {
		return fmt.Errorf("%w: flags %#x", errBadFrame, h.flags)
	}
	switch h.kind {
	case pktSend, pktWrite, pktReadResp:
		if h.paylen > maxMsgSize {
			return fmt.Errorf("%w: %s payload of %d bytes (max %d)", errBadFrame, h.kind, h.paylen, maxMsgSize)
		}
	case pktRead:
		if h.paylen != 0 || h.length > maxMsgSize {
			return fmt.Errorf("%w: READ of %d bytes with %d payload bytes", errBadFrame, h.length, h.paylen)
		}
	case pktAck, pktDisconnect:
		if h.paylen != 0 {
			return fmt.Errorf("%w: %s with %d payload bytes", errBadFrame, h.kind, h.paylen)
		}
	case pktNak:
		if h.paylen != 0 || h.nak < nakRNR || h.nak > nakRemOp {
			return fmt.Errorf("%w: NAK code %d with %d payload bytes", errBadFrame, h.nak, h.paylen)
		}
	case cmReq:
		if h.imm > 0xffff {
			return fmt.Errorf("%w: connect request with READ credit %#x", errBadFrame, h.imm)
		}
		if h.paylen > transport.MaxConnectPrivateData {
			return fmt.Errorf("%w: connect request with %d bytes of private data", errBadFrame, h.paylen)
		}
	case cmRep:
		if h.imm > 0xffff {
			return fmt.Errorf("%w: accept with READ credit %#x", errBadFrame, h.imm)
		}
		if h.paylen > transport.MaxAcceptPrivateData {
			return fmt.Errorf("%w: accept with %d bytes of private data", errBadFrame, h.paylen)
		}
	case cmRej:
		if h.paylen > transport.MaxRejectPrivateData {
			return fmt.Errorf("%w: reject with %d bytes of private data", errBadFrame, h.paylen)
		}
	default:
		return fmt.Errorf("%w: kind %#x", errBadFrame, uint8(h.kind))
	}
	if h.kind != pktSend && h.kind != pktWrite && h.flags != 0 {
		return fmt.Errorf("%w: flags %#x on %s", errBadFrame, h.flags, h.kind)
	}
	return nil
}

func (k pktKind) String() string {
	switch k {
	case pktSend:
		return "SEND"
	case pktWrite:
		return "WRITE"
	case pktRead:
		return "READ"
	case pktAck:
		return "ACK"
	case pktNak:
		return "NAK"
	case pktReadResp:
		return "READ_RESP"
	case pktDisconnect:
		return "DREQ"
	case cmReq:
		return "CM_REQ"
	case cmRep:
		return "CM_REP"
	case cmRej:
		return "CM_REJ"
	}
	return fmt.Sprintf("kind(%#x)", uint8(k))
}
