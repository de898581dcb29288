package block

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/gosrp/gosrp/internal/enum"
)

// DefaultBlockSize is the block size used when a caller passes 0.
const DefaultBlockSize = 4096

// Volume is a fixed-block-size virtual disk.
//
// Every request must be block-aligned (offset and length multiples of
// BlockSize), non-empty and inside [0, Size()); otherwise it fails with
// ErrMisaligned, ErrZeroLength or ErrOutOfRange and nothing is changed.
// ReadAt and WriteAt are all-or-nothing: they return len(p) and nil, or 0 and
// an error. A Volume is safe for concurrent use by many goroutines;
// overlapping concurrent writes land in some order, block by block.
//
// Durability: a WriteAt, Discard or WriteZeroes is visible to reads when it
// returns but is durable (survives a crash of the process or the machine)
// only once a later Flush has returned. WriteAtFUA is durable when it returns.
// Resize is durable when it returns.
type Volume interface {
	io.ReaderAt
	io.WriterAt
	// Name returns the volume name (for a snapshot, "volume@snapshot").
	Name() string
	// Size returns the current size in bytes, a multiple of BlockSize.
	Size() int64
	// BlockSize returns the block size in bytes (512 or 4096).
	BlockSize() int
	// WriteAtFUA is WriteAt that returns only once the data is durable.
	WriteAtFUA(p []byte, off int64) (int, error)
	// Flush makes every write that returned before Flush was called durable.
	Flush() error
	// Discard deallocates a range; the range reads as zeros afterwards.
	Discard(off, length int64) error
	// WriteZeroes makes a range read as zeros without transferring zero blocks.
	WriteZeroes(off, length int64) error
	// Resize changes the size; blocks cut off by a shrink are dropped, so
	// growing again exposes zeros.
	Resize(newSize int64) error
	// Caps reports which optional operations this volume really performs.
	Caps() Caps
	// Close releases the handle; later calls return ErrClosed.
	Close() error
}

// Caps is a bit set of the optional operations a volume supports. A backend
// reports only what it really does; the matching call on a volume without the
// bit returns an error wrapping ErrUnsupported (or ErrReadOnly).
type Caps uint32

// Capability bits.
const (
	// CapFlush means Flush reaches stable storage.
	CapFlush Caps = 1 << iota
	// CapFUA means WriteAtFUA is durable on return.
	CapFUA
	// CapDiscard means Discard deallocates storage.
	CapDiscard
	// CapWriteZeroes means WriteZeroes zeroes without writing zero blocks.
	CapWriteZeroes
	// CapResize means Resize works.
	CapResize
	// CapSnapshot means the volume's store can snapshot it (see Snapshotter).
	CapSnapshot
	// CapPersistent means data outlives the process (false for memory volumes).
	CapPersistent
	// CapImmediate means I/O completes in memory without waiting for a
	// device, a sync or a compaction (memory volumes), so a server may run
	// it on its event loop instead of handing it to a worker.
	CapImmediate
)

var capNames = []string{"flush", "fua", "discard", "write-zeroes", "resize", "snapshot", "persistent", "immediate"}

// Has reports whether every bit of x is set in c.
func (c Caps) Has(x Caps) bool { return c&x == x }

// String lists the capability names, e.g. "flush|fua|discard".
func (c Caps) String() string { return enum.Flags(capNames, c) }

// VolumeInfo describes a volume as List returns it.
type VolumeInfo struct {
	Name       string
	Size       int64
	BlockSize  int
	Created    time.Time
	Generation uint64 // bumped by every metadata change (resize, snapshot)
	// Identity is what the volume's handles report as Identity, from
	// a store whose volumes outlive its process; 0 from one whose do
	// not (the memory store), which a restart makes anew under the
	// same name. A volume deleted and created again under its name has
	// another (target.VolumeInfo.Identity).
	Identity uint64
}

// SnapshotInfo describes a snapshot as Snapshots returns it.
type SnapshotInfo struct {
	Volume    string
	Name      string
	Size      int64
	BlockSize int
	Created   time.Time
}

// Store is a collection of named volumes in one backend; the daemon picks a
// backend by name with OpenStore.
type Store interface {
	// Create makes a new zero-filled volume and opens it. blockSize 0 means DefaultBlockSize.
	Create(name string, size int64, blockSize int) (Volume, error)
	// Open opens an existing volume; several handles may be open at once.
	Open(name string) (Volume, error)
	// List returns every volume, sorted by name.
	List() ([]VolumeInfo, error)
	// Delete removes a volume and its snapshots; it fails with ErrBusy while open.
	Delete(name string) error
	// Close closes the store and every volume handle still open.
	Close() error
}

// Snapshotter is implemented by stores that take point-in-time snapshots.
type Snapshotter interface {
	// Snapshot freezes the current content of a volume under a new name.
	Snapshot(volume, snap string) (SnapshotInfo, error)
	// Snapshots lists a volume's snapshots, sorted by name.
	Snapshots(volume string) ([]SnapshotInfo, error)
	// OpenSnapshot opens a snapshot as a read-only Volume (writes fail with ErrReadOnly).
	OpenSnapshot(volume, snap string) (Volume, error)
	// DeleteSnapshot removes a snapshot; it fails with ErrBusy while open.
	DeleteSnapshot(volume, snap string) error
	// DeleteIfNoSnapshots is Store.Delete for a volume without snapshots;
	// one that has any is kept and the call fails with ErrHasSnapshots.
	// The store decides under the lock its Snapshot takes, so a snapshot
	// taken at the same moment is either refused or kept, never deleted
	// unseen (a look at Snapshots before Delete cannot promise that).
	DeleteIfNoSnapshots(name string) error
	// Clone creates a new writable volume whose initial content is a snapshot.
	Clone(volume, snap, newName string) (Volume, error)
}

// Backends are the canonical names of the stores this package has, as
// ParseBackend returns them: "rbd" is opened with OpenRBDStore (and only
// in a build with Ceph support, RBDSupported), the others with OpenStore.
var Backends = []string{"pebble", "file", "memory", "rbd"}

// ParseBackend returns the canonical name of the backend a user named:
// "" is "pebble" and "mem" is "memory". Any other name outside Backends
// fails with ErrInvalid, naming those there are.
func ParseBackend(kind string) (string, error) {
	switch kind {
	case "":
		return "pebble", nil
	case "mem":
		return "memory", nil
	}
	if slices.Contains(Backends, kind) {
		return kind, nil
	}
	return "", fmt.Errorf("block: backend %q (want %s): %w", kind, strings.Join(Backends, ", "), ErrInvalid)
}

// OpenStore opens a store by backend name (ParseBackend): "pebble" (the
// default when kind is empty) and "file" take a directory, "memory"
// ignores dir; "rbd" needs OpenRBDStore's options.
func OpenStore(kind, dir string) (Store, error) {
	name, err := ParseBackend(kind)
	if err != nil {
		return nil, err
	}
	// A failed open returns a nil Store, not a nil *PebbleStore or
	// *FileStore inside a non-nil interface that a caller's cleanup would
	// then try to close.
	switch name {
	case "pebble":
		s, err := OpenPebbleStore(dir, nil)
		if err != nil {
			return nil, err
		}
		return s, nil
	case "file":
		s, err := OpenFileStore(dir)
		if err != nil {
			return nil, err
		}
		return s, nil
	case "memory":
		return NewMemStore(), nil
	default:
		return nil, fmt.Errorf("block: backend %q: open it with OpenRBDStore: %w", name, ErrInvalid)
	}
}
