// Package durable replaces small files so that a crash leaves either
// their old contents or their new ones, never a mix, and the new ones
// are on stable storage when the call returns. srpd keeps its state this
// way (the ACL, reservations, LUN numbers, dirty marks) and the file
// store its volumes' metadata.
//
// The recipe is the classic one: write a temporary file beside the
// target and fsync it, rename it over the target, then fsync the
// directory. The last step is the one programs forget: fsync(2) of a
// file does not make the directory entry that names it durable, so
// after a power loss the rename itself may be gone (ext4's and XFS's
// documentation say so; so does LWN's "Ensuring data reaches disk").
//
//	if err := durable.WriteFile(path, b, 0o600); err != nil { ... }
//
// Callers serialize the writes of one path: the temporary file's name is
// the path's with ".tmp" added.
package durable

import (
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with b, created with perm if it is
// new, durably and atomically (the package doc).
func WriteFile(path string, b []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the entries of dir durable: what was created, renamed
// or removed in it before the call survives a crash after it.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
