package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
)

// Opcode is the first byte of every IU.
type Opcode uint8

// IU opcodes. Initiator → target below 0x80, target → initiator above.
const (
	OpLogin          Opcode = 0x01 // msgpack LoginRequest
	OpCommand        Opcode = 0x02 // fixed Command
	OpControl        Opcode = 0x03 // msgpack ControlRequest
	OpLoginProof     Opcode = 0x04 // msgpack LoginProof
	OpLogout         Opcode = 0x05 // no body
	OpLoginResponse  Opcode = 0xC0 // msgpack LoginResponse
	OpResponse       Opcode = 0xC1 // fixed Response
	OpLoginReject    Opcode = 0xC2 // msgpack LoginReject
	OpControlResp    Opcode = 0xC3 // msgpack ControlResponse
	OpLoginChallenge Opcode = 0xC4 // msgpack LoginChallenge
	OpPathNotice     Opcode = 0xC5 // msgpack PathNotice, unsolicited
)

func (o Opcode) String() string { return enum.Hex(opcodeNames[:], o, "Opcode") }

var opcodeNames = [...]string{
	OpLogin: "LOGIN", OpCommand: "COMMAND", OpControl: "CONTROL", OpLoginProof: "LOGIN_PROOF", OpLogout: "LOGOUT",
	OpLoginResponse: "LOGIN_RESPONSE", OpResponse: "RESPONSE", OpLoginReject: "LOGIN_REJECT",
	OpControlResp: "CONTROL_RESPONSE", OpLoginChallenge: "LOGIN_CHALLENGE", OpPathNotice: "PATH_NOTICE",
}

// Errors decoders return; they wrap ErrMalformed so callers can treat every
// protocol violation alike.
var (
	ErrMalformed = errors.New("wire: malformed IU")
	ErrTooLarge  = errors.New("wire: IU too large")
)

// PeekOpcode returns the opcode of an IU.
func PeekOpcode(b []byte) (Opcode, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty", ErrMalformed)
	}
	return Opcode(b[0]), nil
}

// Op is a command's operation.
type Op uint8

// Command operations.
const (
	OpRead Op = iota + 1
	OpWrite
	OpFlush
	OpDiscard
	OpWriteZeroes
)

func (o Op) String() string { return enum.Name(opNames[:], o, "Op") }

var opNames = [...]string{OpRead: "READ", OpWrite: "WRITE", OpFlush: "FLUSH", OpDiscard: "DISCARD", OpWriteZeroes: "WRITE_ZEROES"}

// HasData reports whether the operation moves data through descriptors.
func (o Op) HasData() bool { return o == OpRead || o == OpWrite }

// Command flags.
const (
	// FlagFUA: the write is durable before the response (Force Unit Access).
	FlagFUA uint8 = 1 << iota
	// FlagInvalidate: answer with SEND_WITH_INV naming InvalidateKey.
	FlagInvalidate
	// FlagImmediate: a WRITE's Length bytes of data follow the header in
	// the IU itself, with no descriptor (SRP-2 immediate data, which
	// Linux's ib_srp uses for writes up to max_imm_data): the target has
	// the data on arrival, and neither side registers memory or moves it
	// with an RDMA READ. Only up to LoginResponse.MaxImmediate bytes.
	FlagImmediate
)

// Descriptor is a direct data buffer descriptor: Len bytes at VA in the
// initiator's memory, reachable with RKey (SRP srp_direct_buf, RPC-over-RDMA
// segment).
type Descriptor struct {
	VA   uint64
	RKey uint32
	Len  uint32
}

// MaxDescriptors is the most descriptors one command carries inline (the
// indirect form: several MRs for one transfer, SRP's partial table).
const MaxDescriptors = 16

// CommandHeaderLen is the size of a command without descriptors.
const CommandHeaderLen = 40

// DescriptorLen is the encoded size of a Descriptor.
const DescriptorLen = 16

// MaxCommandLen is the largest command IU.
const MaxCommandLen = CommandHeaderLen + MaxDescriptors*DescriptorLen

// Command is a block I/O request. Layout (little-endian):
//
//	0  opcode u8 = OpCommand
//	1  op     u8
//	2  flags  u8
//	3  ndesc  u8  descriptors that follow (0 for FLUSH/DISCARD/WRITE_ZEROES)
//	4  volume u32 handle from an OPEN control request
//	8  tag    u64 chosen by the initiator, echoed in the response
//	16 offset u64 byte offset in the volume
//	24 length u32 bytes
//	28 invkey u32 rkey to invalidate with SEND_WITH_INV
//	32 rsv    u64 zero
//	40 descriptors, 16 bytes each: va u64, rkey u32, len u32
type Command struct {
	Op            Op
	Flags         uint8
	Volume        uint32
	Tag           uint64
	Offset        uint64
	Length        uint32
	InvalidateKey uint32
	NDesc         int
	Desc          [MaxDescriptors]Descriptor
	// Immediate is, after Decode of a command with FlagImmediate, its data:
	// it aliases the decoded IU, so it is valid only as long as that
	// buffer is. Encode ignores it (see Encode).
	Immediate []byte
}

// EncodedLen is the command's encoded size, without immediate data.
func (c *Command) EncodedLen() int { return CommandHeaderLen + c.NDesc*DescriptorLen }

// Encode writes the command into b, which must hold EncodedLen bytes, and
// returns the bytes written. With FlagImmediate it writes the header only:
// the sender gathers the Length bytes of data from where they are, as the
// IU's next scatter/gather element, rather than copying them here.
func (c *Command) Encode(b []byte) (int, error) {
	if c.NDesc < 0 || c.NDesc > MaxDescriptors {
		return 0, fmt.Errorf("wire: command with %d descriptors (max %d): %w", c.NDesc, MaxDescriptors, ErrTooLarge)
	}
	if c.Flags&FlagImmediate != 0 {
		if err := c.checkImmediate(); err != nil {
			return 0, err
		}
	}
	n := c.EncodedLen()
	if len(b) < n {
		return 0, fmt.Errorf("wire: command needs %d bytes, buffer has %d: %w", n, len(b), ErrTooLarge)
	}
	b[0] = byte(OpCommand)
	b[1] = byte(c.Op)
	b[2] = c.Flags
	b[3] = byte(c.NDesc)
	le := binary.LittleEndian
	le.PutUint32(b[4:], c.Volume)
	le.PutUint64(b[8:], c.Tag)
	le.PutUint64(b[16:], c.Offset)
	le.PutUint32(b[24:], c.Length)
	le.PutUint32(b[28:], c.InvalidateKey)
	le.PutUint64(b[32:], 0)
	for i := 0; i < c.NDesc; i++ {
		d := b[CommandHeaderLen+i*DescriptorLen:]
		le.PutUint64(d, c.Desc[i].VA)
		le.PutUint32(d[8:], c.Desc[i].RKey)
		le.PutUint32(d[12:], c.Desc[i].Len)
	}
	return n, nil
}

// Decode parses a command IU into c without allocating. It checks the
// layout only; whether the request makes sense for a volume is the
// target's business.
func (c *Command) Decode(b []byte) error {
	c.Immediate = nil
	if len(b) < CommandHeaderLen {
		return fmt.Errorf("%w: command of %d bytes", ErrMalformed, len(b))
	}
	if Opcode(b[0]) != OpCommand {
		return fmt.Errorf("%w: opcode %s is not a command", ErrMalformed, Opcode(b[0]))
	}
	le := binary.LittleEndian
	c.Op = Op(b[1])
	c.Flags = b[2]
	c.NDesc = int(b[3])
	c.Volume = le.Uint32(b[4:])
	c.Tag = le.Uint64(b[8:])
	c.Offset = le.Uint64(b[16:])
	c.Length = le.Uint32(b[24:])
	c.InvalidateKey = le.Uint32(b[28:])
	switch {
	case c.Op < OpRead || c.Op > OpWriteZeroes:
		return fmt.Errorf("%w: command op %d", ErrMalformed, b[1])
	case c.Flags&^(FlagFUA|FlagInvalidate|FlagImmediate) != 0:
		return fmt.Errorf("%w: command flags %#x", ErrMalformed, c.Flags)
	case le.Uint64(b[32:]) != 0:
		return fmt.Errorf("%w: reserved bytes set", ErrMalformed)
	case c.Flags&FlagImmediate != 0:
		return c.decodeImmediate(b)
	case c.NDesc > MaxDescriptors:
		return fmt.Errorf("%w: %d descriptors (max %d)", ErrMalformed, c.NDesc, MaxDescriptors)
	case len(b) != CommandHeaderLen+c.NDesc*DescriptorLen:
		return fmt.Errorf("%w: command of %d bytes with %d descriptors", ErrMalformed, len(b), c.NDesc)
	case c.Op.HasData() != (c.NDesc > 0) && c.Length > 0:
		return fmt.Errorf("%w: %s with %d descriptors", ErrMalformed, c.Op, c.NDesc)
	}
	var total uint64
	for i := 0; i < c.NDesc; i++ {
		d := b[CommandHeaderLen+i*DescriptorLen:]
		c.Desc[i] = Descriptor{VA: le.Uint64(d), RKey: le.Uint32(d[8:]), Len: le.Uint32(d[12:])}
		total += uint64(c.Desc[i].Len)
	}
	if c.Op.HasData() && total != uint64(c.Length) {
		return fmt.Errorf("%w: descriptors cover %d bytes, command length %d", ErrMalformed, total, c.Length)
	}
	return nil
}

// checkImmediate reports whether a command with FlagImmediate may carry
// it: a WRITE with no descriptors and nothing to invalidate.
func (c *Command) checkImmediate() error {
	switch {
	case c.Op != OpWrite:
		return fmt.Errorf("%w: immediate data on a %s", ErrMalformed, c.Op)
	case c.NDesc != 0:
		return fmt.Errorf("%w: immediate data with %d descriptors", ErrMalformed, c.NDesc)
	case c.Flags&FlagInvalidate != 0:
		return fmt.Errorf("%w: immediate data with a key to invalidate", ErrMalformed)
	}
	return nil
}

// decodeImmediate checks the rest of a command with FlagImmediate: what
// checkImmediate checks, and exactly Length > 0 bytes after the header.
func (c *Command) decodeImmediate(b []byte) error {
	if err := c.checkImmediate(); err != nil {
		return err
	}
	if c.Length == 0 || uint64(len(b)) != CommandHeaderLen+uint64(c.Length) {
		return fmt.Errorf("%w: command of %d bytes with %d bytes of immediate data", ErrMalformed, len(b), c.Length)
	}
	c.Immediate = b[CommandHeaderLen:]
	return nil
}

// Status is a response's outcome.
type Status uint8

// Response statuses.
const (
	StatusGood Status = iota
	StatusError
	// StatusBusy: the target could not run the command now; retry.
	StatusBusy
)

// Sense says why a command failed (a SCSI-sense-like code).
type Sense uint16

// Sense codes.
const (
	SenseNone Sense = iota
	SenseInvalidField
	SenseOutOfRange
	SenseMisaligned
	SenseWriteProtected
	SenseUnsupported
	SenseMediumError
	SenseNoSuchVolume
	SenseDataTransfer // an RDMA transfer through the descriptors failed
	SenseInternal
	// SenseAccessDenied: the ACL does not let this initiator do it (any
	// more: the target closes a handle whose access was revoked, and
	// answers its commands so). Added after the others, so an older peer
	// reads it as an unknown sense, a failed command.
	SenseAccessDenied
	// SenseSpaceAllocFailed: the target's store has no space for the
	// write (SBC-4's DATA PROTECT, ASC/ASCQ 27h/07h SPACE ALLOCATION
	// FAILED WRITE PROTECT, which a thin-provisioned SCSI LU returns when
	// its pool is exhausted). Reads still work and the write may succeed
	// later; initiators report it as ENOSPC.
	SenseSpaceAllocFailed
	// SenseReservationConflict: a reservation another host holds
	// forbids the command (SAM-5's RESERVATION CONFLICT). SCSI makes it
	// a status; here it is a sense of StatusError, because an older
	// initiator refuses an unknown status as malformed and drops the
	// connection, while it reads an unknown sense as a failed command.
	SenseReservationConflict
	// SenseNotActive: this target is a standby gateway for the volume
	// (PathStandby), or stopped being the active one (another gateway
	// fenced it): the command was not run. The initiator retries it on
	// the active path, or asks this one to take over (ALUA's NOT READY,
	// ASC/ASCQ 04h/0Bh LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN
	// STANDBY STATE; NVMe's ANA Inaccessible).
	SenseNotActive
	// SenseBecomingReady: the target is still opening the volume (its
	// store has not answered in the target's open wait): the OPEN did
	// nothing, and the initiator tries it again (SPC-4's NOT READY,
	// ASC/ASCQ 04h/01h LOGICAL UNIT IS IN PROCESS OF BECOMING READY).
	// An older initiator reads it as an unknown sense, a failed open.
	SenseBecomingReady
)

var senseNames = [...]string{"none", "invalid field", "out of range", "misaligned", "write protected",
	"unsupported", "medium error", "no such volume", "data transfer failed", "internal error", "access denied",
	"space allocation failed", "reservation conflict", "path not active", "becoming ready"}

func (s Sense) String() string { return enum.Name(senseNames[:], s, "Sense") }

// ResponseLen is the size of a Response IU; ResponseNoticeLen that of one
// carrying a notice (RespCapacityChanged).
const (
	ResponseLen       = 24
	ResponseNoticeLen = 32
)

// RespCapacityChanged is the response flag of a capacity notice: the
// volume the command addressed changed size since the initiator last
// learned it, and Size is its new size. It is SCSI's UNIT ATTENTION
// "capacity data has changed" (SPC-4 ASC/ASCQ 2Ah/09h) without the
// failed command: the target marks each open handle of a resized volume
// and the next response on that handle carries the notice, whatever its
// status. A target sends it only to an initiator that asked at login
// (LoginRequest.Notices): an older initiator reads a nonzero reserved
// field as a malformed IU.
const RespCapacityChanged uint32 = 1

// Response answers a Command. Layout (little-endian):
//
//	0  opcode   u8 = OpResponse
//	1  status   u8
//	2  sense    u16
//	4  credits  u32 credit delta returned to the initiator
//	8  tag      u64
//	16 residual u32 bytes not transferred
//	20 flags    u32 zero, or RespCapacityChanged
//	24 size     u64 with RespCapacityChanged only: the volume's new size
type Response struct {
	Status   Status
	Sense    Sense
	Credits  uint32
	Tag      uint64
	Residual uint32
	Flags    uint32
	Size     uint64
}

// EncodedLen is the response's encoded size: ResponseNoticeLen with a
// capacity notice, else ResponseLen.
func (r *Response) EncodedLen() int {
	if r.Flags&RespCapacityChanged != 0 {
		return ResponseNoticeLen
	}
	return ResponseLen
}

// Encode writes the response into b (at least EncodedLen bytes) and
// returns the bytes written.
func (r *Response) Encode(b []byte) (int, error) {
	n := r.EncodedLen()
	if len(b) < n {
		return 0, fmt.Errorf("wire: response needs %d bytes, buffer has %d: %w", n, len(b), ErrTooLarge)
	}
	if r.Flags&^RespCapacityChanged != 0 {
		return 0, fmt.Errorf("%w: response flags %#x", ErrMalformed, r.Flags)
	}
	le := binary.LittleEndian
	b[0] = byte(OpResponse)
	b[1] = byte(r.Status)
	le.PutUint16(b[2:], uint16(r.Sense))
	le.PutUint32(b[4:], r.Credits)
	le.PutUint64(b[8:], r.Tag)
	le.PutUint32(b[16:], r.Residual)
	le.PutUint32(b[20:], r.Flags)
	if n == ResponseNoticeLen {
		le.PutUint64(b[24:], r.Size)
	}
	return n, nil
}

// Decode parses a response IU into r without allocating.
func (r *Response) Decode(b []byte) error {
	if len(b) != ResponseLen && len(b) != ResponseNoticeLen {
		return fmt.Errorf("%w: response of %d bytes", ErrMalformed, len(b))
	}
	if Opcode(b[0]) != OpResponse {
		return fmt.Errorf("%w: opcode %s is not a response", ErrMalformed, Opcode(b[0]))
	}
	le := binary.LittleEndian
	r.Status = Status(b[1])
	r.Sense = Sense(le.Uint16(b[2:]))
	r.Credits = le.Uint32(b[4:])
	r.Tag = le.Uint64(b[8:])
	r.Residual = le.Uint32(b[16:])
	if r.Status > StatusBusy {
		return fmt.Errorf("%w: response status %d", ErrMalformed, r.Status)
	}
	r.Flags, r.Size = le.Uint32(b[20:]), 0
	switch {
	case r.Flags&^RespCapacityChanged != 0:
		return fmt.Errorf("%w: response flags %#x", ErrMalformed, r.Flags)
	case (len(b) == ResponseNoticeLen) != (r.Flags&RespCapacityChanged != 0):
		return fmt.Errorf("%w: response of %d bytes with flags %#x", ErrMalformed, len(b), r.Flags)
	case len(b) == ResponseNoticeLen:
		r.Size = le.Uint64(b[24:])
	}
	return nil
}
