package enum

import (
	"fmt"
	"testing"
)

type op uint8

type code uint32

func TestName(t *testing.T) {
	names := []string{1: "read", 2: "write"}
	for _, tc := range []struct {
		v    op
		want string
	}{
		{1, "read"},
		{2, "write"},
		{0, "op(0)"},     // a hole in the table
		{3, "op(3)"},     // past the table
		{255, "op(255)"}, // the largest value, never a panic
	} {
		if got := Name(names, tc.v, "op"); got != tc.want {
			t.Errorf("Name(%d) = %q, want %q", tc.v, got, tc.want)
		}
	}
	// The fallback is what fmt's %d printed, so a String method moved
	// onto Name prints as it did.
	for v := range 256 {
		if got, want := Name(nil, op(v), "op"), fmt.Sprintf("op(%d)", v); got != want {
			t.Errorf("Name(nil, %d) = %q, want %q", v, got, want)
		}
	}
}

func TestHex(t *testing.T) {
	names := []string{0xc1: "SRP_RSP"}
	for _, tc := range []struct {
		v    code
		want string
	}{
		{0xc1, "SRP_RSP"},
		{0, "code(0x00)"},
		{7, "code(0x07)"},
		{0xc2, "code(0xc2)"},
		{1 << 31, "code(0x80000000)"},
	} {
		if got := Hex(names, tc.v, "code"); got != tc.want {
			t.Errorf("Hex(%#x) = %q, want %q", tc.v, got, tc.want)
		}
		if got, want := Hex(nil, tc.v, "code"), fmt.Sprintf("code(%#02x)", uint32(tc.v)); got != want {
			t.Errorf("Hex(nil, %#x) = %q, want %q (fmt's %%#02x)", tc.v, got, want)
		}
	}
}

func TestFlags(t *testing.T) {
	names := []string{"flush", "fua", "discard"}
	for _, tc := range []struct {
		v    op
		want string
	}{
		{0, "none"},
		{1, "flush"},
		{1 | 4, "flush|discard"},
		{7, "flush|fua|discard"},
		{8, "0x8"},             // a bit past the names
		{2 | 0x30, "fua|0x30"}, // known bits first, the rest as one number
		{255, "flush|fua|discard|0xf8"},
	} {
		if got := Flags(names, tc.v); got != tc.want {
			t.Errorf("Flags(%#x) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
