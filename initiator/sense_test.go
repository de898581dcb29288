package initiator

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/frmr"
)

// TestStringsOutOfRange: every String method of a public or logged
// enumeration names a value it does not know as Type(n), never as another
// value's name and never by panicking.
func TestStringsOutOfRange(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Sense(200).String(), "Sense(200)"},
		{SenseMediumError.String(), "medium error"},
		{RejectReason(99).String(), "RejectReason(99)"},
		{RejectAccessDenied.String(), "access denied"},
		{Op(77).String(), "Op(77)"},
		{slotState(9).String(), "slotState(9)"},
		{frmr.State(7).String(), "State(7)"},
		{frmr.Mechanism(5).String(), "Mechanism(5)"},
		{SCSIStatusReservationConflict.String(), "RESERVATION CONFLICT"},
		{SCSIStatus(0x77).String(), "Status(0x77)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestSCSIError: what an SRP target's answer reads as, and which of the
// package's sentinels it is.
func TestSCSIError(t *testing.T) {
	stpg := &scsiCmd{cdb: []byte{scsiMaintenanceOut, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0}}
	for _, tc := range []struct {
		err  *SCSIError
		msg  string
		want error
	}{
		{&SCSIError{Op: OpWrite, Status: SCSIStatusReservationConflict}, "initiator: WRITE: target: SCSI status RESERVATION CONFLICT", ErrReservationConflict},
		{&SCSIError{Op: OpWrite, Status: SCSIStatusBusy, cmd: stpg.name()}, "initiator: SCSI command 0xa4/0x0a: target: SCSI status BUSY", nil},
		{&SCSIError{Op: OpRead, Status: SCSIStatusCheckCondition, Key: 0x2, ASC: 0x04, ASCQ: 0x0b}, "", ErrStandby},
		{&SCSIError{Op: OpRead, Status: SCSIStatusCheckCondition, Key: 0x5, ASC: 0x20, cmd: (&scsiCmd{cdb: []byte{0x12}}).name()}, "", errors.ErrUnsupported},
	} {
		if tc.msg != "" && tc.err.Error() != tc.msg {
			t.Errorf("%#v: %q, want %q", tc.err, tc.err.Error(), tc.msg)
		}
		if got := tc.err.Unwrap(); got != tc.want {
			t.Errorf("%v: unwraps to %v, want %v", tc.err, got, tc.want)
		}
	}
}
