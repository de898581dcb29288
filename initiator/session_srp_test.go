package initiator

import "testing"

// TestDesignator: the logical unit's identifier from VPD 0x83 pages as
// srpd and LIO write them; NAA wins over EUI-64 over T10 vendor ID
// whatever their order, port and target designators are skipped, and a
// page cut short yields what it wholly holds.
func TestDesignator(t *testing.T) {
	desc := func(assoc, typ byte, d ...byte) []byte {
		return append([]byte{0x01, assoc<<4 | typ, 0, byte(len(d))}, d...)
	}
	page := func(ds ...[]byte) []byte {
		var body []byte
		for _, d := range ds {
			body = append(body, d...)
		}
		return append([]byte{0, 0x83, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	naa := desc(0, 3, 0x36, 0x00, 0x14, 0x05, 0x12, 0x34, 0x56, 0x78)
	t10 := desc(0, 1, []byte("LIO-ORG rd0\x00")...)
	eui := desc(0, 2, 1, 2, 3, 4, 5, 6, 7, 8)
	portNAA := desc(1, 3, 0x50, 0, 0, 0, 0, 0, 0, 1)
	for _, tc := range []struct {
		name string
		page []byte
		want string
	}{
		{"srpd: NAA then T10", page(naa, t10), "naa.3600140512345678"},
		{"T10 first", page(t10, naa), "naa.3600140512345678"},
		{"EUI over T10", page(t10, eui), "eui.0102030405060708"},
		{"T10 only, blanks squeezed", page(t10), "t10.LIO-ORG_rd0"},
		{"port NAA skipped", page(portNAA, t10), "t10.LIO-ORG_rd0"},
		{"none", page(portNAA), ""},
		{"cut short", page(t10, naa)[:4+len(t10)+6], "t10.LIO-ORG_rd0"},
		{"header only", []byte{0, 0x83, 0, 40}, ""},
	} {
		if got := designator(tc.page); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// FuzzDesignator: any VPD 0x83 page, however malformed, yields a string
// and never a panic.
func FuzzDesignator(f *testing.F) {
	f.Add([]byte{0, 0x83, 0, 12, 1, 3, 0, 8, 0x36, 0, 0x14, 5, 0x12, 0x34, 0x56, 0x78})
	f.Add([]byte{0, 0x83, 0xff, 0xff, 1, 1, 0, 200})
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) < 4 {
			return // vpd refuses a page shorter than its header
		}
		designator(p)
	})
}
