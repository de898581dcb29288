package block

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Modes of what a store creates on disk: the owner's alone, whatever the
// umask. A store's files are its volumes' data; pebble creates files
// 0666 and directories 0755 less the umask, which under the usual 022
// lets every local user read them.
const (
	privateDirMode  os.FileMode = 0o700
	privateFileMode os.FileMode = 0o600
)

// privateFS is the disk as pebble sees it, with every file and directory
// pebble creates made private (privateFileMode, privateDirMode), and no
// space reserved ahead of writes (unreservedFile).
type privateFS struct{ vfs.FS }

func (fs privateFS) MkdirAll(dir string, _ os.FileMode) error {
	return fs.FS.MkdirAll(dir, privateDirMode)
}

func (fs privateFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(name)(fs.FS.Create(name, category))
}

func (fs privateFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return private(name)(fs.FS.OpenReadWrite(name, category, opts...))
}

func (fs privateFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(newname)(fs.FS.ReuseForWrite(oldname, newname, category))
}

func (fs privateFS) Lock(name string) (io.Closer, error) {
	c, err := fs.FS.Lock(name)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, privateFileMode); err != nil {
		return nil, errors.Join(fmt.Errorf("block: make %s private: %w", name, err), c.Close())
	}
	return c, nil
}

// private returns a function that makes the file name, just opened or
// created as f, private; on failure it closes f.
func private(name string) func(f vfs.File, err error) (vfs.File, error) {
	return func(f vfs.File, err error) (vfs.File, error) {
		if err != nil {
			return nil, err
		}
		if err := os.Chmod(name, privateFileMode); err != nil {
			return nil, errors.Join(fmt.Errorf("block: make %s private: %w", name, err), f.Close())
		}
		return unreservedFile{f}, nil
	}
}

// unreservedFile is a pebble file whose Preallocate does nothing.
//
// Pebble preallocates each WAL (fallocate with FALLOC_FL_KEEP_SIZE) to
// 110% of MemTableSize, whatever the memtable it logs: DB.walPreallocateSize
// in pebble, after RocksDB's GetWalPreallocateBlockSize. A store's first
// memtables are small (pebble doubles them up to MemTableSize), so a fresh
// store rotates its WAL every few MiB of writes, and every new WAL took
// 141 MiB at the default 128 MiB memtable; recycled WALs keep theirs. A
// pebble srpd on a 640 MiB tmpfs held 576 MiB after mkfs.ext4 of a
// 128 MiB volume and refused the host's next writes for space
// (test/rxe/srp-guest.sh). Space the store never wrote is space the guard
// (space.go) cannot account for, and on tmpfs it is memory.
//
// Little is lost: on ext4 and XFS, writing into a preallocated extent
// converts it from unwritten to written, a journaled metadata change, so
// the fdatasync after a WAL append commits metadata either way. What
// makes WAL syncs cheap is recycling, which pebble still does (a reused
// WAL is overwritten in place, within its old size).
type unreservedFile struct{ vfs.File }

// Preallocate reserves nothing; see unreservedFile.
func (unreservedFile) Preallocate(offset, length int64) error { return nil }
