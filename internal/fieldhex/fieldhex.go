// Package fieldhex turns a byte layout written out field by field in hex
// into bytes, so that tests of wire formats (SRP IUs, SCSI data) read as
// the standard's tables do:
//
//	want := fieldhex.Bytes(t,
//		"c0",       // 0 opcode SRP_LOGIN_RSP
//		"000000",   // 1 reserved
//		"00000080", // 4 req_lim_delta 128
//	)
//
// Each field is hex digits, spaces allowed, and anything after "//" is a
// comment (give the byte offset there).
package fieldhex

import (
	"encoding/hex"
	"strings"
	"testing"
)

// Bytes concatenates the fields' bytes; a field that is not hex fails
// the test.
func Bytes(tb testing.TB, fields ...string) []byte {
	tb.Helper()
	var b strings.Builder
	for _, f := range fields {
		f, _, _ = strings.Cut(f, "//")
		b.WriteString(strings.ReplaceAll(f, " ", ""))
	}
	out, err := hex.DecodeString(b.String())
	if err != nil {
		tb.Fatalf("fieldhex: bad hex in layout: %v", err)
	}
	return out
}

// Zeros is n zero bytes as a field.
func Zeros(n int) string { return strings.Repeat("00", n) }
