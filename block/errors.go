package block

import (
	"errors"
	"syscall"
)

// Sentinel errors. Every error a volume or store returns wraps exactly one of
// these (test with errors.Is) together with the volume name and the request
// that failed, so a caller can map it to a SCSI/NVMe status without parsing
// text.
var (
	// ErrOutOfRange reports a request that reaches beyond the end of a volume.
	ErrOutOfRange = errors.New("block: out of range")
	// ErrMisaligned reports an offset or length that is not a multiple of the block size.
	ErrMisaligned = errors.New("block: misaligned request")
	// ErrZeroLength reports a request of zero bytes.
	ErrZeroLength = errors.New("block: zero-length request")
	// ErrClosed reports a call on a closed volume or store.
	ErrClosed = errors.New("block: closed")
	// ErrReadOnly reports a write to a read-only volume (a snapshot).
	ErrReadOnly = errors.New("block: read-only volume")
	// ErrNotFound reports a volume or snapshot that does not exist.
	ErrNotFound = errors.New("block: not found")
	// ErrExists reports a create whose volume or snapshot name is taken.
	ErrExists = errors.New("block: already exists")
	// ErrBusy reports a delete of a volume or snapshot that is still open.
	ErrBusy = errors.New("block: in use")
	// ErrHasSnapshots reports a DeleteIfNoSnapshots of a volume that has
	// snapshots.
	ErrHasSnapshots = errors.New("block: volume has snapshots")
	// ErrUnsupported reports an operation the backend cannot perform; see Caps.
	ErrUnsupported = errors.New("block: unsupported operation")
	// ErrInvalid reports a bad argument: a bad name, block size or volume size.
	ErrInvalid = errors.New("block: invalid argument")
	// ErrNoSpace reports a write the backend has no memory or space left
	// to store, or a volume size beyond the overcommit bound. It matches
	// syscall.ENOSPC too (errors.Is), so layers that do not import block
	// (the target) recognise it.
	ErrNoSpace error = noSpaceError{}
	// ErrOvercommit reports a volume size refused by the overcommit
	// bound (PebbleOptions.MaxOvercommit), not by the space left: a
	// smaller size may go through where any write would not. It is
	// ErrNoSpace too (errors.Is).
	ErrOvercommit error = overcommitError{}
	// ErrFenced reports I/O on a volume that another client took away
	// (rbd: it broke this client's exclusive lock, which blocklisted it,
	// or holds the lock itself): nothing this handle writes reaches the
	// volume any more. It matches syscall.ESHUTDOWN too (errors.Is), the
	// errno Ceph gives a blocklisted client.
	ErrFenced error = fencedError{}
	// ErrCorrupt reports a stored record that cannot be decoded or is inconsistent.
	ErrCorrupt = errors.New("block: corrupt record")
	// ErrFormatVersion reports a store or record written by a newer format than this code reads.
	ErrFormatVersion = errors.New("block: unsupported format version")
)

// noSpaceError is ErrNoSpace's type: comparable, so errors.Is finds the one
// value, and Is-able as syscall.ENOSPC.
type noSpaceError struct{}

func (noSpaceError) Error() string { return "block: no space" }

// Is makes errors.Is(ErrNoSpace, syscall.ENOSPC) true.
func (noSpaceError) Is(target error) bool { return target == syscall.ENOSPC }

// overcommitError is ErrOvercommit's type, Is-able as ErrNoSpace and
// whatever ErrNoSpace is; its text is ErrNoSpace's.
type overcommitError struct{}

func (overcommitError) Error() string { return noSpaceError{}.Error() }

// Is makes errors.Is(ErrOvercommit, ErrNoSpace) true.
func (overcommitError) Is(target error) bool { return errors.Is(ErrNoSpace, target) }

// fencedError is ErrFenced's type, Is-able as syscall.ESHUTDOWN.
type fencedError struct{}

func (fencedError) Error() string { return "block: fenced (another client owns the volume)" }

// Is makes errors.Is(ErrFenced, syscall.ESHUTDOWN) true.
func (fencedError) Is(target error) bool { return target == syscall.ESHUTDOWN }
