package block

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCreateValidation(t *testing.T) {
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			for _, tc := range []struct {
				name string
				size int64
				bs   int
				want error
			}{
				{"", 4096, 0, ErrInvalid},
				{"a/b", 4096, 0, ErrInvalid},
				{"a@b", 4096, 0, ErrInvalid},
				{"..", 4096, 0, ErrInvalid},
				{"nul\x00", 4096, 0, ErrInvalid},
				{"bs", 4096, 1024, ErrInvalid},
				{"size", 4095, 4096, ErrInvalid},
				{"neg", -512, 512, ErrInvalid},
				{"ok", 8192, 0, nil},
				{"ok", 8192, 0, ErrExists},
				{"small", 1024, 512, nil},
				{"empty", 0, 4096, nil},
			} {
				v, err := s.Create(tc.name, tc.size, tc.bs)
				if tc.want != nil {
					require.ErrorIs(t, err, tc.want, "create %q size %d bs %d", tc.name, tc.size, tc.bs)
					require.Contains(t, err.Error(), "block: ")
					continue
				}
				require.NoError(t, err)
				require.Equal(t, tc.size, v.Size())
				wantBS := tc.bs
				if wantBS == 0 {
					wantBS = DefaultBlockSize
				}
				require.Equal(t, wantBS, v.BlockSize())
				require.Equal(t, tc.name, v.Name())
				require.NoError(t, v.Close())
			}
			infos, err := s.List()
			require.NoError(t, err)
			require.Len(t, infos, 3)
			require.Equal(t, []string{"empty", "ok", "small"}, []string{infos[0].Name, infos[1].Name, infos[2].Name})
			_, err = s.Open("missing")
			require.ErrorIs(t, err, ErrNotFound)
			require.ErrorIs(t, s.Delete("missing"), ErrNotFound)
		})
	}
}

func TestIOErrors(t *testing.T) {
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			v, err := s.Create("v", 16*4096, 4096)
			require.NoError(t, err)
			defer v.Close()
			blk := make([]byte, 4096)
			for _, tc := range []struct {
				desc string
				call func() error
				want error
			}{
				{"read zero", func() error { _, err := v.ReadAt(nil, 0); return err }, ErrZeroLength},
				{"write zero", func() error { _, err := v.WriteAt(nil, 0); return err }, ErrZeroLength},
				{"discard zero", func() error { return v.Discard(0, 0) }, ErrZeroLength},
				{"read misaligned off", func() error { _, err := v.ReadAt(blk, 1); return err }, ErrMisaligned},
				{"write misaligned len", func() error { _, err := v.WriteAt(blk[:512], 0); return err }, ErrMisaligned},
				{"fua misaligned", func() error { _, err := v.WriteAtFUA(blk[:100], 0); return err }, ErrMisaligned},
				{"zeroes misaligned", func() error { return v.WriteZeroes(4096, 100) }, ErrMisaligned},
				{"read past end", func() error { _, err := v.ReadAt(blk, 16*4096); return err }, ErrOutOfRange},
				{"write straddling end", func() error { _, err := v.WriteAt(make([]byte, 8192), 15*4096); return err }, ErrOutOfRange},
				{"negative offset", func() error { _, err := v.ReadAt(blk, -4096); return err }, ErrOutOfRange},
				{"discard past end", func() error { return v.Discard(0, 17*4096) }, ErrOutOfRange},
				{"resize misaligned", func() error { return v.Resize(100) }, ErrInvalid},
				{"resize negative", func() error { return v.Resize(-4096) }, ErrInvalid},
			} {
				err := tc.call()
				require.ErrorIs(t, err, tc.want, tc.desc)
				require.Contains(t, err.Error(), `block: volume "v"`, tc.desc)
			}
			// A failed request changed nothing and the volume still works.
			_, err = v.WriteAt(bytes.Repeat([]byte{1}, 4096), 0)
			require.NoError(t, err)
			got := make([]byte, 4096)
			_, err = v.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat([]byte{1}, 4096), got)
		})
	}
}

func TestClosed(t *testing.T) {
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			v, err := s.Create("v", 4*4096, 0)
			require.NoError(t, err)
			v2, err := s.Open("v")
			require.NoError(t, err)
			require.ErrorIs(t, s.Delete("v"), ErrBusy)
			require.NoError(t, v.Close())
			require.ErrorIs(t, v.Close(), ErrClosed)
			blk := make([]byte, 4096)
			_, err = v.ReadAt(blk, 0)
			require.ErrorIs(t, err, ErrClosed)
			_, err = v.WriteAt(blk, 0)
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, v.Flush(), ErrClosed)
			require.ErrorIs(t, v.Discard(0, 4096), ErrClosed)
			require.ErrorIs(t, v.Resize(0), ErrClosed)
			// The other handle is still open.
			_, err = v2.WriteAt(blk, 0)
			require.NoError(t, err)
			// Closing the store closes it.
			require.NoError(t, s.Close())
			_, err = v2.ReadAt(blk, 0)
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, v2.Flush(), ErrClosed)
			_, err = s.Open("v")
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, s.Close(), ErrClosed)
			require.NoError(t, v2.Close())
		})
	}
}

func TestCaps(t *testing.T) {
	want := map[string]Caps{
		"memory": CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapImmediate,
		"file":   CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapPersistent,
		"pebble": CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapPersistent,
		"rbd":    CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapPersistent,
	}
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			v, err := s.Create("v", 4096, 0)
			require.NoError(t, err)
			defer v.Close()
			got := v.Caps()
			if be.name == "file" && !got.Has(CapDiscard) {
				t.Logf("file system cannot punch holes; discard not reported")
				got |= CapDiscard
			}
			require.Equal(t, want[be.name], got, "caps %v", v.Caps())
			_, isSnap := s.(Snapshotter)
			require.Equal(t, got.Has(CapSnapshot), isSnap)
		})
	}
	require.Equal(t, "flush|discard", (CapFlush | CapDiscard).String())
	require.Equal(t, "none", Caps(0).String())
}

// TestIdentity: a volume's identity (the target's Identifier) is the same
// for every open of it and across a reopen of a persistent store, and
// differs for the volume deleted and created again under its name, and
// for its snapshot: an initiator re-opening a name after a reconnect
// tells by it whether it still writes to the same volume. List reports
// it too (VolumeInfo.Identity), for the target's SRP LUN map, from a
// persistent store only: a memory store's volumes are made anew by a
// restart and must keep their LUNs.
func TestIdentity(t *testing.T) {
	type identifier interface{ Identity() uint64 }
	id := func(v Volume) uint64 { return v.(identifier).Identity() }
	listed := func(s Store) uint64 {
		l, err := s.List()
		require.NoError(t, err)
		for _, v := range l {
			if v.Name == "v" {
				return v.Identity
			}
		}
		t.Fatal("List does not list v")
		return 0
	}
	// checkListed checks List's identity of v against want, its handles'.
	checkListed := func(s Store, persistent bool, want uint64, what string) {
		t.Helper()
		if !persistent {
			want = 0
		}
		require.Equal(t, want, listed(s), "List's identity, "+what)
	}
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			dir := t.TempDir()
			s := be.open(t, dir)
			defer func() { s.Close() }()
			v, err := s.Create("v", 8192, 0)
			require.NoError(t, err)
			first := id(v)
			require.NotZero(t, first)
			checkListed(s, be.persistent, first, "once created")
			v2, err := s.Open("v")
			require.NoError(t, err)
			require.Equal(t, first, id(v2), "a second open")
			require.NoError(t, v2.Close())
			if sn, ok := s.(Snapshotter); ok {
				_, err := sn.Snapshot("v", "s")
				require.NoError(t, err)
				sv, err := sn.OpenSnapshot("v", "s")
				require.NoError(t, err)
				require.NotEqual(t, first, id(sv), "the snapshot")
				sv2, err := sn.OpenSnapshot("v", "s")
				require.NoError(t, err)
				require.Equal(t, id(sv), id(sv2), "a second open of the snapshot")
				require.NoError(t, sv.Close())
				require.NoError(t, sv2.Close())
				require.NoError(t, sn.DeleteSnapshot("v", "s"))
			}
			require.NoError(t, v.Close())
			if be.persistent {
				require.NoError(t, s.Close())
				s = be.open(t, dir)
				v, err = s.Open("v")
				require.NoError(t, err)
				require.Equal(t, first, id(v), "after the store was opened again")
				checkListed(s, true, first, "after the store was opened again")
				require.NoError(t, v.Close())
			}
			require.NoError(t, s.Delete("v"))
			v, err = s.Create("v", 8192, 0)
			require.NoError(t, err)
			require.NotEqual(t, first, id(v), "the volume created again under its name")
			checkListed(s, be.persistent, id(v), "the volume created again under its name")
			require.NoError(t, v.Close())
		})
	}
}

func TestConcurrentIO(t *testing.T) {
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			v, err := s.Create("v", 64*4096, 4096)
			require.NoError(t, err)
			defer v.Close()
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each goroutine owns blocks g, g+8, ...
					for i := 0; i < 50; i++ {
						blk := int64(g + 8*(i%8))
						want := bytes.Repeat([]byte{byte(g*50 + i)}, 4096)
						_, err := v.WriteAt(want, blk*4096)
						require.NoError(t, err)
						if i%10 == 0 {
							require.NoError(t, v.Flush())
						}
						got := make([]byte, 4096)
						_, err = v.ReadAt(got, blk*4096)
						require.NoError(t, err)
						require.Equal(t, want, got)
					}
				}()
			}
			wg.Wait()
		})
	}
}

func TestOpenStoreByName(t *testing.T) {
	for _, kind := range []string{"", "pebble", "file", "memory"} {
		s, err := OpenStore(kind, filepath.Join(t.TempDir(), "s"))
		require.NoError(t, err, kind)
		require.NoError(t, s.Close())
	}
	for _, kind := range []string{"tape", "rbd", "Pebble"} {
		s, err := OpenStore(kind, t.TempDir())
		require.ErrorIs(t, err, ErrInvalid, kind)
		require.True(t, s == nil, kind)
	}
	// A store that fails to open is a nil Store, so a caller's cleanup
	// that closes a non-nil store does not crash.
	notDir := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(notDir, []byte("x"), 0o644))
	for _, kind := range []string{"pebble", "file"} {
		s, err := OpenStore(kind, notDir)
		require.Error(t, err, kind)
		require.True(t, s == nil, "%s: OpenStore returned %#v, want a nil Store", kind, s)
	}
}

// TestParseBackend: the names a user may give a backend, each to the one
// callers compare against, and a refusal that lists what there is.
func TestParseBackend(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "pebble"}, {"pebble", "pebble"}, {"file", "file"},
		{"mem", "memory"}, {"memory", "memory"}, {"rbd", "rbd"},
	} {
		got, err := ParseBackend(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, in := range []string{"tape", "PEBBLE", " pebble", "mem "} {
		_, err := ParseBackend(in)
		require.ErrorIs(t, err, ErrInvalid, in)
		require.ErrorContains(t, err, "want pebble, file, memory, rbd", in)
	}
}

func TestFileVolumeRaw(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(path, make([]byte, 10000), 0o644))
	v, err := OpenFileVolume(path, 512)
	require.NoError(t, err)
	require.Equal(t, int64(9728), v.Size()) // rounded down to the block size
	p := bytes.Repeat([]byte{9}, 1024)
	_, err = v.WriteAtFUA(p, 512)
	require.NoError(t, err)
	require.NoError(t, v.WriteZeroes(1024, 512))
	require.NoError(t, v.Resize(2048))
	require.NoError(t, v.Resize(4096))
	got := make([]byte, 4096)
	_, err = v.ReadAt(got, 0)
	require.NoError(t, err)
	want := make([]byte, 4096)
	copy(want[512:1024], p)
	require.Equal(t, want, got)
	require.NoError(t, v.Close())
	_, err = OpenFileVolume(t.TempDir(), 512)
	require.Error(t, err, "a directory is not a volume")
}
