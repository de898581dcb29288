package block

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPebbleWALFloor: when something other than the store fills its file
// system, past the reserve down to nothing, the writes the reserve does
// not govern (metadata changes, Flush, Discard, WriteZeroes) are refused
// with ErrNoSpace, which is syscall.ENOSPC too, before pebble logs them:
// pebble's WAL never meets ENOSPC, which pebble does not survive ("pebble:
// fatal commit error", the process exits; without the floor this test's
// process dies at the first Create). Reads go on; once there is room
// again, every one of them succeeds. A store closed on the full file
// system skips its final record, and what was flushed is there when it
// opens again. TestPebbleDiskFull checks that in the store's usual full
// state (below the reserve, above the floor) they are not refused.
func TestPebbleWALFloor(t *testing.T) {
	const dir = "/store"
	fs := newFullFS(dir, 48<<20)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	s, err := OpenPebbleStore(dir, &PebbleOptions{
		FS: fs, Statfs: fs.statfs, Clock: clk.now, CacheSize: 8 << 20, MemTableSize: 4 << 20,
		// No overcommit bound: the fake file system's size shrinks
		// with its limit, and the bound would refuse the create first.
		SpaceReserve: 12 << 20, MaxOvercommit: -1,
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	a, err := s.Create("a", 8<<20, 4096)
	require.NoError(t, err)
	defer a.Close()
	data := bytes.Repeat([]byte{0xaa}, 4096)
	_, err = a.WriteAt(data, 0)
	require.NoError(t, err)
	require.NoError(t, a.Flush())
	doomed, err := s.Create("doomed", 1<<20, 4096)
	require.NoError(t, err)
	require.NoError(t, doomed.Close())

	// Another process takes every byte left; the I/O path's measurement
	// is stale until the refresh interval passes.
	fs.limit.Store(fs.used())
	clk.advance(spaceRefreshInterval)
	refused := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrNoSpace, what)
		require.ErrorIs(t, err, syscall.ENOSPC, what)
		require.Contains(t, err.Error(), "no space left on device", what)
	}
	_, err = s.Create("b", 1<<20, 4096)
	refused("create", err)
	_, err = s.Snapshot("a", "s")
	refused("snapshot", err)
	refused("delete", s.Delete("doomed"))
	refused("resize", a.Resize(16<<20))
	refused("flush", a.Flush())
	refused("discard", a.Discard(4096, 4096))
	refused("write-zeroes", a.WriteZeroes(4096, 4096))
	got := make([]byte, 4096)
	_, err = a.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Zero(t, fs.enospc.Load(), "pebble's WAL or MANIFEST met ENOSPC")

	fs.limit.Store(48 << 20)
	clk.advance(spaceRefreshInterval)
	_, err = s.Create("b", 1<<20, 4096)
	require.NoError(t, err)
	_, err = s.Snapshot("a", "s")
	require.NoError(t, err)
	require.NoError(t, s.Delete("doomed"))
	require.NoError(t, a.Resize(16<<20))
	require.NoError(t, a.Flush())
	require.NoError(t, a.Discard(4096, 4096))
	require.NoError(t, a.WriteZeroes(4096, 4096))
	require.Zero(t, fs.enospc.Load())

	// Closed on a full file system, the store skips its final record
	// (without which pebble would end this test's process), and what was
	// flushed is there when the store opens again. The close itself may
	// fail: pebble ends its WAL with a trailer it has no room for.
	_, err = a.WriteAt(data, 8192)
	require.NoError(t, err)
	require.NoError(t, a.Flush())
	require.NoError(t, a.Close())
	fs.limit.Store(fs.used())
	clk.advance(spaceRefreshInterval)
	closeErr := s.Close()
	t.Logf("close on a full file system: %v", closeErr)
	fs.limit.Store(48 << 20)
	s, err = OpenPebbleStore(dir, &PebbleOptions{FS: fs, Statfs: fs.statfs, Clock: clk.now, CacheSize: 8 << 20, MemTableSize: 4 << 20})
	require.NoError(t, err)
	a, err = s.Open("a")
	require.NoError(t, err)
	_, err = a.ReadAt(got, 8192)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, a.Close())
}
