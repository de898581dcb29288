package block

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// runs collects what Allocated reports for [off, off+n).
func runs(t *testing.T, v Volume, off, n int64) ([][2]int64, int64) {
	t.Helper()
	var out [][2]int64
	end, err := v.(Allocator).Allocated(off, n, func(o, l int64) bool {
		out = append(out, [2]int64{o, l})
		return true
	})
	require.NoError(t, err)
	return out, end
}

// TestAllocated checks every backend reports the blocks written, not the
// ones never written or discarded, cut to unaligned ranges.
func TestAllocated(t *testing.T) {
	const bs = 4096
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			v, err := s.Create("v", 64*bs, bs)
			require.NoError(t, err)
			defer v.Close()
			got, end := runs(t, v, 0, 64*bs)
			require.Empty(t, got, "a new volume is all holes")
			require.Equal(t, int64(64*bs), end)

			data := bytes.Repeat([]byte{9}, 3*bs)
			_, err = v.WriteAt(data[:bs], 2*bs)
			require.NoError(t, err)
			_, err = v.WriteAt(data, 5*bs)
			require.NoError(t, err)
			_, err = v.WriteAt(data[:bs], 63*bs)
			require.NoError(t, err)
			if v.Caps().Has(CapDiscard) {
				require.NoError(t, v.Discard(7*bs, bs))
			} else {
				_, err = v.WriteAt(make([]byte, bs), 7*bs) // stays allocated
				require.NoError(t, err)
			}
			want := [][2]int64{{2 * bs, bs}, {5 * bs, 2 * bs}, {63 * bs, bs}}
			if !v.Caps().Has(CapDiscard) {
				want[1][1] = 3 * bs
			}
			got, end = runs(t, v, 0, 64*bs)
			require.Equal(t, want, got)
			require.Equal(t, int64(64*bs), end)

			// Unaligned: runs cut to the range.
			got, end = runs(t, v, 2*bs+100, 3*bs+10)
			require.Equal(t, [][2]int64{{2*bs + 100, bs - 100}, {5 * bs, 110}}, got)
			require.Equal(t, int64(5*bs+110), end)

			// yield stops it.
			calls := 0
			end, err = v.(Allocator).Allocated(0, 64*bs, func(o, l int64) bool { calls++; return false })
			require.NoError(t, err)
			require.Equal(t, 1, calls)
			require.Equal(t, int64(3*bs), end)

			for _, bad := range [][2]int64{{0, 0}, {-bs, bs}, {63 * bs, 2 * bs}, {65 * bs, 1}} {
				_, err := v.(Allocator).Allocated(bad[0], bad[1], func(o, l int64) bool { return true })
				require.True(t, errors.Is(err, ErrOutOfRange) || errors.Is(err, ErrZeroLength), "range %v: %v", bad, err)
			}
			require.NoError(t, v.Close())
			_, err = v.(Allocator).Allocated(0, bs, func(o, l int64) bool { return true })
			require.ErrorIs(t, err, ErrClosed)
		})
	}
}

// TestAllocatedLayers: a pebble volume with a snapshot below reports the
// blocks of every layer (and a block discarded over an older layer as
// allocated, which is allowed: it reads as zeros).
func TestAllocatedLayers(t *testing.T) {
	const bs = 4096
	for _, be := range backends() {
		if be.name == "file" {
			continue // no snapshots
		}
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			v, err := s.Create("v", 16*bs, bs)
			require.NoError(t, err)
			defer v.Close()
			blk := bytes.Repeat([]byte{1}, bs)
			for _, b := range []int64{1, 2, 8} {
				_, err = v.WriteAt(blk, b*bs)
				require.NoError(t, err)
			}
			_, err = s.(Snapshotter).Snapshot("v", "s1")
			require.NoError(t, err)
			for _, b := range []int64{3, 10} {
				_, err = v.WriteAt(blk, b*bs)
				require.NoError(t, err)
			}
			got, _ := runs(t, v, 0, 16*bs)
			require.Equal(t, [][2]int64{{bs, 3 * bs}, {8 * bs, bs}, {10 * bs, bs}}, got)
			snap, err := s.(Snapshotter).OpenSnapshot("v", "s1")
			require.NoError(t, err)
			defer snap.Close()
			got, _ = runs(t, snap, 0, 16*bs)
			require.Equal(t, [][2]int64{{bs, 2 * bs}, {8 * bs, bs}}, got)
		})
	}
}

// TestAllocatedBudget: a long run stops after maxAllocScan blocks with a
// prefix, and asking again from its end finishes it.
func TestAllocatedBudget(t *testing.T) {
	const bs = 512
	for _, be := range backends() {
		if be.name == "file" {
			continue // lseek has no per-block cost to bound
		}
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			size := int64(maxAllocScan+1000) * bs
			v, err := s.Create("v", size+8*bs, bs)
			require.NoError(t, err)
			defer v.Close()
			_, err = v.WriteAt(bytes.Repeat([]byte{3}, int(size)), 0)
			require.NoError(t, err)
			var total int64
			pos, calls := int64(0), 0
			for pos < v.Size() {
				calls++
				got, end := runs(t, v, pos, v.Size()-pos)
				require.Greater(t, end, pos)
				for _, r := range got {
					total += r[1]
				}
				pos = end
			}
			require.Equal(t, size, total)
			require.GreaterOrEqual(t, calls, 2, "one call described %d blocks", size/bs)
		})
	}
}
