package initiator

import (
	"errors"
	"testing"
)

// TestPathErrors: what each path answered prints on one line, and an
// empty list says so rather than printing nothing after "no path took
// it over:".
func TestPathErrors(t *testing.T) {
	for _, c := range []struct {
		errs pathErrors
		want string
	}{
		{nil, "no path was tried"},
		{pathErrors{errors.New("a")}, "a"},
		{pathErrors{errors.New("a"), errors.New("b")}, "a; b"},
	} {
		if got := c.errs.Error(); got != c.want {
			t.Errorf("%d errors print %q, want %q", len(c.errs), got, c.want)
		}
	}
	if !errors.Is(pathErrors{ErrStandby}, ErrStandby) {
		t.Error("pathErrors hides what it holds from errors.Is")
	}
}
