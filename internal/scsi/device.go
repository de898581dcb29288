package scsi

import (
	"encoding/binary"

	"github.com/gosrp/gosrp/internal/enum"
)

// be is SCSI's byte order: CDBs and parameter data are big-endian.
var be = binary.BigEndian

// Operation codes the model knows (SPC-4, SBC-3).
const (
	opTestUnitReady  = 0x00
	opRequestSense   = 0x03
	opInquiry        = 0x12
	opModeSense6     = 0x1A
	opReadCapacity10 = 0x25
	opRead10         = 0x28
	opWrite10        = 0x2A
	opSyncCache10    = 0x35
	opWriteSame10    = 0x41
	opUnmap          = 0x42
	opModeSense10    = 0x5A
	opRead16         = 0x88
	opWrite16        = 0x8A
	opSyncCache16    = 0x91
	opWriteSame16    = 0x93
	opServiceIn16    = 0x9E // SERVICE ACTION IN(16); READ CAPACITY(16) is service action 0x10
	opReportLUNs     = 0xA0

	saReadCapacity16 = 0x10
)

// Defaults for the Device limits left zero.
const (
	// DefaultMaxTransferBytes bounds one READ or WRITE (VPD 0xB0
	// MAXIMUM TRANSFER LENGTH, in blocks of the device's size).
	DefaultMaxTransferBytes = 8 << 20
	// DefaultMaxUnmapDescriptors bounds one UNMAP's parameter list.
	DefaultMaxUnmapDescriptors = 256
	// DefaultMaxUnmapBlocks bounds the blocks one UNMAP deallocates.
	DefaultMaxUnmapBlocks = 1 << 22
	// DefaultMaxWriteSameBlocks bounds one WRITE SAME.
	DefaultMaxWriteSameBlocks = 1 << 22
)

// Device is a logical unit as the model sees it: a gosrp volume's
// geometry and capabilities. The model only reads it; the target fills
// it in from the volume and changes it (raising a Condition on every
// Nexus) when the volume changes.
type Device struct {
	// BlockSize is the logical block size in bytes (a power of two,
	// at least 512); Blocks the capacity in logical blocks.
	BlockSize uint32
	Blocks    uint64
	// ReadOnly makes the unit write-protected (a read-only volume or a
	// snapshot): MODE SENSE's WP bit, writes fail DATA PROTECT.
	ReadOnly bool
	// WriteCache says the volume acknowledges writes before they are
	// durable, so SYNCHRONIZE CACHE and FUA matter: the caching mode
	// page's WCE bit, which is what makes Linux send them.
	WriteCache bool
	// Discard says the volume deallocates: UNMAP and WRITE SAME with
	// UNMAP are offered (VPD 0xB2 LBPU/LBPWS, READ CAPACITY(16) LBPME).
	// DiscardZeroes says deallocated blocks read as zeros (LBPRZ).
	Discard       bool
	DiscardZeroes bool
	// ID is the unit's stable identity: VPD 0x83 reports it as an NAA
	// locally assigned designator, so multipath and udev find the same
	// disk across reconnects. The target derives it from the volume.
	ID uint64
	// Incarnation tells this volume from any other ever given its name
	// (deleted and created again under it, a LUN renumbered to another
	// volume): VPD 0x83 reports it as a vendor specific designator
	// (SPC-4 7.8.6.3), which an initiator compares after each re-login
	// before it sends the unit any of its writes again. ID, a function
	// of the names, cannot tell them apart. Zero reports none.
	Incarnation uint64
	// Serial is the unit serial number (VPD 0x80), printable ASCII; empty
	// means ID in hex.
	Serial string
	// Vendor (8), Product (16) and Revision (4) are the standard INQUIRY
	// strings, space padded or cut; empty means "GOSRP", "srpd volume"
	// and "0001".
	Vendor, Product, Revision string
	// Limits (VPD 0xB0); zero means the Default above.
	MaxTransferBlocks   uint32
	MaxUnmapBlocks      uint32
	MaxUnmapDescriptors uint32
	MaxWriteSameBlocks  uint32
	// PortGroup turns on asymmetric logical unit access (SPC-4 5.15,
	// alua.go) for a unit that several gateways export, one of them
	// serving it at a time: it is this gateway's target port group
	// (and its relative target port identifier), non-zero and
	// different at each gateway of the unit. The model then reports
	// ALUA in INQUIRY and VPD 0x83, answers REPORT and SET TARGET PORT
	// GROUPS, and while Standby refuses what a standby port refuses.
	PortGroup uint16
	// Standby says this gateway does not serve the unit now: the ALUA
	// standby state (only with PortGroup; without it a standby
	// gateway's I/O fails in its store, with the same sense).
	Standby bool
	// Unavailable says this gateway cannot serve the unit until it
	// restarts (it was fenced): the ALUA unavailable state, which wins
	// over Standby (only with PortGroup).
	Unavailable bool
}

// maxTransfer is the most blocks one READ or WRITE moves, at most what
// a 32-bit byte count (Action.DataOut, SRP's descriptor lengths) holds.
func (d *Device) maxTransfer() uint32 {
	if d.BlockSize == 0 {
		return 0
	}
	limit := uint32(0xFFFFFFFF) / d.BlockSize
	if d.MaxTransferBlocks == 0 {
		limit = min(limit, DefaultMaxTransferBytes/d.BlockSize)
	} else {
		limit = min(limit, d.MaxTransferBlocks)
	}
	return limit
}

func (d *Device) maxUnmapBlocks() uint32 {
	if d.MaxUnmapBlocks != 0 {
		return d.MaxUnmapBlocks
	}
	return DefaultMaxUnmapBlocks
}

func (d *Device) maxUnmapDescriptors() uint32 {
	if d.MaxUnmapDescriptors != 0 {
		return d.MaxUnmapDescriptors
	}
	return DefaultMaxUnmapDescriptors
}

func (d *Device) maxWriteSame() uint32 {
	if d.MaxWriteSameBlocks != 0 {
		return d.MaxWriteSameBlocks
	}
	return DefaultMaxWriteSameBlocks
}

// Op is the block operation a command asks the target to run.
type Op uint8

// Block operations.
const (
	// OpNone: nothing to run; the Action's status (and data) is the
	// whole answer.
	OpNone Op = iota
	// OpRead: read Blocks blocks at LBA and send them as data-in.
	OpRead
	// OpWrite: fetch DataOut bytes and write them at LBA, durably
	// before answering if FUA.
	OpWrite
	// OpFlush: make every completed write durable.
	OpFlush
	// OpUnmap: fetch DataOut bytes of UNMAP parameter list and pass
	// them to Device.Unmap, which says what to deallocate.
	OpUnmap
	// OpWriteSame: write one block's contents to Blocks blocks at LBA.
	// The block is fetched as DataOut unless NoData (NDOB: zeros). With
	// Unmap the target may deallocate instead, where the result reads
	// the same (the block is zeros and the device DiscardZeroes).
	OpWriteSame
	// OpSetPortGroups: fetch DataOut bytes of SET TARGET PORT GROUPS
	// parameter list and pass them to Device.SetPortGroups, which says
	// whether to take the unit over.
	OpSetPortGroups
	// OpReserveIn: read the volume's reservation state and answer with
	// ReserveInData (PERSISTENT RESERVE IN, READ KEYS or READ
	// RESERVATION; Action.PR).
	OpReserveIn
	// OpReserveOut: fetch DataOut bytes of PERSISTENT RESERVE OUT
	// parameter list, decode them with ReserveOut and make the change
	// (Action.PR).
	OpReserveOut
)

var opNames = [...]string{
	OpNone: "none", OpRead: "read", OpWrite: "write", OpFlush: "flush", OpUnmap: "unmap", OpWriteSame: "write-same",
	OpSetPortGroups: "set-port-groups", OpReserveIn: "reserve-in", OpReserveOut: "reserve-out",
}

func (o Op) String() string { return enum.Name(opNames[:], o, "Op") }

// Action is the model's answer to a command: a status now (with sense
// data or data-in), or a block operation for the target to run, after
// which it answers GOOD or the sense FromWire gives for its failure.
type Action struct {
	Status Status
	// Sense says why, when Status is CHECK CONDITION; the target sends
	// it as fixed-format sense data (Sense.AppendFixed).
	Sense Sense
	// Data is the data-in to return, already cut to the CDB's
	// allocation length.
	Data []byte
	// Op is the block operation to run, when Status is GOOD.
	Op     Op
	LBA    uint64
	Blocks uint32
	// FUA: the write must be durable before the answer.
	FUA bool
	// Unmap and NoData qualify OpWriteSame (see there).
	Unmap  bool
	NoData bool
	// DataOut is how many bytes the command transfers from the
	// initiator: the blocks of a write, the one block of WRITE SAME, the
	// parameter list of UNMAP. The target compares it with the SRP_CMD's
	// data-out descriptor for the residual flags.
	DataOut uint32
	// PR is the decoded CDB of OpReserveIn and OpReserveOut.
	PR PR
}

// good, check and data build Actions.
func good() Action         { return Action{Status: StatusGood} }
func check(s Sense) Action { return Action{Status: StatusCheckCondition, Sense: s} }
func data(b []byte, alloc int) Action {
	if len(b) > alloc {
		b = b[:alloc]
	}
	return Action{Status: StatusGood, Data: b}
}

// cdbLen is the CDB length of an operation code's group (SPC-4 4.2.5.1).
func cdbLen(op byte) int {
	switch op >> 5 {
	case 0:
		return 6
	case 1, 2:
		return 10
	case 4:
		return 16
	case 5:
		return 12
	}
	return 0
}

// Execute runs one CDB for this logical unit as seen from nexus n, which
// holds n's pending unit attentions; luns are the target port's LUNs, for
// REPORT LUNS. It never blocks and does no I/O: a command that moves
// blocks comes back as an Action with an Op for the target to run.
//
// Unit attentions follow SAM-5 5.14 and SPC-4 5.14 with UA_INTLCK_CTRL
// zero: a pending one fails any command but INQUIRY, REPORT LUNS and
// REQUEST SENSE with CHECK CONDITION and is cleared; REQUEST SENSE
// returns it as its data and clears it; INQUIRY and REPORT LUNS leave it.
func (d *Device) Execute(n *Nexus, cdb []byte, luns []uint16) Action {
	if len(cdb) == 0 {
		return check(SenseInvalidField)
	}
	op := cdb[0]
	switch op {
	case opInquiry, opReportLUNs:
	case opRequestSense:
		if len(cdb) < 6 {
			return check(SenseInvalidField)
		}
		return requestSense(n, cdb)
	default:
		if s, ok := n.takeUA(); ok {
			return check(s)
		}
	}
	if l := cdbLen(op); l == 0 || len(cdb) < l {
		if l == 0 {
			return check(SenseInvalidOpcode)
		}
		return check(SenseInvalidField)
	}
	if d.PortGroup != 0 && (d.Standby || d.Unavailable) && !standbyServes(cdb) {
		if d.Unavailable {
			return check(SenseUnavailable)
		}
		return check(SenseStandby)
	}
	switch op {
	case opTestUnitReady:
		return good()
	case opInquiry:
		return d.inquiry(cdb)
	case opReportLUNs:
		return reportLUNs(cdb, luns)
	case opReadCapacity10:
		return d.readCapacity10(cdb)
	case opServiceIn16:
		if cdb[1]&0x1f == saReadCapacity16 {
			return d.readCapacity16(cdb)
		}
		return check(SenseInvalidField)
	case opModeSense6, opModeSense10:
		return d.modeSense(cdb)
	case opRead10, opRead16, opWrite10, opWrite16:
		return d.readWrite(n, cdb)
	case opSyncCache10, opSyncCache16:
		return d.syncCache(n, cdb)
	case opWriteSame10, opWriteSame16:
		return d.writeSame(cdb)
	case opUnmap:
		return d.unmap(cdb)
	case opMaintenanceIn:
		switch {
		case cdb[1]&0x1f == saReportOpcodes:
			return d.reportOpcodes(cdb)
		case cdb[1]&0x1f == saPortGroups && d.PortGroup != 0:
			return d.reportPortGroups(cdb)
		}
		return check(SenseInvalidField)
	case opPersistIn:
		return persistIn(cdb)
	case opPersistOut:
		return persistOut(cdb)
	case opMaintenanceOut:
		if d.PortGroup == 0 {
			break
		}
		if cdb[1]&0x1f == saPortGroups {
			return d.setPortGroups(cdb)
		}
		return check(SenseInvalidField)
	}
	return check(SenseInvalidOpcode)
}

// NoUnit answers a CDB addressed to a LUN with no logical unit behind it
// (SPC-4 4.6.4): INQUIRY says peripheral qualifier 011b (no unit can be
// here), REQUEST SENSE reports LOGICAL UNIT NOT SUPPORTED, REPORT LUNS
// lists luns as from any LUN, and anything else fails with that sense.
func NoUnit(cdb []byte, luns []uint16) Action {
	return unitAbsent(cdb, luns, 0x7F, SenseLUNotSupported) // qualifier 011b, device type 1Fh
}

// BecomingReady answers a CDB addressed to a LUN whose logical unit
// the target is still bringing up (its volume opening): INQUIRY says
// peripheral qualifier 001b (a direct-access unit can be here but is
// not connected now, SPC-4 6.6.2) and fails for a VPD page, which the
// target cannot describe yet; REQUEST SENSE reports the condition;
// REPORT LUNS lists luns; anything else fails NOT READY, LOGICAL UNIT
// IS IN PROCESS OF BECOMING READY (SenseBecomingReady), which hosts
// retry, where NoUnit's LOGICAL UNIT NOT SUPPORTED is final.
func BecomingReady(cdb []byte, luns []uint16) Action {
	return unitAbsent(cdb, luns, 0x20, SenseBecomingReady) // qualifier 001b, direct access
}

// unitAbsent answers for a LUN with no unit to run cdb: standard
// INQUIRY data of peripheral byte pdt, REQUEST SENSE's sense and
// REPORT LUNS's list; the rest fails with sense (a page code without
// EVPD with INVALID FIELD IN CDB, as from a unit).
func unitAbsent(cdb []byte, luns []uint16, pdt byte, sense Sense) Action {
	if len(cdb) == 0 || cdbLen(cdb[0]) == 0 || len(cdb) < cdbLen(cdb[0]) {
		return check(sense)
	}
	switch cdb[0] {
	case opInquiry:
		switch {
		case cdb[1]&1 != 0:
			return check(sense)
		case cdb[2] != 0:
			return check(SenseInvalidField)
		}
		b := make([]byte, 36)
		b[0] = pdt
		b[2], b[3], b[4] = 0x06, 0x12, 31
		return data(b, int(be.Uint16(cdb[3:])))
	case opRequestSense:
		return data(senseData(sense, cdb[1]&1 != 0), int(cdb[4]))
	case opReportLUNs:
		return reportLUNs(cdb, luns)
	}
	return check(sense)
}

// senseData is s in the format the command asked for.
func senseData(s Sense, desc bool) []byte {
	if desc {
		return s.AppendDescriptor(nil)
	}
	return s.AppendFixed(nil)
}

// requestSense: REQUEST SENSE (SPC-4 6.29) reports the pending unit
// attention, clearing it, or NO SENSE; DESC (byte 1 bit 0) picks the
// descriptor format. Sense data of failed commands is not kept for it:
// SRP delivers it with the SRP_RSP (autosense).
func requestSense(n *Nexus, cdb []byte) Action {
	s, _ := n.takeUA()
	return data(senseData(s, cdb[1]&1 != 0), int(cdb[4]))
}
