package scsi

// Persistent reservations (SPC-4 5.13, 6.15, 6.16): PERSISTENT RESERVE
// IN and OUT decoded for the target and their answers encoded. The
// reservation state is the target's (one per volume, shared with its
// gosrp hosts and, through the volume's store, with the other gateways):
// the model turns a command into an OpReserveIn or OpReserveOut, the
// target runs it against that state, and ReserveInData encodes a report.

import (
	"bytes"
	"encoding/hex"
	"slices"

	"github.com/gosrp/gosrp/internal/wire"
)

const (
	opPersistIn  = 0x5E // PERSISTENT RESERVE IN
	opPersistOut = 0x5F // PERSISTENT RESERVE OUT

	// PERSISTENT RESERVE IN service actions (SPC-4 6.15.1).
	prReadKeys        = 0x00
	prReadReservation = 0x01
	prReportCaps      = 0x02
	prReadFullStatus  = 0x03

	// prOutParamLen is the basic PERSISTENT RESERVE OUT parameter list
	// (SPC-4 6.16.3): reservation key, service action reservation key,
	// four obsolete bytes, the flags (SPEC_I_PT, ALL_TG_PT, APTPL), a
	// reserved byte and two obsolete.
	prOutParamLen = 24
	// prMoveParamMax bounds REGISTER AND MOVE's parameter list (SPC-4
	// 6.16.4): the 24 bytes of keys, flags, relative target port and
	// TransportID length, then one TransportID, at most an iSCSI-style
	// name of 256 bytes with its 4-byte header.
	prMoveParamMax = 24 + 4 + 256
	// prSpecParamMax bounds a REGISTER's parameter list with SPEC_I_PT
	// (SPC-4 6.16.3): the basic list, the TransportIDs' length, then
	// one TransportID for each other host a volume can register, each
	// at most 260 bytes as above. A longer list could only name hosts
	// the volume has no room for.
	prSpecParamMax = prOutParamLen + 4 + (wire.MaxRegistrants-1)*(4+256)
	prRegister     = 0
	prRegisterMove = 7
	// specIPT is SPEC_I_PT, in byte 20 of the basic parameter list.
	specIPT = 0x08
)

// prOutActions maps PERSISTENT RESERVE OUT's service actions (SPC-4
// Table 174) to the target's.
var prOutActions = [...]wire.ReserveAction{
	0: wire.ActionRegister, 1: wire.ActionReserve, 2: wire.ActionRelease, 3: wire.ActionClear,
	4: wire.ActionPreempt, 5: wire.ActionPreemptAbort, 6: wire.ActionRegisterIgnore,
	prRegisterMove: wire.ActionRegisterMove,
}

// PR is a persistent reservation command's CDB, decoded by Execute for
// the step after it: PERSISTENT RESERVE OUT's service action and type
// (the parameter list is fetched first), PERSISTENT RESERVE IN's service
// action and allocation length.
type PR struct {
	Service uint8
	Type    wire.ReservationType
	Alloc   int
}

// persistIn: PERSISTENT RESERVE IN (SPC-4 6.15). CDB (10 bytes): byte 1
// bits 4:0 the service action, bytes 7-8 the allocation length. REPORT
// CAPABILITIES is answered here; READ KEYS, READ RESERVATION and READ
// FULL STATUS need the state, so the target runs OpReserveIn and
// encodes the answer with ReserveInData.
func persistIn(cdb []byte) Action {
	alloc := int(be.Uint16(cdb[7:]))
	switch sa := cdb[1] & 0x1f; sa {
	case prReadKeys, prReadReservation, prReadFullStatus:
		return Action{Status: StatusGood, Op: OpReserveIn, PR: PR{Service: sa, Alloc: alloc}}
	case prReportCaps:
		// LENGTH 8; SIP_C (a REGISTER may name other initiator ports),
		// ATP_C (a registration holds on every target port: the
		// gateways share it) and PTPL_C (it persists across
		// restarts); TMV, with PTPL_A (always persisting); the type
		// mask: EX_AC_RO, WR_EX_RO, EX_AC, WR_EX (the ALL_REG types are
		// not served).
		b := []byte{0, 8, 0x08 | 0x04 | 0x01, 0x80 | 0x01, 0x40 | 0x20 | 0x08 | 0x02, 0, 0, 0}
		return data(b, alloc)
	}
	return check(SenseInvalidField)
}

// persistOut: PERSISTENT RESERVE OUT (SPC-4 6.16). CDB (10 bytes): byte
// 1 bits 4:0 the service action, byte 2 the scope (bits 7:4, only
// LU_SCOPE) and type (bits 3:0), bytes 5-8 the parameter list length,
// which must be the basic list's 24 bytes, or for REGISTER (with
// SPEC_I_PT) a list of TransportIDs after it, or for REGISTER AND MOVE
// its own list with one TransportID. REGISTER AND MOVE keeps the type of
// the reservation it moves. The target fetches the list and hands it to
// ReserveOut.
func persistOut(cdb []byte) Action {
	sa := cdb[1] & 0x1f
	if int(sa) >= len(prOutActions) {
		return check(SenseInvalidField)
	}
	typ := wire.ReservationType(cdb[2] & 0x0f)
	switch prOutActions[sa] {
	case wire.ActionReserve, wire.ActionRelease, wire.ActionPreempt, wire.ActionPreemptAbort:
		// REGISTER and CLEAR ignore scope and type (SPC-4 6.16.2);
		// PREEMPT with no reservation to take ignores the type too,
		// but which it is the state decides.
		if cdb[2]>>4 != 0 || !typ.Valid() {
			return check(SenseInvalidField)
		}
	default:
		typ = wire.ResNone
	}
	n := be.Uint32(cdb[5:])
	switch {
	case sa == prRegisterMove && (n < prOutParamLen+24 || n > prMoveParamMax):
		return check(SenseParamListLength)
	case sa == prRegister && (n < prOutParamLen || n > prSpecParamMax):
		return check(SenseParamListLength)
	case sa != prRegisterMove && sa != prRegister && n != prOutParamLen:
		return check(SenseParamListLength)
	}
	return Action{Status: StatusGood, Op: OpReserveOut, DataOut: n, PR: PR{Service: sa, Type: typ}}
}

// ReserveOut decodes the parameter list of the PERSISTENT RESERVE OUT
// that Execute turned into pr (an OpReserveOut Action) into the change
// the target makes: the action, the host's reservation key (Key) and
// the service action reservation key (NewKey: the key to register; for
// a preempt, the key to remove), the type, and for REGISTER AND MOVE
// the host its TransportID names (Dest, as ParseTransportID names it)
// and UNREG; for a REGISTER with SPEC_I_PT the hosts its TransportIDs
// name (Ports). a is GOOD unless the list is refused: too short or
// longer than it says, SPEC_I_PT with another service action or with
// no key to register, or a TransportID this target does not read.
func ReserveOut(pr PR, param []byte) (req wire.ControlRequest, a Action) {
	switch {
	case len(param) < prOutParamLen || int(pr.Service) >= len(prOutActions):
		return req, check(SenseParamListLength)
	case pr.Service != prRegisterMove && pr.Service != prRegister && len(param) != prOutParamLen:
		return req, check(SenseParamListLength)
	case pr.Service != prRegister && pr.Service != prRegisterMove && param[20]&specIPT != 0:
		// SPC-4 6.16.3: SPEC_I_PT belongs to REGISTER alone.
		return req, check(SenseInvalidParam)
	}
	// ALL_TG_PT is what every registration is here; APTPL asks for
	// what always happens (the state is kept with the volume).
	req = wire.ControlRequest{Op: wire.ControlReserveOut, Action: prOutActions[pr.Service],
		Key: be.Uint64(param), NewKey: be.Uint64(param[8:]), Type: pr.Type}
	switch {
	case pr.Service == prRegister && param[20]&specIPT != 0:
		return specifiedPorts(req, param)
	case pr.Service == prRegister && len(param) != prOutParamLen:
		return wire.ControlRequest{}, check(SenseParamListLength)
	case pr.Service != prRegisterMove:
		return req, good()
	}
	// SPC-4 6.16.4: byte 17 UNREG (bit 1) and APTPL, bytes 18-19 the
	// relative target port (every port is the same here), bytes 20-23
	// the TransportID's length, then the TransportID.
	n := int(be.Uint32(param[20:]))
	if n < 24 || prOutParamLen+n > len(param) {
		return wire.ControlRequest{}, check(SenseParamListLength)
	}
	dest, ok := ParseTransportID(param[prOutParamLen : prOutParamLen+n])
	if !ok || req.NewKey == 0 {
		return wire.ControlRequest{}, check(SenseInvalidParam)
	}
	req.Dest, req.Unreg = dest, param[17]&0x02 != 0
	return req, good()
}

// specifiedPorts reads the TransportIDs of a REGISTER with SPEC_I_PT
// (SPC-4 6.16.3): bytes 24-27 their length, which must be what the
// list holds after it, then the TransportIDs one after another. The
// hosts they name go in req.Ports, each once. Unregistering is no
// registration of others: SPEC_I_PT then is an invalid field of the
// list (SPC-4 5.13.7, Table 40), as is a TransportID not of this
// target's hosts, or none.
func specifiedPorts(req wire.ControlRequest, param []byte) (wire.ControlRequest, Action) {
	if len(param) < prOutParamLen+4 || int(be.Uint32(param[prOutParamLen:])) != len(param)-prOutParamLen-4 {
		return wire.ControlRequest{}, check(SenseParamListLength)
	}
	if req.NewKey == 0 {
		return wire.ControlRequest{}, check(SenseInvalidParam)
	}
	for b := param[prOutParamLen+4:]; len(b) > 0; {
		n := transportIDLen(b)
		if n > len(b) {
			return wire.ControlRequest{}, check(SenseParamListLength)
		}
		host, ok := ParseTransportID(b[:n])
		if !ok {
			return wire.ControlRequest{}, check(SenseInvalidParam)
		}
		if !slices.Contains(req.Ports, host) {
			if len(req.Ports) == wire.MaxRegistrants-1 { // no volume has room for them and the issuer
				return wire.ControlRequest{}, check(SenseNoRegistrationRoom)
			}
			req.Ports = append(req.Ports, host)
		}
		b = b[n:]
	}
	if len(req.Ports) == 0 {
		return wire.ControlRequest{}, check(SenseInvalidParam)
	}
	return req, good()
}

// transportIDLen is the length of the TransportID b starts with: 24
// bytes for the fixed formats (SRP, and the other protocols' format
// 00b), 4 plus its ADDITIONAL LENGTH for a name (iSCSI's and
// NamedTransportID's layout, SPC-4 7.6.4.6), never less than 24. It
// reads b's first four bytes only, and says 24 when b has fewer.
func transportIDLen(b []byte) int {
	if len(b) < 4 {
		return 24
	}
	switch b[0] & 0x0f {
	case 0x05, 0x0f:
		return max(4+int(be.Uint16(b[2:])), 24)
	}
	return 24
}

// Registration is a registrant as PERSISTENT RESERVE IN reports it.
type Registration struct {
	Key uint64
	// Holder: it holds the reservation.
	Holder bool
	// TransportID names its initiator port (SRPTransportID,
	// NamedTransportID), for READ FULL STATUS.
	TransportID []byte
}

// ReserveInData encodes the answer to the PERSISTENT RESERVE IN that
// Execute turned into pr (an OpReserveIn Action), from the volume's
// state: its generation, the registrations, and the reservation (typ
// ResNone: none; holderKey its holder's key). READ KEYS (SPC-4
// 6.15.2): PRGENERATION, ADDITIONAL LENGTH, the keys. READ RESERVATION
// (6.15.3): PRGENERATION, ADDITIONAL LENGTH 0 or 16, then the holder's
// key, the scope (LU_SCOPE) and type. READ FULL STATUS (6.15.5):
// PRGENERATION, ADDITIONAL LENGTH, then a descriptor a registration:
// its key, ALL_TG_PT (every registration holds on every target port
// here) and R_HOLDER with the scope and type of the reservation it
// holds, ADDITIONAL DESCRIPTOR LENGTH and its TransportID.
func ReserveInData(pr PR, gen uint32, regs []Registration, holderKey uint64, typ wire.ReservationType) Action {
	b := be.AppendUint32(nil, gen)
	switch pr.Service {
	case prReadKeys:
		b = be.AppendUint32(b, uint32(8*len(regs)))
		for _, r := range regs {
			b = be.AppendUint64(b, r.Key)
		}
	case prReadFullStatus:
		b = be.AppendUint32(b, 0) // ADDITIONAL LENGTH, set below
		for _, r := range regs {
			b = be.AppendUint64(b, r.Key)
			flags, scopeType := byte(0x02), byte(0) // ALL_TG_PT
			if r.Holder && typ != wire.ResNone {
				flags, scopeType = flags|0x01, byte(typ)
			}
			// Bytes 8-23: reserved, the flags, scope and type,
			// reserved, RELATIVE TARGET PORT IDENTIFIER (0: ALL_TG_PT
			// says it does not matter), ADDITIONAL DESCRIPTOR LENGTH.
			b = append(b, 0, 0, 0, 0, flags, scopeType, 0, 0, 0, 0, 0, 0)
			b = be.AppendUint32(b, uint32(len(r.TransportID)))
			b = append(b, r.TransportID...)
		}
		be.PutUint32(b[4:], uint32(len(b)-8))
	case prReadReservation:
		if typ == wire.ResNone {
			b = be.AppendUint32(b, 0)
			break
		}
		b = be.AppendUint32(b, 16)
		b = be.AppendUint64(b, holderKey)
		b = append(b, 0, 0, 0, 0, 0, byte(typ), 0, 0)
	default:
		return check(SenseInvalidField)
	}
	return data(b, pr.Alloc)
}

// SRPTransportID is an SRP initiator port's TransportID (SPC-4 7.6.4.5):
// format 00b with protocol identifier 4 (SRP), seven reserved bytes, the
// 16-byte initiator port identifier.
func SRPTransportID(port [16]byte) []byte {
	b := make([]byte, 24)
	b[0] = 0x04
	copy(b[8:], port[:])
	return b
}

// NamedTransportID names an initiator that is not a SCSI port (a gosrp
// host, known by the name it logs in with) where a TransportID is due:
// protocol identifier Fh (no specific protocol, SPC-4 Table 444), the
// name laid out as an iSCSI TransportID's name is (7.6.4.6): ADDITIONAL
// LENGTH in bytes 2-3, the name null-terminated from byte 4 and padded
// to a multiple of four bytes, 24 bytes at the least. sg_persist says
// "No specified protocol" and shows no name; the bytes carry it for
// tools that read them.
func NamedTransportID(name string) []byte {
	n := (len(name) + 1 + 3) &^ 3
	n = max(n, 20)
	b := make([]byte, 4+n)
	b[0] = 0x0f
	be.PutUint16(b[2:], uint16(n))
	copy(b[4:], name)
	return b
}

// TransportIDOf is the TransportID of the host the target knows as
// initiator: an SRP host, named by its initiator port in hex, by that
// port (SRPTransportID), any other by its name (NamedTransportID).
// ParseTransportID is its inverse.
func TransportIDOf(initiator string) []byte {
	var port [16]byte
	if len(initiator) == 2*len(port) {
		if _, err := hex.Decode(port[:], []byte(initiator)); err == nil {
			return SRPTransportID(port)
		}
	}
	return NamedTransportID(initiator)
}

// ParseTransportID names the initiator a TransportID names, as the
// target knows its hosts: an SRP initiator port (SRPTransportID) by its
// identifier in hex, a NamedTransportID by its name. Any other is not a
// host of this target (false).
func ParseTransportID(b []byte) (string, bool) {
	if len(b) < 24 || b[0]&0xc0 != 0 {
		return "", false
	}
	switch b[0] & 0x0f {
	case 0x04:
		return hex.EncodeToString(b[8:24]), true
	case 0x0f:
		n := int(be.Uint16(b[2:]))
		if n > len(b)-4 {
			return "", false
		}
		name := b[4 : 4+n]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		return string(name), len(name) > 0
	}
	return "", false
}
