package scsi

// Asymmetric logical unit access (ALUA, SPC-4 5.15) for a unit that
// several gateways export, one of them serving it at a time.
//
// Each gateway is its own target port group with one target port, whose
// relative target port identifier is the group's number: the unit is
// active/optimized at the gateway that serves it, standby at the others,
// and unavailable at one that was fenced (it cannot serve again before
// it restarts, so a host should not count on it as a standby path). A gateway knows only its own state, so REPORT TARGET PORT
// GROUPS reports its own group; Linux's scsi_dh_alua (alua_rtpg) takes
// the state of the group it found in VPD 0x83 from that answer and
// learns each other group's from the path through that gateway. SET
// TARGET PORT GROUPS asking for the gateway's group to become active is
// a takeover (Device.SetPortGroups), which is how scsi_dh_alua
// activates a standby path (alua_stpg) when dm-multipath switches to it.

const (
	opMaintenanceOut = 0xA4 // MAINTENANCE OUT; SET TARGET PORT GROUPS is service action 0x0A
	saPortGroups     = 0x0A // REPORT TARGET PORT GROUPS (MAINTENANCE IN) and SET (OUT)

	// tpgsBoth is standard INQUIRY byte 5's TPGS field, 11b: the unit
	// changes state on its own (a takeover through another gateway) and
	// on SET TARGET PORT GROUPS.
	tpgsBoth = 0x30

	// Asymmetric access states (SPC-4 6.37, REPORT TARGET PORT GROUPS).
	aluaActiveOptimized    = 0x0
	aluaActiveNonOptimized = 0x1
	aluaStandby            = 0x2
	aluaUnavailable        = 0x3

	// aluaSupported is a descriptor's supported states byte: U_SUP
	// (0x08), S_SUP (0x04) and AO_SUP (0x01).
	aluaSupported = 0x0D

	// rtpgExtended asks for the extended header: PARAMETER DATA FORMAT
	// 001b in CDB byte 1 bits 7:5; rtpgFormatExtended says the answer
	// has it: FORMAT TYPE 001b in its byte 4 bits 6:4 (Linux's
	// RTPG_FMT_EXT_HDR).
	rtpgExtended       = 0x20
	rtpgFormatExtended = 0x10
	// implicitTransitionSecs is the extended header's IMPLICIT
	// TRANSITION TIME: how long an initiator should allow for a takeover
	// through another gateway; Linux's alua_rtpg takes it as the time to
	// keep retrying a transitioning unit. A takeover fences the old
	// gateway, which on Ceph is the monitor committing a blocklist
	// (docs/gateways.md: about a second).
	implicitTransitionSecs = 10
)

// aluaState is the unit's asymmetric access state at this target port.
func (d *Device) aluaState() byte {
	switch {
	case d.Unavailable:
		return aluaUnavailable
	case d.Standby:
		return aluaStandby
	}
	return aluaActiveOptimized
}

// standbyServes reports whether a command runs while the target port is
// standby for the unit: SPC-4 5.15.2.4.4 lists INQUIRY, MODE SENSE,
// REPORT LUNS, REQUEST SENSE and the two TARGET PORT GROUPS commands;
// READ CAPACITY is served too, as LIO's core_alua_state_standby does,
// so that a host sizes the disk on every path and dm-multipath does not
// set a standby path aside for a size mismatch. Anything else is NOT
// READY, TARGET PORT IN STANDBY STATE. An unavailable port serves the
// same (5.15.2.4.5 allows less, but these only describe the unit) and
// answers the rest TARGET PORT IN UNAVAILABLE STATE.
func standbyServes(cdb []byte) bool {
	switch cdb[0] {
	case opInquiry, opModeSense6, opModeSense10, opReportLUNs, opRequestSense, opReadCapacity10, opPersistIn, opPersistOut:
		return true
	case opServiceIn16:
		return cdb[1]&0x1f == saReadCapacity16
	case opMaintenanceIn, opMaintenanceOut:
		return cdb[1]&0x1f == saPortGroups
	}
	return false
}

// reportPortGroups: REPORT TARGET PORT GROUPS (SPC-4 6.27), MAINTENANCE
// IN with service action 0x0A. CDB (12 bytes): byte 1 bits 7:5 the
// PARAMETER DATA FORMAT (000b a length header, 001b the extended one;
// others are INVALID FIELD IN CDB), bytes 6-9 the allocation length.
//
// The answer: a 4-byte RETURN DATA LENGTH (with the extended header,
// then byte 4 its format, byte 5 the implicit transition time, two
// reserved), then one 8-byte target port group descriptor and its
// target port's 4-byte descriptor:
//
//	0  PREF 0, asymmetric access state (bits 3:0)
//	1  supported states: U_SUP, S_SUP, AO_SUP
//	2  target port group
//	5  status code 0: no status available
//	7  target port count 1
//	8  the target port: two reserved bytes, its relative identifier
func (d *Device) reportPortGroups(cdb []byte) Action {
	format := cdb[1] & 0xe0
	if format != 0 && format != rtpgExtended {
		return check(SenseInvalidField)
	}
	b := make([]byte, 4, 8+12)
	if format == rtpgExtended {
		b = append(b, rtpgFormatExtended, implicitTransitionSecs, 0, 0)
	}
	b = append(b, d.aluaState(), aluaSupported)
	b = be.AppendUint16(b, d.PortGroup)
	b = append(b, 0, 0, 0, 1, 0, 0)
	b = be.AppendUint16(b, d.PortGroup)
	be.PutUint32(b, uint32(len(b)-4))
	return data(b, int(be.Uint32(cdb[6:])))
}

// setPortGroups: SET TARGET PORT GROUPS (SPC-4 6.37), MAINTENANCE OUT
// with service action 0x0A. CDB (12 bytes): bytes 6-9 the parameter
// list length. A zero length asks nothing (GOOD); otherwise the target
// fetches the list and passes it to SetPortGroups.
func (d *Device) setPortGroups(cdb []byte) Action {
	n := be.Uint32(cdb[6:])
	if n == 0 {
		return good()
	}
	if n < 4 || (n-4)%4 != 0 {
		return check(SenseParamListLength)
	}
	return Action{Status: StatusGood, Op: OpSetPortGroups, DataOut: n}
}

// SetPortGroups decodes a SET TARGET PORT GROUPS parameter list (the
// DataOut of an OpSetPortGroups Action): four reserved bytes, then a
// 4-byte descriptor per group, its state in byte 0 bits 3:0 and the
// group in bytes 2-3. It reports whether the list asks for this target
// port's group to become active (a takeover for the target to run,
// answered GOOD when done and SenseSetPortGroupsFailed when not); with
// activate false, a is the whole answer.
//
// This gateway can make only its own group active: asking it to go
// standby (giving the volume up) is refused, and so is a group it does
// not know, unless the list also makes its own group active and asks
// that group to be standby or unavailable, which the takeover brings
// about (a list naming every group, as sg_stpg can send it). Refusals
// are INVALID FIELD IN PARAMETER LIST; the list is checked whole before
// anything changes.
func (d *Device) SetPortGroups(param []byte) (activate bool, a Action) {
	if len(param) < 4 || (len(param)-4)%4 != 0 {
		return false, check(SenseParamListLength)
	}
	others := false
	for p := param[4:]; len(p) >= 4; p = p[4:] {
		state, group := p[0]&0x0f, be.Uint16(p[2:])
		switch {
		case group == d.PortGroup && (state == aluaActiveOptimized || state == aluaActiveNonOptimized):
			activate = true
		case group != d.PortGroup && (state == aluaStandby || state == aluaUnavailable):
			others = true
		default:
			return false, check(SenseInvalidParam)
		}
	}
	if others && !activate {
		return false, check(SenseInvalidParam)
	}
	return activate, good()
}
