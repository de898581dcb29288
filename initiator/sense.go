package initiator

import (
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
)

// Sense says why the target failed a command (IOError.Sense), in the
// spirit of a SCSI sense key and additional sense code.
type Sense uint16

// Senses. Their values are the wire's, so a sense a newer target sends
// that this package does not name still prints as Sense(n).
const (
	SenseNone             = Sense(wire.SenseNone)
	SenseInvalidField     = Sense(wire.SenseInvalidField)
	SenseOutOfRange       = Sense(wire.SenseOutOfRange)
	SenseMisaligned       = Sense(wire.SenseMisaligned)
	SenseWriteProtected   = Sense(wire.SenseWriteProtected)
	SenseUnsupported      = Sense(wire.SenseUnsupported)
	SenseMediumError      = Sense(wire.SenseMediumError)
	SenseNoSuchVolume     = Sense(wire.SenseNoSuchVolume)
	SenseDataTransfer     = Sense(wire.SenseDataTransfer) // an RDMA transfer through the descriptors failed
	SenseInternal         = Sense(wire.SenseInternal)
	SenseAccessDenied     = Sense(wire.SenseAccessDenied)     // the ACL forbids it (ErrAccessDenied)
	SenseSpaceAllocFailed = Sense(wire.SenseSpaceAllocFailed) // no space on the target (ErrNoSpace)
	// SenseReservationConflict: a reservation forbids the command
	// (ErrReservationConflict).
	SenseReservationConflict = Sense(wire.SenseReservationConflict)
	// SenseNotActive: the target is a standby gateway for the volume
	// (ErrStandby); Multipath fails over.
	SenseNotActive = Sense(wire.SenseNotActive)
)

// String names the sense ("medium error"), or Sense(n) for one this
// package does not know.
func (s Sense) String() string { return wire.Sense(s).String() }

// RejectReason says why the target refused a login (LoginError.Reason),
// after SRP_LOGIN_REJ's reasons.
type RejectReason uint8

// Reject reasons, with the wire's values.
const (
	RejectUnspecified           = RejectReason(wire.RejectUnspecified)
	RejectVersion               = RejectReason(wire.RejectVersion)
	RejectAccessDenied          = RejectReason(wire.RejectAccessDenied)
	RejectAuthFailed            = RejectReason(wire.RejectAuthFailed)
	RejectIUTooLarge            = RejectReason(wire.RejectIUTooLarge)
	RejectInsufficientResources = RejectReason(wire.RejectInsufficientResources)
	RejectUnknownVolume         = RejectReason(wire.RejectUnknownVolume)
	RejectProtocol              = RejectReason(wire.RejectProtocol)
	RejectShuttingDown          = RejectReason(wire.RejectShuttingDown)
)

// String names the reason ("access denied"), or RejectReason(n).
func (r RejectReason) String() string { return wire.RejectReason(r).String() }

// SCSIStatus is the SCSI status an SRP target answered a command with
// (SCSIError.Status; SAM-5 5.3).
type SCSIStatus uint8

// SCSI statuses, with their values on the wire.
const (
	SCSIStatusGood           = SCSIStatus(scsi.StatusGood)
	SCSIStatusCheckCondition = SCSIStatus(scsi.StatusCheckCondition) // the sense data says why
	SCSIStatusBusy           = SCSIStatus(scsi.StatusBusy)
	// SCSIStatusReservationConflict: another host's persistent
	// reservation forbids the command (ErrReservationConflict).
	SCSIStatusReservationConflict = SCSIStatus(scsi.StatusResvConflict)
	SCSIStatusTaskSetFull         = SCSIStatus(scsi.StatusTaskSetFull)
	// SCSIStatusTaskAborted: another host's task management aborted the
	// command (SAM-5 5.6, TAS); the session re-issues it.
	SCSIStatusTaskAborted = SCSIStatus(scsi.StatusTaskAborted)
)

// String names the status ("BUSY"), or its value in hex.
func (s SCSIStatus) String() string { return scsi.Status(s).String() }
