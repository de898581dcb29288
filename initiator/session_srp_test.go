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

// TestALUAParse: the target port group designator of a VPD 0x83 page,
// and a group's state in REPORT TARGET PORT GROUPS data, as srpd and LIO
// send them.
func TestALUAParse(t *testing.T) {
	vpd := []byte{0, 0x83, 0, 24,
		1, 3, 0, 8, 0x31, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // NAA
		1, 0x14, 0, 4, 0, 0, 0, 2, // relative target port 2
		1, 0x15, 0, 4, 0, 0, 0x01, 0x02} // target port group 0x0102
	vpd[3] = byte(len(vpd) - 4)
	if g, ok := portGroup(vpd); !ok || g != 0x0102 {
		t.Errorf("portGroup: %#x, %v; want 0x102", g, ok)
	}
	if _, ok := portGroup(vpd[:len(vpd)-4]); ok {
		t.Error("portGroup found a designator cut short")
	}
	rtpg := []byte{0, 0, 0, 24,
		2, 0x0d, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, // group 1 standby, one port
		0, 0x0d, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2} // group 2 active/optimized
	for _, tc := range []struct {
		g    uint16
		want bool
	}{{1, true}, {2, false}, {3, false}} {
		if got := groupStandby(rtpg, tc.g); got != tc.want {
			t.Errorf("group %d: standby %v, want %v", tc.g, got, tc.want)
		}
	}
}

// FuzzALUAParse: whatever a target sends as VPD 0x83 and REPORT TARGET
// PORT GROUPS data, the initiator reads a group and a state and never
// panics.
func FuzzALUAParse(f *testing.F) {
	f.Add([]byte{0, 0x83, 0, 8, 1, 0x15, 0, 4, 0, 0, 0, 2}, []byte{0, 0, 0, 12, 2, 0x0d, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2})
	f.Add([]byte{0, 0x83, 0xff, 0xff, 1, 0x15, 0, 255}, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 255})
	f.Fuzz(func(t *testing.T, vpd, rtpg []byte) {
		if len(vpd) >= 4 { // vpd refuses a shorter page
			portGroup(vpd)
		}
		if len(rtpg) >= 4 { // aluaState refuses shorter data
			for _, g := range []uint16{0, 1, 2, 0xffff} {
				groupStandby(rtpg, g)
			}
		}
	})
}
