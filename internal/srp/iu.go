package srp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
)

// be is SRP's byte order: every multi-byte field is big-endian (SRP r16a
// 5.1), unlike gosrp's own IUs.
var be = binary.BigEndian

// Opcode is the first byte of every SRP IU (SRP r16a 5.1). The
// initiator sends those below 0x80 and the responses to target requests
// (0x4x); the target sends those from 0x80 up.
type Opcode uint8

// IU opcodes, SRP r16a 6 (the kernel names them SRP_*).
const (
	OpLoginReq    Opcode = 0x00 // SRP_LOGIN_REQ
	OpTaskMgmt    Opcode = 0x01 // SRP_TSK_MGMT
	OpCmd         Opcode = 0x02 // SRP_CMD
	OpILogout     Opcode = 0x03 // SRP_I_LOGOUT
	OpCredRsp     Opcode = 0x41 // SRP_CRED_RSP
	OpAERRsp      Opcode = 0x42 // SRP_AER_RSP
	OpTLogout     Opcode = 0x80 // SRP_T_LOGOUT
	OpCredReq     Opcode = 0x81 // SRP_CRED_REQ
	OpAERReq      Opcode = 0x82 // SRP_AER_REQ
	OpLoginRsp    Opcode = 0xC0 // SRP_LOGIN_RSP
	OpRsp         Opcode = 0xC1 // SRP_RSP
	OpLoginReject Opcode = 0xC2 // SRP_LOGIN_REJ
)

var opcodeNames = [...]string{
	OpLoginReq: "SRP_LOGIN_REQ", OpTaskMgmt: "SRP_TSK_MGMT", OpCmd: "SRP_CMD", OpILogout: "SRP_I_LOGOUT",
	OpCredRsp: "SRP_CRED_RSP", OpAERRsp: "SRP_AER_RSP",
	OpTLogout: "SRP_T_LOGOUT", OpCredReq: "SRP_CRED_REQ", OpAERReq: "SRP_AER_REQ",
	OpLoginRsp: "SRP_LOGIN_RSP", OpRsp: "SRP_RSP", OpLoginReject: "SRP_LOGIN_REJ",
}

// String names the opcode as the standard does ("SRP_CMD"), or
// Opcode(0xNN) for one it does not define.
func (o Opcode) String() string { return enum.Hex(opcodeNames[:], o, "Opcode") }

// Errors. Every decoding error wraps ErrMalformed, with what was wrong;
// every encoding error for a buffer too small or a field out of range
// wraps ErrTooLarge or ErrMalformed likewise.
var (
	ErrMalformed = errors.New("srp: malformed IU")
	ErrTooLarge  = errors.New("srp: IU too large")
)

// PeekOpcode returns the opcode of an IU that arrived in a SEND: the
// first byte (the RDMA-CM login form is the one IU whose opcode is not
// first; it is decoded by LoginRequest.DecodeRDMA, never peeked).
func PeekOpcode(b []byte) (Opcode, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty IU", ErrMalformed)
	}
	return Opcode(b[0]), nil
}

// LUN is a logical unit number as SAM-5 encodes it in 8 bytes (SRP
// carries it opaquely; package scsi decodes it).
type LUN [8]byte

// Buffer formats a login negotiates (SRP r16a 6.2, REQUIRED/SUPPORTED
// BUFFER FORMATS; SRP_BUF_FORMAT_* in the kernel).
const (
	BufFormatDirect   uint16 = 1 << 1 // direct data buffer descriptors
	BufFormatIndirect uint16 = 1 << 2 // indirect tables
)

// Format is the kind of data buffer descriptor an SRP_CMD carries for one
// direction (SRP r16a 5.5; the immediate form is SRP-2's).
type Format uint8

// Descriptor formats.
const (
	FormatNone      Format = 0 // no data in this direction
	FormatDirect    Format = 1 // one Descriptor
	FormatIndirect  Format = 2 // an indirect table: header and a partial table inline
	FormatImmediate Format = 3 // data-out only: the data rides in the IU (SRP-2)
)

var formatNames = [...]string{FormatNone: "none", FormatDirect: "direct", FormatIndirect: "indirect", FormatImmediate: "immediate"}

func (f Format) String() string { return enum.Name(formatNames[:], f, "Format") }

// DescriptorLen is the size of a direct data buffer descriptor.
const DescriptorLen = 16

// Descriptor is a direct data buffer descriptor (SRP r16a 5.5.2,
// struct srp_direct_buf): Len bytes at VA in the initiator's memory,
// reachable with Key.
//
//	0  va  u64
//	8  key u32
//	12 len u32
type Descriptor struct {
	VA  uint64
	Key uint32
	Len uint32
}

func putDescriptor(b []byte, d Descriptor) {
	be.PutUint64(b, d.VA)
	be.PutUint32(b[8:], d.Key)
	be.PutUint32(b[12:], d.Len)
}

func getDescriptor(b []byte) Descriptor {
	return Descriptor{VA: be.Uint64(b), Key: be.Uint32(b[8:]), Len: be.Uint32(b[12:])}
}

// need returns an error wrapping ErrMalformed unless b holds at least n
// bytes of the named IU and starts with op.
func need(b []byte, n int, op Opcode) error {
	if len(b) < n {
		return fmt.Errorf("%w: %s of %d bytes, want at least %d", ErrMalformed, op, len(b), n)
	}
	if Opcode(b[0]) != op {
		return fmt.Errorf("%w: opcode %s where %s was expected", ErrMalformed, Opcode(b[0]), op)
	}
	return nil
}

// room returns an error wrapping ErrTooLarge unless b can hold n bytes.
func room(b []byte, n int, op Opcode) error {
	if len(b) < n {
		return fmt.Errorf("%w: %s needs %d bytes, buffer has %d", ErrTooLarge, op, n, len(b))
	}
	return nil
}
