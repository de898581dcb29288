package main

import (
	"os"
	"path/filepath"
)

// writeDurable replaces the file at path with b (mode 0600) so that a
// crash leaves the old contents or the new, and the new are on stable
// storage when it returns: written to a temporary file and fsynced,
// renamed over path, then the directory fsynced, which makes the rename
// itself durable (fsync(2): syncing a file does not sync the directory
// entry that names it).
func writeDurable(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
