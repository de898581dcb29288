package srp

import "fmt"

// Sizes of the target-initiated requests and their responses.
const (
	CredReqLen   = 16 // SRP_CRED_REQ
	TargetRspLen = 16 // SRP_CRED_RSP and SRP_AER_RSP
	AERReqLen    = 36 // SRP_AER_REQ without its sense data
)

// CredReq is SRP_CRED_REQ: the target grants credits outside a response
// (SRP r16a 6.10), and the initiator answers SRP_CRED_RSP. The kernel's
// ib_srp adds ReqLimDelta to its request limit (srp_process_cred_req).
//
//	0  opcode u8 = 0x81
//	1  sol_not u8
//	2  reserved [2]
//	4  req_lim_delta u32
//	8  tag u64
type CredReq struct {
	SolNot      uint8
	ReqLimDelta uint32
	Tag         uint64
}

// Encode writes r into b, which must hold CredReqLen bytes.
func (r *CredReq) Encode(b []byte) (int, error) {
	if err := room(b, CredReqLen, OpCredReq); err != nil {
		return 0, err
	}
	b = b[:CredReqLen]
	clear(b)
	b[0] = byte(OpCredReq)
	b[1] = r.SolNot
	be.PutUint32(b[4:], r.ReqLimDelta)
	be.PutUint64(b[8:], r.Tag)
	return CredReqLen, nil
}

// Decode parses the layout Encode writes.
func (r *CredReq) Decode(b []byte) error {
	if err := need(b, CredReqLen, OpCredReq); err != nil {
		return err
	}
	r.SolNot = b[1]
	r.ReqLimDelta = be.Uint32(b[4:])
	r.Tag = be.Uint64(b[8:])
	return nil
}

// TargetRsp is the initiator's answer to a target request: SRP_CRED_RSP
// or SRP_AER_RSP (SRP r16a 6.11, 6.13), which share one layout and differ
// in the opcode. Answers consume no credit.
//
//	0  opcode u8 = 0x41 or 0x42
//	1  reserved [7]
//	8  tag u64 (the request's)
type TargetRsp struct {
	Op  Opcode // OpCredRsp or OpAERRsp
	Tag uint64
}

// Encode writes r into b, which must hold TargetRspLen bytes.
func (r *TargetRsp) Encode(b []byte) (int, error) {
	if r.Op != OpCredRsp && r.Op != OpAERRsp {
		return 0, fmt.Errorf("%w: %s is not a response to a target request", ErrMalformed, r.Op)
	}
	if err := room(b, TargetRspLen, r.Op); err != nil {
		return 0, err
	}
	b = b[:TargetRspLen]
	clear(b)
	b[0] = byte(r.Op)
	be.PutUint64(b[8:], r.Tag)
	return TargetRspLen, nil
}

// Decode parses the layout Encode writes, either opcode.
func (r *TargetRsp) Decode(b []byte) error {
	op, err := PeekOpcode(b)
	if err != nil {
		return err
	}
	if op != OpCredRsp && op != OpAERRsp {
		return fmt.Errorf("%w: opcode %s where SRP_CRED_RSP or SRP_AER_RSP was expected", ErrMalformed, op)
	}
	if err := need(b, TargetRspLen, op); err != nil {
		return err
	}
	r.Op = op
	r.Tag = be.Uint64(b[8:])
	return nil
}

// AERReq is SRP_AER_REQ: the target reports an asynchronous event for a
// logical unit with sense data (SRP r16a 6.12); the initiator answers
// SRP_AER_RSP. ib_srp logs and ignores the event but honours
// ReqLimDelta.
//
//	0  opcode u8 = 0x82
//	1  sol_not u8
//	2  reserved [2]
//	4  req_lim_delta u32
//	8  tag u64
//	16 reserved [4]
//	20 lun [8]
//	28 sense_data_len u32
//	32 reserved [4]
//	36 sense data
type AERReq struct {
	SolNot      uint8
	ReqLimDelta uint32
	Tag         uint64
	LUN         LUN
	// Sense is the event's sense data. After Decode it aliases the
	// decoded buffer.
	Sense []byte
}

// EncodedLen is the size Encode writes.
func (r *AERReq) EncodedLen() int { return AERReqLen + len(r.Sense) }

// Encode writes r into b, which must hold EncodedLen bytes.
func (r *AERReq) Encode(b []byte) (int, error) {
	n := r.EncodedLen()
	if err := room(b, n, OpAERReq); err != nil {
		return 0, err
	}
	b = b[:n]
	clear(b[:AERReqLen])
	b[0] = byte(OpAERReq)
	b[1] = r.SolNot
	be.PutUint32(b[4:], r.ReqLimDelta)
	be.PutUint64(b[8:], r.Tag)
	copy(b[20:28], r.LUN[:])
	be.PutUint32(b[28:], uint32(len(r.Sense)))
	copy(b[AERReqLen:], r.Sense)
	return n, nil
}

// Decode parses the layout Encode writes; the sense data must fit in b.
func (r *AERReq) Decode(b []byte) error {
	if err := need(b, AERReqLen, OpAERReq); err != nil {
		return err
	}
	r.SolNot = b[1]
	r.ReqLimDelta = be.Uint32(b[4:])
	r.Tag = be.Uint64(b[8:])
	copy(r.LUN[:], b[20:28])
	n := be.Uint32(b[28:])
	if uint64(n) > uint64(len(b)-AERReqLen) {
		return fmt.Errorf("%w: SRP_AER_REQ claims %d bytes of sense data, %d follow", ErrMalformed, n, len(b)-AERReqLen)
	}
	r.Sense = b[AERReqLen : AERReqLen+int(n)]
	return nil
}
