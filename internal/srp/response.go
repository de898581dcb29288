package srp

import "fmt"

// RspLen is SRP_RSP without response and sense data.
const RspLen = 36

// SRP_RSP flags (SRP r16a 6.9, SRP_RSP_FLAG_* in the kernel).
const (
	// RspValid: the response data (task management RSP_CODE) is valid.
	RspValid uint8 = 1 << 0
	// SnsValid: sense data follows the response data.
	SnsValid uint8 = 1 << 1
	// DOOver: the command wanted more data-out than the descriptors
	// held; DataOutResid counts the excess.
	DOOver uint8 = 1 << 2
	// DOUnder: less data-out moved than the descriptors held.
	DOUnder uint8 = 1 << 3
	// DIOver and DIUnder: the same for data-in. ib_srp reports
	// DIUnder's residual to the SCSI midlayer (scsi_set_resid).
	DIOver  uint8 = 1 << 4
	DIUnder uint8 = 1 << 5
)

// Rsp is SRP_RSP (SRP r16a 6.9): the outcome of an SRP_CMD (SCSI status,
// sense, residuals) or of an SRP_TSK_MGMT (response data), and credits
// for the initiator. SRP has no remote invalidation: it is a plain SEND.
//
//	0  opcode u8 = 0xC1
//	1  sol_not u8
//	2  reserved [2]
//	4  req_lim_delta u32
//	8  tag u64
//	16 reserved [2]
//	18 flags u8
//	19 status u8 (SAM status)
//	20 data_out_res_cnt u32
//	24 data_in_res_cnt u32
//	28 sense_data_len u32
//	32 resp_data_len u32
//	36 response data, then sense data
type Rsp struct {
	SolNot       uint8
	ReqLimDelta  uint32
	Tag          uint64
	Flags        uint8
	Status       uint8
	DataOutResid uint32
	DataInResid  uint32
	// Resp is the response data; set exactly when Flags has RspValid.
	// Sense is the sense data; set exactly when Flags has SnsValid. After
	// Decode both alias the decoded buffer.
	Resp  []byte
	Sense []byte
}

// EncodedLen is the size Encode writes.
func (r *Rsp) EncodedLen() int { return RspLen + len(r.Resp) + len(r.Sense) }

// Encode writes r into b, which must hold EncodedLen bytes. It refuses a
// response whose RspValid or SnsValid flag disagrees with the data it
// carries, as Decode would.
func (r *Rsp) Encode(b []byte) (int, error) {
	if err := r.check(); err != nil {
		return 0, err
	}
	n := r.EncodedLen()
	if err := room(b, n, OpRsp); err != nil {
		return 0, err
	}
	b = b[:n]
	clear(b[:RspLen])
	b[0] = byte(OpRsp)
	b[1] = r.SolNot
	be.PutUint32(b[4:], r.ReqLimDelta)
	be.PutUint64(b[8:], r.Tag)
	b[18] = r.Flags
	b[19] = r.Status
	be.PutUint32(b[20:], r.DataOutResid)
	be.PutUint32(b[24:], r.DataInResid)
	be.PutUint32(b[28:], uint32(len(r.Sense)))
	be.PutUint32(b[32:], uint32(len(r.Resp)))
	copy(b[RspLen:], r.Resp)
	copy(b[RspLen+len(r.Resp):], r.Sense)
	return n, nil
}

func (r *Rsp) check() error {
	switch {
	case (r.Flags&RspValid != 0) != (len(r.Resp) > 0):
		return fmt.Errorf("%w: SRP_RSP with RSPVALID %t and %d bytes of response data", ErrMalformed, r.Flags&RspValid != 0, len(r.Resp))
	case (r.Flags&SnsValid != 0) != (len(r.Sense) > 0):
		return fmt.Errorf("%w: SRP_RSP with SNSVALID %t and %d bytes of sense data", ErrMalformed, r.Flags&SnsValid != 0, len(r.Sense))
	case r.Flags&(DOOver|DOUnder) == DOOver|DOUnder:
		return fmt.Errorf("%w: SRP_RSP with both DOOVER and DOUNDER", ErrMalformed)
	case r.Flags&(DIOver|DIUnder) == DIOver|DIUnder:
		return fmt.Errorf("%w: SRP_RSP with both DIOVER and DIUNDER", ErrMalformed)
	}
	return nil
}

// Decode parses an SRP_RSP of len(b) bytes. The response and sense data
// lengths count only when their valid flag is set (SRP r16a 6.9: the
// fields are otherwise reserved; ib_srp reads sense at resp_data_len past
// the header, so a sender must zero it without RSPVALID, which Encode
// does); what they claim must fit in b.
func (r *Rsp) Decode(b []byte) error {
	if err := need(b, RspLen, OpRsp); err != nil {
		return err
	}
	r.SolNot = b[1]
	r.ReqLimDelta = be.Uint32(b[4:])
	r.Tag = be.Uint64(b[8:])
	r.Flags = b[18]
	r.Status = b[19]
	r.DataOutResid = be.Uint32(b[20:])
	r.DataInResid = be.Uint32(b[24:])
	var sense, resp uint64
	if r.Flags&SnsValid != 0 {
		sense = uint64(be.Uint32(b[28:]))
	}
	if r.Flags&RspValid != 0 {
		resp = uint64(be.Uint32(b[32:]))
	}
	if RspLen+resp+sense > uint64(len(b)) {
		return fmt.Errorf("%w: SRP_RSP of %d bytes claims %d bytes of response data and %d of sense", ErrMalformed, len(b), resp, sense)
	}
	r.Resp, r.Sense = nil, nil
	if resp > 0 {
		r.Resp = b[RspLen : RspLen+resp]
	}
	if sense > 0 {
		r.Sense = b[RspLen+resp : RspLen+resp+sense]
	}
	return r.check()
}
