package srp

// LogoutLen is the size of SRP_I_LOGOUT and SRP_T_LOGOUT.
const LogoutLen = 16

// ILogout is SRP_I_LOGOUT: the initiator ends the channel (SRP r16a
// 6.5). The kernel's ib_srp never sends it (it disconnects instead), but
// a target must take it.
//
//	0  opcode u8 = 0x03
//	1  reserved [7]
//	8  tag u64
type ILogout struct {
	Tag uint64
}

// Encode writes l into b, which must hold LogoutLen bytes.
func (l *ILogout) Encode(b []byte) (int, error) {
	if err := room(b, LogoutLen, OpILogout); err != nil {
		return 0, err
	}
	b = b[:LogoutLen]
	clear(b)
	b[0] = byte(OpILogout)
	be.PutUint64(b[8:], l.Tag)
	return LogoutLen, nil
}

// Decode parses the layout Encode writes.
func (l *ILogout) Decode(b []byte) error {
	if err := need(b, LogoutLen, OpILogout); err != nil {
		return err
	}
	l.Tag = be.Uint64(b[8:])
	return nil
}

// TLogout is SRP_T_LOGOUT: the target ends the channel and says why
// (SRP r16a 6.6), before it disconnects.
//
//	0  opcode u8 = 0x80
//	1  sol_not u8
//	2  reserved [2]
//	4  reason u32 (SRP r16a's T_LOGOUT reason codes; 0: none given)
//	8  tag u64
type TLogout struct {
	SolNot uint8
	Reason uint32
	Tag    uint64
}

// Encode writes l into b, which must hold LogoutLen bytes.
func (l *TLogout) Encode(b []byte) (int, error) {
	if err := room(b, LogoutLen, OpTLogout); err != nil {
		return 0, err
	}
	b = b[:LogoutLen]
	clear(b)
	b[0] = byte(OpTLogout)
	b[1] = l.SolNot
	be.PutUint32(b[4:], l.Reason)
	be.PutUint64(b[8:], l.Tag)
	return LogoutLen, nil
}

// Decode parses the layout Encode writes.
func (l *TLogout) Decode(b []byte) error {
	if err := need(b, LogoutLen, OpTLogout); err != nil {
		return err
	}
	l.SolNot = b[1]
	l.Reason = be.Uint32(b[4:])
	l.Tag = be.Uint64(b[8:])
	return nil
}
