package srp

import (
	"bytes"
	"errors"
	"testing"
)

// table encodes descs as an initiator lays an indirect table out in its
// memory.
func table(descs ...Descriptor) []byte {
	b := make([]byte, len(descs)*DescriptorLen)
	for i, d := range descs {
		d.Encode(b[i*DescriptorLen:])
	}
	return b
}

// TestDecodeTable: a fetched indirect table is taken only when it is
// whole descriptors, no more than the target bounds, and sums to the
// SRP_CMD's total; the layout is struct srp_direct_buf, big-endian.
func TestDecodeTable(t *testing.T) {
	a := Descriptor{VA: 0x1122334455667788, Key: 0xaabbccdd, Len: 4096}
	b := Descriptor{VA: 0x2000, Key: 7, Len: 512}
	z := Descriptor{VA: 0x3000, Key: 7}
	big := Descriptor{VA: 0x4000, Key: 7, Len: 0xffffffff}
	for _, tc := range []struct {
		name  string
		b     []byte
		total uint32
		max   int
		want  []Descriptor
		err   error
	}{
		{"two", table(a, b), 4608, 4, []Descriptor{a, b}, nil},
		{"zero-length entry moves nothing", table(a, z, b), 4608, 4, []Descriptor{a, z, b}, nil},
		{"exactly the bound", table(a, b, z, z), 4608, 4, []Descriptor{a, b, z, z}, nil},
		{"beyond the bound", table(a, b, z, z, z), 4608, 4, nil, ErrTooLarge},
		{"sum short of total", table(a, b), 4609, 4, nil, ErrMalformed},
		{"sum past total", table(a, b), 4607, 4, nil, ErrMalformed},
		{"sum past 32 bits", table(big, b), 511, 4, nil, ErrMalformed},
		{"part of a descriptor", table(a)[:15], 4096, 4, nil, ErrMalformed},
		{"empty", nil, 0, 4, []Descriptor{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]Descriptor, tc.max)
			n, err := DecodeTable(tc.b, tc.total, dst)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err == nil && (n != len(tc.want) || !equalDescs(dst[:n], tc.want)) {
				t.Fatalf("%d descriptors %+v, want %+v", n, dst[:n], tc.want)
			}
		})
	}
	if got := table(a); !bytes.Equal(got, []byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0x10, 0}) {
		t.Fatalf("descriptor layout % x", got)
	}
	if _, err := a.Encode(make([]byte, 15)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("short buffer: %v", err)
	}
}

func equalDescs(a, b []Descriptor) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecodeTable: whatever bytes the initiator's memory held, the
// decoder returns an error or at most the bound of descriptors summing
// to the total, which encode back to the same bytes.
func FuzzDecodeTable(f *testing.F) {
	f.Add(table(Descriptor{VA: 1, Key: 2, Len: 3}, Descriptor{VA: 4, Key: 5, Len: 6}), uint32(9))
	f.Add(table(Descriptor{Len: 0xffffffff}, Descriptor{Len: 1}), uint32(0))
	f.Add([]byte{1, 2, 3}, uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, total uint32) {
		var dst [16]Descriptor
		n, err := DecodeTable(b, total, dst[:])
		if err != nil {
			return
		}
		var sum uint64
		for _, d := range dst[:n] {
			sum += uint64(d.Len)
		}
		if n > len(dst) || sum != uint64(total) || !bytes.Equal(table(dst[:n]...), b) {
			t.Fatalf("%d descriptors summing to %d (total %d), re-encoded % x from % x", n, sum, total, table(dst[:n]...), b)
		}
	})
}
