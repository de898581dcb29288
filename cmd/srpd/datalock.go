package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gosrp/gosrp/block"
)

// dataLockFile is the data directory's lock: srpd, and an admin command
// that finds no srpd answering, hold it (flock) while they use the
// directory, so that two of them never share its store, access rules,
// reservations and dirty marks. pebble locks its own store too, but the
// file and memory backends have no lock of their own: two srpds on one
// file-backend directory once both served vol0, each taking writes and
// each granting an exclusive open. The file holds the backend of the
// srpd that last served the directory, for the admin commands.
const dataLockFile = "srpd.lock"

// dataLock is a held lock on a data directory.
type dataLock struct{ f *os.File }

// lockDataDir takes dir's lock, or says that another srpd holds it.
func lockDataDir(dir string) (*dataLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, dataLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data directory %s is in use by another srpd (%s is locked)", dir, dataLockFile)
		}
		return nil, fmt.Errorf("data directory %s: lock %s: %w", dir, dataLockFile, err)
	}
	return &dataLock{f: f}, nil
}

// setBackend records the backend serving the directory. A record that
// already says so is left alone, so that a start on a full disk does not
// fail over a write it does not need; a new one is written before the
// old is cut short, so a failed write never leaves the file empty (which
// offline commands would take for an older srpd's directory).
func (l *dataLock) setBackend(backend string) error {
	if l.backend() == backend {
		return nil
	}
	rec := []byte(backend + "\n")
	if _, err := l.f.WriteAt(rec, 0); err != nil {
		return err
	}
	return l.f.Truncate(int64(len(rec)))
}

// backend is the backend that last served the directory ("" if none
// recorded it: a directory of an older srpd, or never served).
func (l *dataLock) backend() string {
	b := make([]byte, 64)
	n, _ := l.f.ReadAt(b, 0)
	return strings.TrimSpace(string(b[:n]))
}

// canonicalBackend is --backend's value as the lock file records it
// (block.ParseBackend); a name block does not know is kept as it is, for
// the caller to refuse.
func canonicalBackend(b string) string {
	if name, err := block.ParseBackend(b); err == nil {
		return name
	}
	return b
}

// Close releases the lock.
func (l *dataLock) Close() error { return l.f.Close() }
