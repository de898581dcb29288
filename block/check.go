package block

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"syscall"
)

// maxNameLen bounds volume and snapshot names; they are stored in keys and
// file names.
const maxNameLen = 200

// maxBlocks bounds a volume's block count so that offsets and block indexes
// never overflow an int64.
const maxBlocks = math.MaxInt64 / 4096

// checkName rejects names that cannot be used as a key component or a file
// name: empty, too long, a path element, or containing '/', '@', NUL or
// control characters ('@' separates a volume from its snapshot in Name).
func checkName(what, name string) error {
	if name == "" || len(name) > maxNameLen || name == "." || name == ".." {
		return fmt.Errorf("block: %s name %q: want 1..%d bytes, not . or ..: %w", what, name, maxNameLen, ErrInvalid)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '/' || c == '@' || c == '\\' {
			return fmt.Errorf("block: %s name %q: byte %#x not allowed (no '/', '@', '\\' or control characters): %w", what, name, c, ErrInvalid)
		}
	}
	return nil
}

// CheckName reports whether name can name a volume, or a snapshot in
// the "volume@snapshot" form a target serves it under (an ACL rule
// names either): each part follows the rules of a store's names.
func CheckName(name string) error {
	vol, snap, isSnap := strings.Cut(name, "@")
	if err := checkName("volume", vol); err != nil {
		return err
	}
	if isSnap {
		return checkName("snapshot", snap)
	}
	return nil
}

// normBlockSize maps 0 to DefaultBlockSize and rejects anything but 512 and 4096.
func normBlockSize(bs int) (int, error) {
	switch bs {
	case 0:
		return DefaultBlockSize, nil
	case 512, 4096:
		return bs, nil
	}
	return 0, fmt.Errorf("block: block size %d: want 512 or 4096: %w", bs, ErrInvalid)
}

// checkSize validates a volume size for a block size.
func checkSize(name string, size int64, bs int) error {
	if size < 0 || size%int64(bs) != 0 || size/int64(bs) > maxBlocks {
		return fmt.Errorf("block: volume %q: size %d: want a non-negative multiple of %d: %w", name, size, bs, ErrInvalid)
	}
	return nil
}

// checkIO validates a request against a volume of the given size and block
// size; op names the request in the error ("read", "write", "discard", ...).
func checkIO(name, op string, off, n int64, size int64, bs int) error {
	switch {
	case n == 0:
		return fmt.Errorf("block: volume %q: %s %d bytes at %d: %w", name, op, n, off, ErrZeroLength)
	case off%int64(bs) != 0 || n%int64(bs) != 0:
		return fmt.Errorf("block: volume %q: %s %d bytes at %d (block size %d): %w", name, op, n, off, bs, ErrMisaligned)
	case off < 0 || n < 0 || off > size || n > size-off:
		return fmt.Errorf("block: volume %q: %s %d bytes at %d (size %d): %w", name, op, n, off, size, ErrOutOfRange)
	}
	return nil
}

// writeOp names a write in errors: "write", or "write-fua" for one that
// must be durable before it completes.
func writeOp(fua bool) string {
	if fua {
		return "write-fua"
	}
	return "write"
}

// ioErr wraps err with the request context.
func ioErr(name, op string, n, off int64, err error) error {
	return fmt.Errorf("block: volume %q: %s %d bytes at %d: %w", name, op, n, off, noSpace(err))
}

// noSpace adds ErrNoSpace to an ENOSPC from the OS (a pwrite or fdatasync
// of the file backend), so that callers see the sentinel, not an errno.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, ErrNoSpace) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

// checkCreate validates the arguments every backend's Create takes and
// returns the block size to use.
func checkCreate(name string, size int64, blockSize int) (int, error) {
	bs, err := normBlockSize(blockSize)
	if err != nil {
		return 0, err
	}
	if err := checkName("volume", name); err != nil {
		return 0, err
	}
	if err := checkSize(name, size, bs); err != nil {
		return 0, err
	}
	return bs, nil
}
