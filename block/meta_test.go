package block

import (
	"errors"
	"io"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// rawPebble opens a closed store's database directly, to damage it.
func rawPebble(t *testing.T, dir string, fn func(db *pebble.DB)) {
	db, err := pebble.Open(dir, &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{log.New(io.Discard, "", 0)},
	})
	require.NoError(t, err)
	fn(db)
	require.NoError(t, db.Close())
}

func newStoreWithVolume(t *testing.T) string {
	dir := t.TempDir()
	s, err := OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	v, err := s.Create("vol", 4096, 0)
	require.NoError(t, err)
	require.NoError(t, v.Close())
	_, err = s.Snapshot("vol", "snap")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	return dir
}

func TestPebbleBadMetadata(t *testing.T) {
	newer := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	for _, tc := range []struct {
		desc    string
		key     []byte
		val     []byte
		openErr error // from OpenPebbleStore
		volErr  error // from Open("vol")
	}{
		{desc: "garbage volume record", key: volumeKey("vol"), val: []byte{0xc1, 0xff, 0x00}, volErr: ErrCorrupt},
		{desc: "truncated volume record", key: volumeKey("vol"), val: encodeRecord(&volumeMeta{Format: 1, Name: "vol", Size: 4096, BlockSize: 4096, Layers: []uint64{1}})[:10], volErr: ErrCorrupt},
		{desc: "empty volume record", key: volumeKey("vol"), val: []byte{}, volErr: ErrCorrupt},
		{desc: "volume record of another name", key: volumeKey("vol"), val: encodeRecord(&volumeMeta{Format: 1, Name: "other", Size: 4096, BlockSize: 4096, Layers: []uint64{1}}), volErr: ErrCorrupt},
		{desc: "bad block size", key: volumeKey("vol"), val: encodeRecord(&volumeMeta{Format: 1, Name: "vol", Size: 4096, BlockSize: 1000, Layers: []uint64{1}}), volErr: ErrCorrupt},
		{desc: "no layers", key: volumeKey("vol"), val: encodeRecord(&volumeMeta{Format: 1, Name: "vol", Size: 4096, BlockSize: 4096}), volErr: ErrCorrupt},
		{desc: "no format", key: volumeKey("vol"), val: newer(map[string]any{"name": "vol"}), volErr: ErrCorrupt},
		{desc: "newer volume record", key: volumeKey("vol"), val: newer(map[string]any{"format": 2, "name": 42}), volErr: ErrFormatVersion},
		{desc: "newer store", key: keyFormat, val: newer(map[string]any{"format": 7}), openErr: ErrFormatVersion},
		{desc: "garbage store record", key: keyFormat, val: []byte("not msgpack at all"), openErr: ErrCorrupt},
		{desc: "bad layer counter", key: keyNextLayer, val: []byte{1, 2, 3}, openErr: ErrCorrupt},
		{desc: "layer counter below data", key: keyNextLayer, val: []byte{0, 0, 0, 0, 0, 0, 0, 1}, openErr: ErrCorrupt},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := newStoreWithVolume(t)
			// A block in layer 2 (the volume's top) makes the counter check bite.
			s, err := OpenPebbleStore(dir, nil)
			require.NoError(t, err)
			v, err := s.Open("vol")
			require.NoError(t, err)
			_, err = v.WriteAt(make([]byte, 4096), 0)
			require.NoError(t, err)
			require.NoError(t, v.Close())
			require.NoError(t, s.Close())
			rawPebble(t, dir, func(db *pebble.DB) { require.NoError(t, db.Set(tc.key, tc.val, pebble.Sync)) })

			s, err = OpenPebbleStore(dir, nil)
			if tc.openErr != nil {
				require.ErrorIs(t, err, tc.openErr)
				require.Contains(t, err.Error(), "block: ")
				t.Logf("%v", err)
				return
			}
			require.NoError(t, err)
			defer s.Close()
			_, err = s.Open("vol")
			require.ErrorIs(t, err, tc.volErr)
			require.Contains(t, err.Error(), `"vol"`)
			t.Logf("%v", err)
			_, err = s.List()
			require.ErrorIs(t, err, tc.volErr)
			// Deleting is refused too: layers are never dropped on a guess.
			require.Error(t, s.DeleteSnapshot("vol", "snap"))
			// The snapshot record is intact and still opens.
			sv, err := s.OpenSnapshot("vol", "snap")
			require.NoError(t, err)
			require.NoError(t, sv.Close())
		})
	}
}

func TestPebbleForeignDatabase(t *testing.T) {
	dir := t.TempDir()
	rawPebble(t, dir, func(db *pebble.DB) { require.NoError(t, db.Set([]byte("hello"), []byte("world"), pebble.Sync)) })
	_, err := OpenPebbleStore(dir, nil)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestPebbleCorruptBlock(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	v, err := s.Create("vol", 2*4096, 0)
	require.NoError(t, err)
	require.NoError(t, v.Close())
	require.NoError(t, s.Close())
	rawPebble(t, dir, func(db *pebble.DB) { require.NoError(t, db.Set(dataKey(1, 1), []byte("short"), pebble.Sync)) })
	s, err = OpenPebbleStore(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	v, err = s.Open("vol")
	require.NoError(t, err)
	defer v.Close()
	_, err = v.ReadAt(make([]byte, 4096), 4096)
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = v.ReadAt(make([]byte, 8192), 0)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestFileBadMetadata(t *testing.T) {
	for _, tc := range []struct {
		desc string
		val  []byte
		want error
	}{
		{"garbage", []byte{0xde, 0xad, 0xbe, 0xef}, ErrCorrupt},
		{"empty", nil, ErrCorrupt},
		{"newer", encodeRecord(map[string]any{"format": formatVersion + 1}), ErrFormatVersion},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenFileStore(dir)
			require.NoError(t, err)
			v, err := s.Create("vol", 4096, 0)
			require.NoError(t, err)
			require.NoError(t, v.Close())
			require.NoError(t, os.WriteFile(filepath.Join(dir, "vol.meta"), tc.val, 0o644))
			_, err = s.Open("vol")
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), `"vol"`)
			_, err = s.List()
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// FuzzDecodeVolumeMeta feeds arbitrary bytes to the metadata decoder: it
// must never panic, and whatever it accepts must be valid and survive a
// round trip. Run with: go test -fuzz=FuzzDecodeVolumeMeta ./block
func FuzzDecodeVolumeMeta(f *testing.F) {
	f.Add(encodeRecord(&volumeMeta{Format: 1, Name: "vol", Size: 4096, BlockSize: 4096, Layers: []uint64{3, 1}}))
	f.Add(encodeRecord(&volumeMeta{Format: 1, Name: "vol", Snapshot: "s", Size: 0, BlockSize: 512, Layers: []uint64{1}}))
	f.Add(encodeRecord(map[string]any{"format": 2}))
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}) // array of 4G elements
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, snap := range []string{"", "s"} {
			m, err := decodeVolumeMeta(b, "vol", snap)
			if err != nil {
				if !(errors.Is(err, ErrCorrupt) || errors.Is(err, ErrFormatVersion)) {
					t.Fatalf("error %v wraps neither ErrCorrupt nor ErrFormatVersion", err)
				}
				continue
			}
			if err := m.validate(); err != nil {
				t.Fatalf("accepted an invalid record: %v", err)
			}
			m2, err := decodeVolumeMeta(encodeRecord(m), "vol", snap)
			require.NoError(t, err)
			require.Equal(t, m, m2)
		}
		var sm storeMeta
		_ = decodeRecord("store", b, &sm)
	})
}
