package block

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/gosrp/gosrp/internal/msgpackcheck"
	"github.com/vmihailenco/msgpack/v5"
)

// formatVersion is the on-disk format this code writes and the newest it
// reads. Bump it on any incompatible change to keys or records; older code
// then refuses the store with ErrFormatVersion instead of misreading it.
const formatVersion = 1

// maxRecordLen bounds a metadata record before it is decoded, so a corrupt
// length prefix inside cannot make the decoder allocate without limit.
const maxRecordLen = 1 << 16

// maxLayers bounds a snapshot chain in a decoded record.
const maxLayers = 1 << 12

// storeMeta is the store-wide record (pebble key keyFormat): written once at
// creation and checked at every open.
type storeMeta struct {
	Format  int   `msgpack:"format"`
	Created int64 `msgpack:"created"` // Unix nanoseconds
}

// volumeMeta is a volume's record (pebble key keyVolume+name; the file
// backend's NAME.meta file). Snapshots use the same record with Snapshot set.
type volumeMeta struct {
	Format     int    `msgpack:"format"`
	Name       string `msgpack:"name"`
	Snapshot   string `msgpack:"snapshot,omitempty"`
	Size       int64  `msgpack:"size"`
	BlockSize  int    `msgpack:"block_size"`
	Created    int64  `msgpack:"created"` // Unix nanoseconds
	Generation uint64 `msgpack:"generation"`
	// Layers is the pebble backend's layer chain, newest first: a read of a
	// block looks in Layers[0], then Layers[1], ... (see doc.go). Empty for
	// the file backend.
	Layers []uint64 `msgpack:"layers,omitempty"`
}

// volumeIdentity is the identity (Volume.Identity) of the volume, or
// snapshot snap of it, named name and created at created (Unix
// nanoseconds, or a backend's own unique stamp): a volume made again
// under the same name is made at another time.
func volumeIdentity(name, snap string, created int64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(snap))
	h.Write([]byte{0})
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(created)))
	return max(h.Sum64(), 1) // 0 means none
}

// formatHeader decodes only the version, so a record from a newer format
// whose other fields changed type is still reported as a version problem.
type formatHeader struct {
	Format int `msgpack:"format"`
}

func encodeRecord(v any) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		// Marshal of these plain structs cannot fail; a failure is a bug.
		panic(fmt.Sprintf("block: encode %T: %v", v, err))
	}
	return b
}

// decodeRecord decodes a msgpack record into v after checking its size and
// format version. what names the record in errors. It never panics on bad
// bytes.
func decodeRecord(what string, b []byte, v any) (err error) {
	defer func() {
		// msgpack is not documented as panic-free on hostile input; a
		// metadata record is hostile input after a disk fault.
		if r := recover(); r != nil {
			err = fmt.Errorf("block: %s: decode: %v: %w", what, r, ErrCorrupt)
		}
	}()
	if len(b) == 0 || len(b) > maxRecordLen {
		return fmt.Errorf("block: %s: record of %d bytes: %w", what, len(b), ErrCorrupt)
	}
	if err := msgpackcheck.Check(b); err != nil {
		return fmt.Errorf("block: %s: %v: %w", what, err, ErrCorrupt)
	}
	var h formatHeader
	if err := msgpack.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("block: %s: %v: %w", what, err, ErrCorrupt)
	}
	switch {
	case h.Format > formatVersion:
		return fmt.Errorf("block: %s: format %d, this code reads up to %d: %w", what, h.Format, formatVersion, ErrFormatVersion)
	case h.Format < 1:
		return fmt.Errorf("block: %s: format %d: %w", what, h.Format, ErrCorrupt)
	}
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("block: %s: %v: %w", what, err, ErrCorrupt)
	}
	return nil
}

// decodeVolumeMeta decodes and validates a volume or snapshot record;
// wantName and wantSnap are the names its key says it has ("" for
// wantSnap on a volume record).
func decodeVolumeMeta(b []byte, wantName, wantSnap string) (*volumeMeta, error) {
	what := fmt.Sprintf("volume %q metadata", wantName)
	if wantSnap != "" {
		what = fmt.Sprintf("snapshot %q of volume %q metadata", wantSnap, wantName)
	}
	m := new(volumeMeta)
	if err := decodeRecord(what, b, m); err != nil {
		return nil, err
	}
	if len(m.Layers) == 0 {
		m.Layers = nil // one representation for "no layers"
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("block: %s: %v: %w", what, err, ErrCorrupt)
	}
	if m.Name != wantName || m.Snapshot != wantSnap {
		return nil, fmt.Errorf("block: %s: record names %q@%q: %w", what, m.Name, m.Snapshot, ErrCorrupt)
	}
	return m, nil
}

// validate checks the invariants every stored record must satisfy.
func (m *volumeMeta) validate() error {
	if err := checkName("volume", m.Name); err != nil {
		return err
	}
	if m.Snapshot != "" {
		if err := checkName("snapshot", m.Snapshot); err != nil {
			return err
		}
	}
	if m.BlockSize != 512 && m.BlockSize != 4096 {
		return fmt.Errorf("block size %d", m.BlockSize)
	}
	if err := checkSize(m.Name, m.Size, m.BlockSize); err != nil {
		return err
	}
	if len(m.Layers) > maxLayers {
		return fmt.Errorf("%d layers", len(m.Layers))
	}
	seen := make(map[uint64]bool, len(m.Layers))
	for _, l := range m.Layers {
		if l == 0 || l >= maxLayerID || seen[l] {
			return fmt.Errorf("bad layer chain %v", m.Layers)
		}
		seen[l] = true
	}
	return nil
}

func (m *volumeMeta) info() VolumeInfo {
	return VolumeInfo{Name: m.Name, Size: m.Size, BlockSize: m.BlockSize, Created: time.Unix(0, m.Created), Generation: m.Generation,
		Identity: volumeIdentity(m.Name, m.Snapshot, m.Created)}
}

func (m *volumeMeta) snapInfo() SnapshotInfo {
	return SnapshotInfo{Volume: m.Name, Name: m.Snapshot, Size: m.Size, BlockSize: m.BlockSize, Created: time.Unix(0, m.Created)}
}
