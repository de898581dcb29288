package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestExtents asks a target which parts of a volume hold data: the runs
// written, holes elsewhere, an unaligned range cut to it, answers of at
// most wire.MaxExtents that together cover the volume, and bad ranges
// refused before they are sent.
func TestExtents(t *testing.T) {
	const size = 4 << 20
	r := newRig(t, emu.Config{Seed: 1}, size, target.Config{})
	s := r.dial(t, initiator.Config{})
	ctx := context.Background()
	v, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	blk := bytes.Repeat([]byte{5}, 4096)
	for _, b := range []int64{2, 3, 10} {
		if _, err := v.WriteAt(blk, b*4096); err != nil {
			t.Fatal(err)
		}
	}
	got, err := v.Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	want := []initiator.Extent{{Offset: 0, Length: 8192, Hole: true, Zero: true}, {Offset: 8192, Length: 8192},
		{Offset: 16384, Length: 6 * 4096, Hole: true, Zero: true}, {Offset: 40960, Length: 4096},
		{Offset: 45056, Length: size - 45056, Hole: true, Zero: true}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("extents:\n got %+v\nwant %+v", got, want)
	}
	got, err = v.Extents(ctx, 8000, 500)
	if err != nil || !reflect.DeepEqual(got, []initiator.Extent{{Offset: 8000, Length: 192, Hole: true, Zero: true}, {Offset: 8192, Length: 308}}) {
		t.Fatalf("unaligned: %+v, %v", got, err)
	}
	// Every other block written: more runs than one answer carries.
	for b := int64(0); b < 600; b += 2 {
		if _, err := v.WriteAt(blk, (100+b)*4096); err != nil {
			t.Fatal(err)
		}
	}
	var pos, data, answers int64
	for pos < size {
		got, err := v.Extents(ctx, pos, size-pos)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > wire.MaxExtents {
			t.Fatalf("%d extents in one answer", len(got))
		}
		for _, e := range got {
			if e.Offset != pos {
				t.Fatalf("extent at %d, want %d", e.Offset, pos)
			}
			if !e.Hole {
				data += e.Length
			}
			pos += e.Length
		}
		answers++
	}
	if data != (3+300)*4096 || answers < 2 {
		t.Fatalf("%d bytes of data in %d answers, want %d in at least 2", data, answers, (3+300)*4096)
	}
	for _, bad := range [][2]int64{{0, 0}, {-1, 10}, {size - 10, 11}, {size, 1}} {
		if _, err := v.Extents(ctx, bad[0], bad[1]); !errors.Is(err, initiator.ErrInvalid) {
			t.Errorf("extents of %d bytes at %d: %v, want ErrInvalid", bad[1], bad[0], err)
		}
	}
}
