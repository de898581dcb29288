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
// pebble creates made private (privateFileMode, privateDirMode).
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
		return f, nil
	}
}
