package scsi

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/wire"
)

// Status is a SAM-5 status byte (SAM-5 5.3.1), the SRP_RSP's STATUS.
type Status uint8

// Statuses the model returns.
const (
	StatusGood           Status = 0x00
	StatusCheckCondition Status = 0x02 // sense data says why
	StatusBusy           Status = 0x08
	StatusResvConflict   Status = 0x18 // a reservation forbids the command (SPC-4 5.13)
	StatusTaskSetFull    Status = 0x28
	StatusTaskAborted    Status = 0x40 // another I_T nexus aborted it (TAS, SAM-5 5.6)
)

var statusNames = [...]string{
	StatusGood: "GOOD", StatusCheckCondition: "CHECK CONDITION", StatusBusy: "BUSY", StatusResvConflict: "RESERVATION CONFLICT", StatusTaskSetFull: "TASK SET FULL",
	StatusTaskAborted: "TASK ABORTED",
}

func (s Status) String() string { return enum.Hex(statusNames[:], s, "Status") }

// SenseKey is the SENSE KEY of sense data (SPC-4 4.5.6).
type SenseKey uint8

// Sense keys.
const (
	KeyNoSense        SenseKey = 0x0
	KeyRecoveredError SenseKey = 0x1
	KeyNotReady       SenseKey = 0x2
	KeyMediumError    SenseKey = 0x3
	KeyHardwareError  SenseKey = 0x4
	KeyIllegalRequest SenseKey = 0x5
	KeyUnitAttention  SenseKey = 0x6
	KeyDataProtect    SenseKey = 0x7
	KeyAbortedCommand SenseKey = 0xB
	KeyMiscompare     SenseKey = 0xE
)

var keyNames = [16]string{"NO SENSE", "RECOVERED ERROR", "NOT READY", "MEDIUM ERROR", "HARDWARE ERROR",
	"ILLEGAL REQUEST", "UNIT ATTENTION", "DATA PROTECT", "BLANK CHECK", "VENDOR SPECIFIC", "COPY ABORTED",
	"ABORTED COMMAND", "RESERVED", "VOLUME OVERFLOW", "MISCOMPARE", "COMPLETED"}

func (k SenseKey) String() string { return enum.Hex(keyNames[:], k, "SenseKey") }

// Sense is what sense data says: a key and an additional sense code and
// qualifier (SPC-4 4.5).
type Sense struct {
	Key  SenseKey
	ASC  uint8
	ASCQ uint8
}

// The senses the model reports (SPC-4 annex D, SBC-3 for the block
// device's).
var (
	SenseNone              = Sense{}
	SenseInvalidOpcode     = Sense{KeyIllegalRequest, 0x20, 0x00} // INVALID COMMAND OPERATION CODE
	SenseAccessDenied      = Sense{KeyIllegalRequest, 0x20, 0x02} // ACCESS DENIED - NO ACCESS RIGHTS
	SenseLBAOutOfRange     = Sense{KeyIllegalRequest, 0x21, 0x00} // LOGICAL BLOCK ADDRESS OUT OF RANGE
	SenseParamListLength   = Sense{KeyIllegalRequest, 0x1A, 0x00} // PARAMETER LIST LENGTH ERROR
	SenseInvalidField      = Sense{KeyIllegalRequest, 0x24, 0x00} // INVALID FIELD IN CDB
	SenseLUNotSupported    = Sense{KeyIllegalRequest, 0x25, 0x00} // LOGICAL UNIT NOT SUPPORTED
	SenseInvalidParam      = Sense{KeyIllegalRequest, 0x26, 0x00} // INVALID FIELD IN PARAMETER LIST
	SenseSavingUnsupported = Sense{KeyIllegalRequest, 0x39, 0x00} // SAVING PARAMETERS NOT SUPPORTED
	// SenseNoRegistrationRoom is a registration the volume has no room
	// for (SPC-4 5.13.7).
	SenseNoRegistrationRoom = Sense{KeyIllegalRequest, 0x55, 0x04} // INSUFFICIENT REGISTRATION RESOURCES
	SenseWriteProtected     = Sense{KeyDataProtect, 0x27, 0x00}    // WRITE PROTECTED
	SenseSpaceAllocFailed   = Sense{KeyDataProtect, 0x27, 0x07}    // SPACE ALLOCATION FAILED WRITE PROTECT
	SenseReadError          = Sense{KeyMediumError, 0x11, 0x00}    // UNRECOVERED READ ERROR
	SenseWriteError         = Sense{KeyMediumError, 0x0C, 0x00}    // WRITE ERROR
	// SenseCacheLost is a lost write cache (WriteCacheLost): WRITE
	// ERROR under HARDWARE ERROR, not MEDIUM ERROR, because Linux's
	// scsi_check_sense (drivers/scsi/scsi_error.c) retries a MEDIUM
	// ERROR other than 11h, 13h and 14h, and the retry, not owing the
	// loss any more, succeeds: the host never sees it. A HARDWARE
	// ERROR is final there (SCSIML_STAT_TGT_FAILURE, so dm-multipath
	// does not retry it on another path either).
	SenseCacheLost       = Sense{KeyHardwareError, 0x0C, 0x00} // WRITE ERROR
	SenseInternalFailure = Sense{KeyHardwareError, 0x44, 0x00} // INTERNAL TARGET FAILURE
	// SenseSetPortGroupsFailed is a SET TARGET PORT GROUPS whose
	// takeover failed (SPC-4 6.37).
	SenseSetPortGroupsFailed = Sense{KeyHardwareError, 0x67, 0x0A} // SET TARGET PORT GROUPS COMMAND FAILED
	// SenseStandby is a logical unit this target port does not serve
	// now (a standby gateway of the volume): SPC-4 5.15.2.4.4's answer
	// for a target port in the standby ALUA state. Linux fails the
	// command as a path error (scsi_io_completion_action), so
	// dm-multipath retries it on another path; a HARDWARE ERROR would
	// be final on every path.
	SenseStandby = Sense{KeyNotReady, 0x04, 0x0B} // LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE
	// SenseUnavailable is a fenced gateway's unit: the ALUA unavailable
	// state (SPC-4 5.15.2.4.5), a path error to Linux as standby is.
	SenseUnavailable = Sense{KeyNotReady, 0x04, 0x0C} // LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE
	// SenseBecomingReady is a unit whose volume the target is still
	// opening; Linux retries it (scsi_check_sense, NOT READY 04h/01h).
	SenseBecomingReady  = Sense{KeyNotReady, 0x04, 0x01}       // LOGICAL UNIT IS IN PROCESS OF BECOMING READY
	SenseDataPhaseError = Sense{KeyAbortedCommand, 0x4B, 0x00} // DATA PHASE ERROR
	// SenseOverlapped is a command under the tag of one still in
	// flight (SAM-5 5.9.4, overlapped commands).
	SenseOverlapped      = Sense{KeyAbortedCommand, 0x4E, 0x00} // OVERLAPPED COMMANDS ATTEMPTED
	SensePowerOn         = Sense{KeyUnitAttention, 0x29, 0x01}  // POWER ON OCCURRED
	SenseResetOccurred   = Sense{KeyUnitAttention, 0x29, 0x03}  // BUS DEVICE RESET FUNCTION OCCURRED
	SenseCapacityChanged = Sense{KeyUnitAttention, 0x2A, 0x09}  // CAPACITY DATA HAS CHANGED
	SenseLUNsChanged     = Sense{KeyUnitAttention, 0x3F, 0x0E}  // REPORTED LUNS DATA HAS CHANGED
	SenseAccessChanged   = Sense{KeyUnitAttention, 0x2A, 0x06}  // ASYMMETRIC ACCESS STATE CHANGED
	// Persistent reservation changes another host made (Condition's
	// RegistrationsPreempted, ReservationsPreempted, ReservationsReleased).
	SenseRegistrationsPreempted = Sense{KeyUnitAttention, 0x2A, 0x05} // REGISTRATIONS PREEMPTED
	SenseReservationsPreempted  = Sense{KeyUnitAttention, 0x2A, 0x03} // RESERVATIONS PREEMPTED
	SenseReservationsReleased   = Sense{KeyUnitAttention, 0x2A, 0x04} // RESERVATIONS RELEASED
)

var ascNames = map[[2]uint8]string{
	{0x00, 0x00}: "NO ADDITIONAL SENSE INFORMATION",
	{0x20, 0x00}: "INVALID COMMAND OPERATION CODE",
	{0x20, 0x02}: "ACCESS DENIED - NO ACCESS RIGHTS",
	{0x21, 0x00}: "LOGICAL BLOCK ADDRESS OUT OF RANGE",
	{0x1A, 0x00}: "PARAMETER LIST LENGTH ERROR",
	{0x24, 0x00}: "INVALID FIELD IN CDB",
	{0x25, 0x00}: "LOGICAL UNIT NOT SUPPORTED",
	{0x26, 0x00}: "INVALID FIELD IN PARAMETER LIST",
	{0x39, 0x00}: "SAVING PARAMETERS NOT SUPPORTED",
	{0x55, 0x04}: "INSUFFICIENT REGISTRATION RESOURCES",
	{0x27, 0x00}: "WRITE PROTECTED",
	{0x27, 0x07}: "SPACE ALLOCATION FAILED WRITE PROTECT",
	{0x11, 0x00}: "UNRECOVERED READ ERROR",
	{0x0C, 0x00}: "WRITE ERROR",
	{0x44, 0x00}: "INTERNAL TARGET FAILURE",
	{0x67, 0x0A}: "SET TARGET PORT GROUPS COMMAND FAILED",
	{0x04, 0x0B}: "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE",
	{0x04, 0x0C}: "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE",
	{0x4B, 0x00}: "DATA PHASE ERROR",
	{0x4E, 0x00}: "OVERLAPPED COMMANDS ATTEMPTED",
	{0x29, 0x01}: "POWER ON OCCURRED",
	{0x29, 0x03}: "BUS DEVICE RESET FUNCTION OCCURRED",
	{0x2A, 0x09}: "CAPACITY DATA HAS CHANGED",
	{0x3F, 0x0E}: "REPORTED LUNS DATA HAS CHANGED",
	{0x2A, 0x06}: "ASYMMETRIC ACCESS STATE CHANGED",
	{0x2A, 0x05}: "REGISTRATIONS PREEMPTED",
	{0x2A, 0x03}: "RESERVATIONS PREEMPTED",
	{0x2A, 0x04}: "RESERVATIONS RELEASED",
}

// String reads as "ILLEGAL REQUEST: INVALID FIELD IN CDB (24/00)".
func (s Sense) String() string {
	name, ok := ascNames[[2]uint8{s.ASC, s.ASCQ}]
	if !ok {
		name = "ASC/ASCQ"
	}
	return fmt.Sprintf("%s: %s (%02x/%02x)", s.Key, name, s.ASC, s.ASCQ)
}

// Sizes of the two sense data formats the model writes.
const (
	FixedSenseLen      = 18 // response code 0x70, SPC-4 4.5.3
	DescriptorSenseLen = 8  // response code 0x72 with no descriptors, SPC-4 4.5.2
)

// AppendFixed appends s as fixed-format sense data (SPC-4 4.5.3, current
// error, response code 0x70): what the model reports unless a command
// asks for descriptor format.
//
//	0  0x70
//	2  sense key (bits 3:0)
//	7  additional sense length: 10
//	12 ASC
//	13 ASCQ
func (s Sense) AppendFixed(b []byte) []byte {
	var f [FixedSenseLen]byte
	f[0] = 0x70
	f[2] = byte(s.Key) & 0xf
	f[7] = FixedSenseLen - 8
	f[12], f[13] = s.ASC, s.ASCQ
	return append(b, f[:]...)
}

// AppendDescriptor appends s as descriptor-format sense data with no
// descriptors (SPC-4 4.5.2, response code 0x72).
//
//	0  0x72
//	1  sense key (bits 3:0)
//	2  ASC
//	3  ASCQ
//	7  additional sense length: 0
func (s Sense) AppendDescriptor(b []byte) []byte {
	return append(b, 0x72, byte(s.Key)&0xf, s.ASC, s.ASCQ, 0, 0, 0, 0)
}

// ParseSense reads the key, ASC and ASCQ of fixed or descriptor sense
// data (response codes 0x70-0x73), as an initiator gets it in an SRP_RSP.
func ParseSense(b []byte) (Sense, error) {
	if len(b) == 0 {
		return Sense{}, fmt.Errorf("scsi: empty sense data")
	}
	switch b[0] & 0x7f {
	case 0x70, 0x71:
		if len(b) < 14 {
			return Sense{}, fmt.Errorf("scsi: fixed-format sense data of %d bytes, want at least 14", len(b))
		}
		return Sense{SenseKey(b[2] & 0xf), b[12], b[13]}, nil
	case 0x72, 0x73:
		if len(b) < 4 {
			return Sense{}, fmt.Errorf("scsi: descriptor-format sense data of %d bytes, want at least 4", len(b))
		}
		return Sense{SenseKey(b[1] & 0xf), b[2], b[3]}, nil
	}
	return Sense{}, fmt.Errorf("scsi: sense data response code %#x", b[0]&0x7f)
}

// FromWire maps the sense of a gosrp command that failed (what the target
// core answers, wire.Sense) to SCSI sense for the block operation op, so
// SRP initiators see every gosrp error as a standard one: a medium error
// reads UNRECOVERED READ ERROR for a read and WRITE ERROR otherwise, no
// space is SPACE ALLOCATION FAILED WRITE PROTECT (SBC-3 4.7.3.6, what a
// thin-provisioned disk reports), an ACL refusal ACCESS DENIED, and an
// RDMA transfer that failed DATA PHASE ERROR (the initiator may retry),
// and a standby gateway's refusal NOT READY, TARGET PORT IN STANDBY STATE.
// A sense gosrp adds later maps to INTERNAL TARGET FAILURE. Any failure
// of a SET TARGET PORT GROUPS's takeover is SET TARGET PORT GROUPS
// COMMAND FAILED (SPC-4 6.37).
func FromWire(s wire.Sense, op Op) Sense {
	if op == OpSetPortGroups && s != wire.SenseNone {
		return SenseSetPortGroupsFailed
	}
	switch s {
	case wire.SenseNone:
		return SenseNone
	case wire.SenseInvalidField, wire.SenseMisaligned:
		return SenseInvalidField
	case wire.SenseOutOfRange:
		return SenseLBAOutOfRange
	case wire.SenseWriteProtected:
		return SenseWriteProtected
	case wire.SenseUnsupported:
		return SenseInvalidOpcode
	case wire.SenseMediumError:
		if op == OpRead {
			return SenseReadError
		}
		return SenseWriteError
	case wire.SenseNoSuchVolume:
		return SenseLUNotSupported
	case wire.SenseDataTransfer:
		return SenseDataPhaseError
	case wire.SenseAccessDenied:
		return SenseAccessDenied
	case wire.SenseSpaceAllocFailed:
		return SenseSpaceAllocFailed
	case wire.SenseNotActive:
		return SenseStandby
	case wire.SenseBecomingReady:
		return SenseBecomingReady
	}
	return SenseInternalFailure
}
