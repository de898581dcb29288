package initiator

import (
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
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
