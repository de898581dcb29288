package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Magic numbers (network byte order on the wire).
const (
	magicInit      = 0x4e42444d41474943 // "NBDMAGIC"
	magicOpt       = 0x49484156454f5054 // "IHAVEOPT"
	magicOptReply  = 0x0003e889045565a9
	magicRequest   = 0x25609513
	magicSimpleRep = 0x67446698
	magicChunk     = 0x668e33ef // a structured reply chunk
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle  = 1 << 0
	flagNoZeroes       = 1 << 1
	clientFixed        = 1 << 0
	clientNoZeroes     = 1 << 1
	clientFlagsAllowed = clientFixed | clientNoZeroes
)

// Transmission flags.
const (
	FlagHasFlags        uint16 = 1 << 0
	FlagReadOnly        uint16 = 1 << 1
	FlagSendFlush       uint16 = 1 << 2
	FlagSendFUA         uint16 = 1 << 3
	FlagRotational      uint16 = 1 << 4
	FlagSendTrim        uint16 = 1 << 5
	FlagSendWriteZeroes uint16 = 1 << 6
	FlagSendDF          uint16 = 1 << 7
	FlagCanMultiConn    uint16 = 1 << 8
	FlagSendCache       uint16 = 1 << 10
)

// Options.
const (
	OptExportName      uint32 = 1
	OptAbort           uint32 = 2
	OptList            uint32 = 3
	OptStartTLS        uint32 = 5
	OptInfo            uint32 = 6
	OptGo              uint32 = 7
	OptStructuredReply uint32 = 8
	OptListMetaContext uint32 = 9
	OptSetMetaContext  uint32 = 10
	OptExtendedHeaders uint32 = 11
)

// Option replies.
const (
	RepAck             uint32 = 1
	RepServer          uint32 = 2
	RepInfo            uint32 = 3
	RepMetaContext     uint32 = 4
	repErr             uint32 = 1 << 31
	RepErrUnsup               = repErr | 1
	RepErrPolicy              = repErr | 2
	RepErrInvalid             = repErr | 3
	RepErrPlatform            = repErr | 4
	RepErrTLSReqd             = repErr | 5
	RepErrUnknown             = repErr | 6
	RepErrShutdown            = repErr | 7
	RepErrBlockSizeReq        = repErr | 8
	RepErrTooBig              = repErr | 9
)

// Information types for NBD_OPT_INFO and NBD_OPT_GO.
const (
	InfoExport      uint16 = 0
	InfoName        uint16 = 1
	InfoDescription uint16 = 2
	InfoBlockSize   uint16 = 3
)

// Commands.
const (
	CmdRead        uint16 = 0
	CmdWrite       uint16 = 1
	CmdDisc        uint16 = 2
	CmdFlush       uint16 = 3
	CmdTrim        uint16 = 4
	CmdCache       uint16 = 5
	CmdWriteZeroes uint16 = 6
	CmdBlockStatus uint16 = 7
)

// Command flags.
const (
	CmdFlagFUA      uint16 = 1 << 0
	CmdFlagNoHole   uint16 = 1 << 1
	CmdFlagDF       uint16 = 1 << 2
	CmdFlagReqOne   uint16 = 1 << 3
	CmdFlagFastZero uint16 = 1 << 4
)

// Structured reply chunk types (proto.md, "Structured reply types"). An
// error chunk type has bit 15 set.
const (
	ReplyTypeNone        uint16 = 0
	ReplyTypeOffsetData  uint16 = 1
	ReplyTypeOffsetHole  uint16 = 2
	ReplyTypeBlockStatus uint16 = 5
	ReplyTypeError       uint16 = 1<<15 + 1
	ReplyTypeErrorOffset uint16 = 1<<15 + 2
)

// ReplyFlagDone marks the last chunk of a structured reply.
const ReplyFlagDone uint16 = 1 << 0

// The base:allocation metadata context and its status flags.
const (
	// MetaAllocation is the one metadata context this server offers.
	MetaAllocation = "base:allocation"
	// StateHole: the extent is not allocated in the backend.
	StateHole uint32 = 1 << 0
	// StateZero: the extent reads as zeros.
	StateZero uint32 = 1 << 1
	// allocationContextID is the id NBD_OPT_SET_META_CONTEXT gives
	// base:allocation.
	allocationContextID uint32 = 1
)

// Errno values carried in simple replies (Linux numbering, which the NBD
// protocol adopts).
const (
	EPERM     uint32 = 1
	EIO       uint32 = 5
	ENOMEM    uint32 = 12
	EINVAL    uint32 = 22
	ENOSPC    uint32 = 28
	EOVERFLOW uint32 = 75
	ENOTSUP   uint32 = 95
	ESHUTDOWN uint32 = 108
)

// Sizes of the fixed-layout messages.
const (
	optHeaderLen     = 16 // IHAVEOPT, option, length
	optReplyLen      = 20 // magic, option, type, length
	requestLen       = 28
	simpleReplyLen   = 16
	chunkHeaderLen   = 20 // magic, flags, type, cookie, length
	exportNamePad    = 124
	maxOptionLen     = 64 << 10 // longer options close the connection
	maxExportNameLen = 4096     // the protocol's limit on names
	maxStringLen     = 4096     // the protocol's limit on any string
)

var be = binary.BigEndian

// errProtocol marks input that breaks the protocol; the connection is
// closed with the error as the logged reason.
var errProtocol = errors.New("nbd: protocol violation")

// optHeader is the header of one option in the haggling phase.
type optHeader struct {
	Option uint32
	Length uint32
}

func decodeOptHeader(b []byte) (optHeader, error) {
	if len(b) < optHeaderLen {
		return optHeader{}, fmt.Errorf("%w: short option header (%d bytes)", errProtocol, len(b))
	}
	if m := be.Uint64(b); m != magicOpt {
		return optHeader{}, fmt.Errorf("%w: option magic %#x, want IHAVEOPT", errProtocol, m)
	}
	h := optHeader{Option: be.Uint32(b[8:]), Length: be.Uint32(b[12:])}
	if h.Length > maxOptionLen {
		return h, fmt.Errorf("%w: option %s with %d bytes of data (limit %d)", errProtocol, optName(h.Option), h.Length, maxOptionLen)
	}
	return h, nil
}

func appendOptHeader(b []byte, opt, length uint32) []byte {
	b = be.AppendUint64(b, magicOpt)
	b = be.AppendUint32(b, opt)
	return be.AppendUint32(b, length)
}

func appendOptReply(b []byte, opt, typ uint32, data []byte) []byte {
	b = be.AppendUint64(b, magicOptReply)
	b = be.AppendUint32(b, opt)
	b = be.AppendUint32(b, typ)
	b = be.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// infoRequest is the data of NBD_OPT_INFO and NBD_OPT_GO.
type infoRequest struct {
	Name  string
	Infos []uint16
}

// decodeInfoRequest parses: u32 name length, name, u16 count, count × u16.
func decodeInfoRequest(b []byte) (infoRequest, error) {
	var r infoRequest
	if len(b) < 4 {
		return r, fmt.Errorf("%d bytes, too short for a name length", len(b))
	}
	n := be.Uint32(b)
	if n > maxExportNameLen {
		return r, fmt.Errorf("export name of %d bytes (limit %d)", n, maxExportNameLen)
	}
	if uint64(len(b)-4) < uint64(n)+2 {
		return r, fmt.Errorf("export name of %d bytes and info count do not fit in %d bytes", n, len(b))
	}
	r.Name = string(b[4 : 4+n])
	rest := b[4+n:]
	cnt := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*cnt {
		return r, fmt.Errorf("%d information requests announced, %d bytes follow", cnt, len(rest))
	}
	r.Infos = make([]uint16, cnt)
	for i := range cnt {
		r.Infos[i] = be.Uint16(rest[2*i:])
	}
	return r, nil
}

func appendInfoRequest(b []byte, name string, infos ...uint16) []byte {
	b = be.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = be.AppendUint16(b, i)
	}
	return b
}

// request is one transmission-phase request header.
type request struct {
	Flags  uint16
	Type   uint16
	Cookie uint64
	Offset uint64
	Length uint32
}

func decodeRequest(b []byte) (request, error) {
	if len(b) < requestLen {
		return request{}, fmt.Errorf("%w: short request (%d bytes)", errProtocol, len(b))
	}
	if m := be.Uint32(b); m != magicRequest {
		return request{}, fmt.Errorf("%w: request magic %#x, want %#x", errProtocol, m, magicRequest)
	}
	return request{
		Flags: be.Uint16(b[4:]), Type: be.Uint16(b[6:]), Cookie: be.Uint64(b[8:]),
		Offset: be.Uint64(b[16:]), Length: be.Uint32(b[24:]),
	}, nil
}

func appendRequest(b []byte, r request) []byte {
	b = be.AppendUint32(b, magicRequest)
	b = be.AppendUint16(b, r.Flags)
	b = be.AppendUint16(b, r.Type)
	b = be.AppendUint64(b, r.Cookie)
	b = be.AppendUint64(b, r.Offset)
	return be.AppendUint32(b, r.Length)
}

func putSimpleReply(b []byte, errno uint32, cookie uint64) {
	be.PutUint32(b, magicSimpleRep)
	be.PutUint32(b[4:], errno)
	be.PutUint64(b[8:], cookie)
}

// metaContextRequest is the data of NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
type metaContextRequest struct {
	Name    string
	Queries []string
}

// decodeMetaContextRequest parses: u32 name length, name, u32 query
// count, then each query as u32 length and string. Every length is
// checked against what is left before anything is allocated, so a hostile
// count costs nothing.
func decodeMetaContextRequest(b []byte) (metaContextRequest, error) {
	var r metaContextRequest
	name, rest, err := cutString(b, maxExportNameLen, "export name")
	if err != nil {
		return r, err
	}
	r.Name = name
	if len(rest) < 4 {
		return r, fmt.Errorf("%d bytes after the export name, too short for a query count", len(rest))
	}
	n := be.Uint32(rest)
	rest = rest[4:]
	if uint64(n)*4 > uint64(len(rest)) {
		return r, fmt.Errorf("%d queries announced, %d bytes follow", n, len(rest))
	}
	r.Queries = make([]string, 0, n)
	for range n {
		var q string
		if q, rest, err = cutString(rest, maxStringLen, "query"); err != nil {
			return r, err
		}
		r.Queries = append(r.Queries, q)
	}
	if len(rest) != 0 {
		return r, fmt.Errorf("%d bytes after the last query", len(rest))
	}
	return r, nil
}

// cutString splits a u32-length-prefixed string of at most limit bytes
// off b.
func cutString(b []byte, limit uint32, what string) (string, []byte, error) {
	if len(b) < 4 {
		return "", nil, fmt.Errorf("%d bytes, too short for the length of the %s", len(b), what)
	}
	n := be.Uint32(b)
	if n > limit {
		return "", nil, fmt.Errorf("%s of %d bytes (limit %d)", what, n, limit)
	}
	if uint64(n) > uint64(len(b)-4) {
		return "", nil, fmt.Errorf("%s of %d bytes, %d bytes follow", what, n, len(b)-4)
	}
	return string(b[4 : 4+n]), b[4+n:], nil
}

// appendMetaContextRequest appends the data of NBD_OPT_LIST_META_CONTEXT
// and NBD_OPT_SET_META_CONTEXT, what a client sends: the export name and
// the queries, each with its length. The server only decodes it; the
// tests' client and the fuzz targets build it here.
func appendMetaContextRequest(b []byte, name string, queries ...string) []byte {
	b = be.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = be.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// putChunkHeader writes a structured reply chunk header into b.
func putChunkHeader(b []byte, flags, typ uint16, cookie uint64, length uint32) {
	be.PutUint32(b, magicChunk)
	be.PutUint16(b[4:], flags)
	be.PutUint16(b[6:], typ)
	be.PutUint64(b[8:], cookie)
	be.PutUint32(b[16:], length)
}

// appendErrorPayload appends the payload of an NBD_REPLY_TYPE_ERROR chunk:
// errno, message length, message (cut to the protocol's string limit at a
// character boundary).
func appendErrorPayload(b []byte, errno uint32, msg string) []byte {
	if len(msg) > maxStringLen {
		msg = strings.ToValidUTF8(msg[:maxStringLen], "")
	}
	b = be.AppendUint32(b, errno)
	b = be.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

func optName(o uint32) string {
	switch o {
	case OptExportName:
		return "NBD_OPT_EXPORT_NAME"
	case OptAbort:
		return "NBD_OPT_ABORT"
	case OptList:
		return "NBD_OPT_LIST"
	case OptStartTLS:
		return "NBD_OPT_STARTTLS"
	case OptInfo:
		return "NBD_OPT_INFO"
	case OptGo:
		return "NBD_OPT_GO"
	case OptStructuredReply:
		return "NBD_OPT_STRUCTURED_REPLY"
	case OptListMetaContext:
		return "NBD_OPT_LIST_META_CONTEXT"
	case OptSetMetaContext:
		return "NBD_OPT_SET_META_CONTEXT"
	case OptExtendedHeaders:
		return "NBD_OPT_EXTENDED_HEADERS"
	}
	return fmt.Sprintf("option %d", o)
}

func cmdName(c uint16) string {
	switch c {
	case CmdRead:
		return "READ"
	case CmdWrite:
		return "WRITE"
	case CmdDisc:
		return "DISC"
	case CmdFlush:
		return "FLUSH"
	case CmdTrim:
		return "TRIM"
	case CmdCache:
		return "CACHE"
	case CmdWriteZeroes:
		return "WRITE_ZEROES"
	case CmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return fmt.Sprintf("command %d", c)
}
