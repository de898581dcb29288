package transporttest

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Key/Bump", testKeyBump)
	register("Key/Layout", testKeyLayout)
	register("Arena/Basic", testArenaBasic)
	register("Arena/Lookup", testArenaLookup)
	register("Device/Open", testDeviceOpen)
	register("Device/Attr", testDeviceAttr)
	register("Device/AllocUnsupported", testDeviceAllocUnsupported)
	register("MR/RegMRArgs", testRegMRArgs)
	register("MR/Regular", testRegularMR)
}

// Key.Bump: the variant plus one, wrapping 0xff -> 0x00, index unchanged
// (ib_inc_rkey, docs/verbs.md#keys).
func testKeyBump(t *testing.T, _ transport.Provider) {
	k := transport.MakeKey(0xabcdef, 0xfe)
	if got := k.Bump(); got != transport.MakeKey(0xabcdef, 0xff) {
		t.Errorf("%v.Bump() = %v", k, got)
	}
	if got := k.Bump().Bump(); got != transport.MakeKey(0xabcdef, 0x00) || got.Index() != 0xabcdef {
		t.Errorf("bump across the wrap: %v, want index 0xabcdef variant 0", got)
	}
	start := transport.MakeKey(0x000123, 0x42)
	k = start
	for i := 1; i <= 256; i++ {
		k = k.Bump()
		if k.Index() != start.Index() {
			t.Fatalf("after %d bumps the index changed: %v", i, k)
		}
		if i < 256 && k == start {
			t.Fatalf("key repeated after only %d bumps", i)
		}
	}
	if k != start {
		t.Errorf("256 bumps of %v gave %v, want the same key (8-bit wrap)", start, k)
	}
	// Index 0xffffff, variant 0xff must not carry into anything.
	if got := transport.Key(0xffffffff).Bump(); got != transport.Key(0xffffff00) {
		t.Errorf("Key(0xffffffff).Bump() = %#x, want 0xffffff00", uint32(got))
	}
}

func testKeyLayout(t *testing.T, _ transport.Provider) {
	k := transport.MakeKey(0x1234567, 0x89) // index bits above 24 are discarded
	if k.Index() != 0x234567 || k.Variant() != 0x89 {
		t.Errorf("MakeKey(0x1234567, 0x89) = index %#x variant %#x", k.Index(), k.Variant())
	}
	if uint32(k) != 0x23456789 {
		t.Errorf("MakeKey(0x1234567, 0x89) = %#x, want 0x23456789", uint32(k))
	}
	if s := transport.MakeKey(0x2a, 7).String(); s != "0x00002a:07" {
		t.Errorf("String() = %q, want 0x00002a:07", s)
	}
	if !(transport.AccessLocalWrite | transport.AccessRemoteWrite).Valid() {
		t.Error("LOCAL_WRITE|REMOTE_WRITE reported invalid")
	}
	if transport.AccessRemoteWrite.Valid() || transport.AccessRemoteAtomic.Valid() {
		t.Error("REMOTE_WRITE / REMOTE_ATOMIC without LOCAL_WRITE reported valid (ibv_reg_mr(3))")
	}
	if !transport.AccessRemoteRead.Valid() || !transport.Access(0).Valid() {
		t.Error("REMOTE_READ or LOCAL_READ reported invalid")
	}
}

func testArenaBasic(t *testing.T, p transport.Provider) {
	if _, err := transport.NewArena(0, transport.ArenaOptions{}); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("NewArena(0): %v, want ErrInvalidArgument", err)
	}
	a := newArena(t, p, 1)
	if a.Len() != transport.PageSize {
		t.Errorf("NewArena(1).Len() = %d, want one page (%d)", a.Len(), transport.PageSize)
	}
	if a.Addr()%uint64(transport.PageSize) != 0 {
		t.Errorf("arena address %#x not page aligned", a.Addr())
	}
	for i, b := range a.Bytes() {
		if b != 0 {
			t.Fatalf("fresh arena byte %d = %#x, want zero", i, b)
		}
	}
	s, err := a.Slice(10, 20)
	if err != nil || len(s) != 20 || cap(s) != 20 {
		t.Fatalf("Slice(10, 20) = len %d cap %d, %v", len(s), cap(s), err)
	}
	s[0] = 0x77
	if a.Bytes()[10] != 0x77 {
		t.Error("Slice does not alias the arena")
	}
	for _, r := range [][2]int{{-1, 1}, {0, a.Len() + 1}, {a.Len(), 1}, {1, -1}} {
		if _, err := a.Slice(r[0], r[1]); !errors.Is(err, transport.ErrInvalidArgument) {
			t.Errorf("Slice(%d, %d): %v, want ErrInvalidArgument", r[0], r[1], err)
		}
	}
	if a.FD() != -1 {
		t.Errorf("non-shared arena FD = %d, want -1", a.FD())
	}
	b, err := transport.NewArena(3*transport.PageSize+1, transport.ArenaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 4*transport.PageSize {
		t.Errorf("Len = %d, want 4 pages", b.Len())
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
}

func testArenaLookup(t *testing.T, p transport.Provider) {
	a := newArena(t, p, 2*transport.PageSize)
	got, off, ok := transport.LookupArena(a.Addr()+100, 50)
	if !ok || got != a || off != 100 {
		t.Errorf("LookupArena(addr+100, 50) = %p, %d, %v; want the arena, 100, true", got, off, ok)
	}
	if _, _, ok := transport.LookupArena(a.Addr()+uint64(a.Len())-10, 11); ok {
		t.Error("LookupArena accepted a range running past the arena's end")
	}
	heap := make([]byte, 64)
	if _, _, ok := transport.LookupArena(uint64(uintptrOf(heap)), 8); ok {
		t.Error("LookupArena accepted Go heap memory")
	}
	b, err := transport.NewArena(transport.PageSize, transport.ArenaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	b.Close()
	if got, _, ok := transport.LookupArena(addr, 1); ok && got == b {
		t.Error("LookupArena still finds a closed arena")
	}
}

func testDeviceOpen(t *testing.T, p transport.Provider) {
	if p.Name() == "" {
		t.Error("provider has an empty Name")
	}
	names, err := p.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(names) == 0 {
		t.Fatal("provider lists no devices")
	}
	d0 := openDevice(t, p)
	d1, err := p.OpenDevice(names[0])
	if err != nil {
		t.Fatalf("OpenDevice(%q): %v", names[0], err)
	}
	if d0 != d1 {
		t.Errorf("OpenDevice(\"\") and OpenDevice(%q) returned different Devices; devices are shared (provider.go)", names[0])
	}
	if d0.Attr().Name != names[0] {
		t.Errorf("device Attr().Name = %q, want %q", d0.Attr().Name, names[0])
	}
	if _, err := p.OpenDevice("no-such-device-xyz"); !errors.Is(err, transport.ErrNotFound) {
		t.Errorf("OpenDevice(unknown): %v, want ErrNotFound", err)
	}
}

func testDeviceAttr(t *testing.T, p transport.Provider) {
	attr := deviceAttr(t, p)
	t.Logf("device %q vendor %q caps %v quirks %+v", attr.Name, attr.Vendor, attr.Caps, attr.Quirks)
	if attr.MaxQP <= 0 || attr.MaxQPWR <= 0 || attr.MaxSGE <= 0 || attr.MaxCQE <= 0 || attr.MaxMR <= 0 || attr.MaxPD <= 0 {
		t.Errorf("non-positive limits: MaxQP %d MaxQPWR %d MaxSGE %d MaxCQE %d MaxMR %d MaxPD %d",
			attr.MaxQP, attr.MaxQPWR, attr.MaxSGE, attr.MaxCQE, attr.MaxMR, attr.MaxPD)
	}
	if attr.Caps.Has(transport.CapFastRegMR) && attr.MaxFastRegPages <= 0 {
		t.Errorf("FAST_REG_MR without MaxFastRegPages (%d)", attr.MaxFastRegPages)
	}
	if attr.Caps.Has(transport.CapMemWindow2) && attr.MaxMW <= 0 {
		t.Errorf("MW_TYPE_2 without MaxMW (%d)", attr.MaxMW)
	}
	if attr.PortMTU <= 0 {
		t.Errorf("PortMTU %d", attr.PortMTU)
	}
	if s := attr.Quirks.LocalOpErrStatus; s == transport.StatusSuccess {
		t.Errorf("Quirks.LocalOpErrStatus is SUCCESS; a failed local memory operation must report an error status (MW_BIND_ERR or LOC_QP_OP_ERR)")
	}
	if attr.Caps&(transport.CapFastRegMR|transport.CapMemWindow2) != 0 {
		if !attr.Caps.Has(transport.CapLocalInv) {
			t.Errorf("fast registration (%v) without LOCAL_INV: registrations could never be invalidated locally", attr.Caps)
		}
	}
}

func testDeviceAllocUnsupported(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	attr := dev.Attr()
	pd := allocPD(t, dev)
	if !attr.Caps.Has(transport.CapFastRegMR) {
		if _, err := pd.AllocFastRegMR(1); !errors.Is(err, transport.ErrUnsupported) {
			t.Errorf("AllocFastRegMR without FAST_REG_MR: %v, want ErrUnsupported", err)
		}
	} else if attr.MaxFastRegPages > 0 {
		if _, err := pd.AllocFastRegMR(attr.MaxFastRegPages + 1); err == nil {
			t.Errorf("AllocFastRegMR(MaxFastRegPages+1 = %d) succeeded", attr.MaxFastRegPages+1)
		}
	}
	if !attr.Caps.Has(transport.CapMemWindow2) {
		if _, err := pd.AllocMW(); !errors.Is(err, transport.ErrUnsupported) {
			t.Errorf("AllocMW without MW_TYPE_2: %v, want ErrUnsupported", err)
		}
	}
	if attr.Caps == 0 {
		t.Skip("device has no optional capabilities")
	}
}

// RegMR argument checks (ibv_reg_mr(3)): REMOTE_WRITE needs LOCAL_WRITE;
// the range must be inside the arena.
func testRegMRArgs(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	pd := allocPD(t, dev)
	a := newArena(t, p, 2*transport.PageSize)
	bad := []struct {
		name   string
		off, n int
		acc    transport.Access
	}{
		{"REMOTE_WRITE without LOCAL_WRITE", 0, 64, transport.AccessRemoteWrite},
		{"REMOTE_ATOMIC without LOCAL_WRITE", 0, 64, transport.AccessRemoteAtomic | transport.AccessRemoteRead},
		{"unknown access bit", 0, 64, transport.Access(1 << 20)},
		{"range past the arena", a.Len() - 10, 11, transport.AccessLocalWrite},
		{"negative offset", -1, 10, transport.AccessLocalWrite},
	}
	for _, c := range bad {
		mr, err := pd.RegMR(a, c.off, c.n, c.acc)
		if err == nil {
			mr.Close()
			t.Errorf("RegMR %s: succeeded, want ErrInvalidArgument", c.name)
		} else if !errors.Is(err, transport.ErrInvalidArgument) {
			t.Errorf("RegMR %s: %v, want ErrInvalidArgument", c.name, err)
		}
	}
}

// A regular MR reports what it was registered with; keys of different MRs
// have different indexes.
func testRegularMR(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	pd := allocPD(t, dev)
	a := newArena(t, p, 4*transport.PageSize)
	acc := transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
	m1 := regMR(t, pd, a, 100, 5000, acc)
	m2 := regMR(t, pd, a, 0, a.Len(), transport.AccessLocalWrite)
	if m1.Addr() != a.Addr()+100 || m1.Len() != 5000 || m1.Access() != acc || m1.Arena() != a {
		t.Errorf("MR reports addr %#x len %d access %v arena %p; registered addr %#x len 5000 access %v arena %p",
			m1.Addr(), m1.Len(), m1.Access(), m1.Arena(), a.Addr()+100, acc, a)
	}
	if m1.LKey().Index() == m2.LKey().Index() {
		t.Errorf("two MRs share key index %#x", m1.LKey().Index())
	}
	if m1.RKey().Index() != m1.LKey().Index() {
		t.Logf("note: MR with remote access has rkey %v and lkey %v with different indexes", m1.RKey(), m1.LKey())
	}
	if err := m2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
