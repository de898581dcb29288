package wire

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/msgpackcheck"
	"github.com/vmihailenco/msgpack/v5"
)

// Version is the protocol version this package speaks.
const Version = 1

// HelloLen is the size of Hello, which fits RDMA-CM's 56-byte connect
// private data.
const HelloLen = 8

var helloMagic = [4]byte{'G', 'S', 'R', 'P'}

// Hello is the RDMA-CM private data of connect and of a version reject.
// Layout: magic "GSRP", version u16 LE, flags u16 LE (zero).
type Hello struct {
	Version uint16
}

// Encode returns the hello's bytes.
func (h Hello) Encode() []byte {
	b := make([]byte, HelloLen)
	copy(b, helloMagic[:])
	binary.LittleEndian.PutUint16(b[4:], h.Version)
	return b
}

// DecodeHello parses a Hello. Private data may arrive zero-padded (IB CM
// pads to its fixed size), so bytes after the Hello are ignored.
func DecodeHello(b []byte) (Hello, error) {
	if len(b) < HelloLen || !bytes.Equal(b[:4], helloMagic[:]) {
		return Hello{}, fmt.Errorf("%w: not a gosrp hello (%d bytes)", ErrMalformed, len(b))
	}
	return Hello{Version: binary.LittleEndian.Uint16(b[4:])}, nil
}

// LoginRequest opens a session (initiator → target, first SEND).
type LoginRequest struct {
	Version   uint16 `msgpack:"v"`
	Initiator string `msgpack:"ini"`
	Target    string `msgpack:"tgt,omitempty"`
	// Credits is how many requests the initiator would like outstanding.
	Credits uint32 `msgpack:"cr"`
	// MaxIU is the largest IU the initiator will send; MaxRecvIU the
	// largest it can receive.
	MaxIU     uint32 `msgpack:"miu"`
	MaxRecvIU uint32 `msgpack:"mriu"`
	// MaxTransfer is the largest data transfer per command the initiator
	// will ask for; MaxDesc the most descriptors per command.
	MaxTransfer uint32 `msgpack:"mxt"`
	MaxDesc     uint8  `msgpack:"mxd"`
	// RemoteInvalidate says the initiator accepts SEND_WITH_INV responses.
	RemoteInvalidate bool `msgpack:"rinv"`
	// Nonce is the initiator's half of the authentication challenge.
	Nonce []byte `msgpack:"n,omitempty"`
	// Session and Channel identify the channel this connection carries.
	// A login for a channel the target still serves on an older
	// connection replaces it: the target ends the old connection and
	// waits for its volume I/O to finish before answering, so no write
	// from the dead connection can land after one the new connection
	// acknowledges (iSCSI session reinstatement, RFC 7143 §6.3.5). Zero
	// opts out.
	Session uint64 `msgpack:"sid,omitempty"`
	Channel uint16 `msgpack:"ch,omitempty"`
	// MaxImmediate is the most data the initiator would like to send in
	// a WRITE command's IU (FlagImmediate); zero asks for none. A target
	// that predates immediate data ignores it and grants none.
	MaxImmediate uint32 `msgpack:"imm,omitempty"`
	// Notices says the initiator reads capacity notices in responses
	// (RespCapacityChanged). A target that predates them ignores it and
	// sends none.
	Notices bool `msgpack:"ntc,omitempty"`
	// PathNotices says the initiator reads unsolicited PathNotice IUs
	// (pathstate.go) and keeps a receive posted beyond its credits for
	// them. A target that predates them ignores it and sends none.
	PathNotices bool `msgpack:"pn,omitempty"`
}

// LoginChallenge asks the initiator to prove it holds the shared secret.
type LoginChallenge struct {
	Method string `msgpack:"m"` // "hmac-sha256"
	Nonce  []byte `msgpack:"n"`
}

// LoginProof answers a challenge.
type LoginProof struct {
	Proof []byte `msgpack:"p"`
}

// LoginResponse accepts a session with the target's limits.
type LoginResponse struct {
	Version     uint16 `msgpack:"v"`
	Target      string `msgpack:"tgt"`
	Credits     uint32 `msgpack:"cr"`
	MaxIU       uint32 `msgpack:"miu"`  // largest IU the target accepts
	MaxRecvIU   uint32 `msgpack:"mriu"` // largest IU the target sends
	MaxTransfer uint32 `msgpack:"mxt"`
	MaxDesc     uint8  `msgpack:"mxd"`
	// RemoteInvalidate says the target will answer with SEND_WITH_INV when
	// a command asks for it.
	RemoteInvalidate bool   `msgpack:"rinv"`
	SessionID        uint64 `msgpack:"sid"`
	// Proof, after a challenge, proves the target holds the secret too.
	Proof []byte `msgpack:"p,omitempty"`
	// MaxImmediate is the most immediate data the target accepts in one
	// WRITE command (at most what the initiator asked for); zero: none.
	MaxImmediate uint32 `msgpack:"imm,omitempty"`
	// Instance is the target's write verifier (NFS's writeverf): a value
	// that changes whenever writes the target acknowledged but had not
	// yet made durable may have been lost, as when its process restarts.
	// An initiator that sees it change across a reconnect must replay or
	// fail what it had not flushed. Zero: the target makes no such
	// promise (it predates the field).
	Instance uint64 `msgpack:"inst,omitempty"`
	// Notices says the target will send capacity notices
	// (RespCapacityChanged), as the initiator asked.
	Notices bool `msgpack:"ntc,omitempty"`
	// PathNotices says the target will send PathNotice IUs, as the
	// initiator asked.
	PathNotices bool `msgpack:"pn,omitempty"`
}

// RejectReason says why a login failed.
type RejectReason uint8

// Reject reasons (SRP_LOGIN_REJ's reasons, plus authentication).
const (
	RejectUnspecified RejectReason = iota
	RejectVersion
	RejectAccessDenied
	RejectAuthFailed
	RejectIUTooLarge
	RejectInsufficientResources
	RejectUnknownVolume
	RejectProtocol
	RejectShuttingDown
)

var rejectNames = [...]string{"unspecified", "version unsupported", "access denied", "authentication failed",
	"IU too large", "insufficient resources", "unknown volume", "protocol violation", "target shutting down"}

func (r RejectReason) String() string { return enum.Name(rejectNames[:], r, "RejectReason") }

// LoginReject refuses a login; the target disconnects after sending it.
type LoginReject struct {
	Reason     RejectReason `msgpack:"r"`
	Message    string       `msgpack:"msg,omitempty"`
	MinVersion uint16       `msgpack:"minv,omitempty"`
	MaxVersion uint16       `msgpack:"maxv,omitempty"`
}

// Control operations.
const (
	ControlList  = "list"  // volumes this initiator may open
	ControlOpen  = "open"  // open Volume, returns a handle
	ControlClose = "close" // close Handle
	// ControlExtents asks which parts of [Offset, Offset+Length) of the
	// volume open as Handle hold data. A target that predates it answers
	// SenseUnsupported; the initiator then takes the range as allocated.
	ControlExtents = "extents"
	// ControlPing asks for an empty answer: the initiator's keepalive
	// (NVMe-oF's Keep Alive, iSCSI's NOP-Out). A target that predates
	// it answers SenseUnsupported, which proves it alive just as well.
	ControlPing = "ping"
	// ControlReserveOut and ControlReserveIn are in reservation.go.
)

// ControlRequest is a non-I/O request; it consumes a credit like a command.
type ControlRequest struct {
	Tag      uint64 `msgpack:"t"`
	Op       string `msgpack:"op"`
	Volume   string `msgpack:"vol,omitempty"`
	Handle   uint32 `msgpack:"h,omitempty"`
	ReadOnly bool   `msgpack:"ro,omitempty"`
	// Offset and Length, in bytes, are the range of an extents request.
	Offset uint64 `msgpack:"off,omitempty"`
	Length uint64 `msgpack:"len,omitempty"`
	// Exclusive, on an open, asks for the volume as its only writer: an
	// implicit write-exclusive reservation held by this session until it
	// closes the volume or ends. A target that predates it ignores it.
	Exclusive bool `msgpack:"excl,omitempty"`
	// Takeover, on an open, asks a standby gateway to become the active
	// one (pathstate.go): it fences the old owner and takes the volume
	// before it answers, and before it serves any I/O. A target that
	// predates it ignores it and answers as for a plain open.
	Takeover bool `msgpack:"tko,omitempty"`
	// Action, Key, NewKey and Type are a ControlReserveOut's service
	// action, reservation key, service action key and type; Dest and
	// Unreg an ActionRegisterMove's destination host (its initiator
	// name) and whether the holder unregisters. Ports are the other
	// hosts an SRP host's REGISTER names by TransportID (SPC-4 SPEC_I_PT),
	// registered with NewKey too; gosrp's protocol has no such request,
	// so they never travel on its wire.
	Action ReserveAction   `msgpack:"pra,omitempty"`
	Key    uint64          `msgpack:"prk,omitempty"`
	NewKey uint64          `msgpack:"prn,omitempty"`
	Type   ReservationType `msgpack:"prt,omitempty"`
	Dest   string          `msgpack:"prd,omitempty"`
	Unreg  bool            `msgpack:"pru,omitempty"`
	Ports  []string        `msgpack:"-"`
}

// VolumeInfo describes a volume in a list.
type VolumeInfo struct {
	Name      string `msgpack:"name"`
	Size      uint64 `msgpack:"size"`
	BlockSize uint32 `msgpack:"bs"`
	ReadOnly  bool   `msgpack:"ro,omitempty"`
}

// ControlResponse answers a ControlRequest.
type ControlResponse struct {
	Tag     uint64 `msgpack:"t"`
	Credits uint32 `msgpack:"cr"`
	Sense   Sense  `msgpack:"s,omitempty"`
	Error   string `msgpack:"err,omitempty"`
	// list
	Volumes []VolumeInfo `msgpack:"vols,omitempty"`
	// open
	Handle    uint32 `msgpack:"h,omitempty"`
	Size      uint64 `msgpack:"size,omitempty"`
	BlockSize uint32 `msgpack:"bs,omitempty"`
	ReadOnly  bool   `msgpack:"ro,omitempty"`
	Caps      uint32 `msgpack:"caps,omitempty"`
	// PathState, on an open, says whether this target serves the volume
	// now (PathActive, the zero value, which an older target's answer
	// reads as) or is a standby gateway for it (pathstate.go).
	PathState PathState `msgpack:"ps,omitempty"`
	// Identity, on an open, tells the volume from any other ever given
	// its name (target.Identifier); zero from a target or volume that
	// knows none. An initiator re-opening the volume after a reconnect
	// checks that it is the one it wrote to.
	Identity uint64 `msgpack:"id,omitempty"`
	// extents: consecutive runs from the request's Offset, at least one
	// and at most MaxExtents, covering a prefix of the range asked (the
	// initiator asks again for the rest).
	Extents []Extent `msgpack:"ext,omitempty"`
	// reservations (ControlReserveIn, and ControlReserveOut's
	// Generation): SPC-4's PRgeneration, bumped by every change of the
	// registrations; the holder and its key and type; the registrations.
	Generation  uint32          `msgpack:"gen,omitempty"`
	Holder      string          `msgpack:"hold,omitempty"`
	HolderKey   uint64          `msgpack:"hkey,omitempty"`
	ResType     ReservationType `msgpack:"rtyp,omitempty"`
	Registrants []Registrant    `msgpack:"regs,omitempty"`
	// ExclusiveHolder, in a report, says a session holds the volume open
	// exclusively (ControlRequest.Exclusive); its initiator's name.
	ExclusiveHolder string `msgpack:"xhold,omitempty"`
}

// Extent is a run of a volume with one allocation state. It is encoded
// as an array (length, flags), not a map, to fit MaxExtents in one IU.
type Extent struct {
	Length uint64
	// Flags is a set of ExtentHole and ExtentZero (the bits NBD's
	// base:allocation uses): no flag means allocated, contents unknown.
	Flags uint32
}

// EncodeMsgpack implements msgpack.CustomEncoder: [length, flags].
func (e Extent) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(2); err != nil {
		return err
	}
	if err := enc.EncodeUint(e.Length); err != nil {
		return err
	}
	return enc.EncodeUint(uint64(e.Flags))
}

// DecodeMsgpack implements msgpack.CustomDecoder. Elements after the
// second are skipped, so that a later version may add some.
func (e *Extent) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := decodeTuple(dec, "extent", 2)
	if err != nil {
		return err
	}
	if e.Length, err = dec.DecodeUint64(); err != nil {
		return err
	}
	if e.Flags, err = dec.DecodeUint32(); err != nil {
		return err
	}
	return skipRest(dec, n-2)
}

// decodeTuple reads the header of an array-encoded struct of at least
// want elements and returns its length.
func decodeTuple(dec *msgpack.Decoder, what string, want int) (int, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < want {
		return 0, fmt.Errorf("wire: %s of %d elements, want %d", what, n, want)
	}
	return n, nil
}

// skipRest skips the n elements a later version appended to a tuple.
func skipRest(dec *msgpack.Decoder, n int) error {
	for range n {
		if err := dec.Skip(); err != nil {
			return err
		}
	}
	return nil
}

// Extent flags.
const (
	ExtentHole uint32 = 1 << 0 // no storage is allocated
	ExtentZero uint32 = 1 << 1 // reads as zeros
)

// MaxExtents is the most extents one control response carries. A msgpack
// extent takes at most 15 bytes (array header, uint64, uint32), so 200 of
// them and the response's other fields fit a 4096-byte IU.
const MaxExtents = 200

// Capability bits in ControlResponse.Caps for an open volume.
// CapVolatile is a property rather than a capability: the volume lives
// in the target's memory, so a restart of the target loses all of it,
// what was flushed too (an older target never sets it).
const (
	CapFlush uint32 = 1 << iota
	CapFUA
	CapDiscard
	CapWriteZeroes
	CapVolatile
)

// EncodeControl appends op and v's msgpack encoding to dst.
func EncodeControl(dst []byte, op Opcode, v any) ([]byte, error) {
	dst = append(dst, byte(op))
	body, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("wire: encode %s: %w", op, err)
	}
	return append(dst, body...), nil
}

// DecodeControl parses a control IU whose opcode must be op into v. The
// msgpack body is validated first, so hostile lengths cannot make the
// decoder allocate beyond the IU's size; unknown fields are ignored.
func DecodeControl(b []byte, op Opcode, v any) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty IU", ErrMalformed)
	}
	if Opcode(b[0]) != op {
		return fmt.Errorf("%w: got %s, want %s", ErrMalformed, Opcode(b[0]), op)
	}
	if err := msgpackcheck.Check(b[1:]); err != nil {
		return fmt.Errorf("%w: %s body: %v", ErrMalformed, op, err)
	}
	if err := msgpack.Unmarshal(b[1:], v); err != nil {
		return fmt.Errorf("%w: %s body: %v", ErrMalformed, op, err)
	}
	return nil
}

// LoginProofFor computes the HMAC-SHA256 proof of a login: the secret never
// crosses the wire, and binding both nonces and both names stops replay
// and reflection. side is "initiator" or "target".
func LoginProofFor(secret []byte, side, initiator, target string, initNonce, targetNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, part := range [][]byte{[]byte("gosrp-login-v1"), []byte(side), []byte(initiator), []byte(target), initNonce, targetNonce} {
		var l [4]byte
		binary.LittleEndian.PutUint32(l[:], uint32(len(part)))
		m.Write(l[:])
		m.Write(part)
	}
	return m.Sum(nil)
}
