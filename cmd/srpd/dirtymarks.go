package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// dirtyDir holds the volumes' dirty marks in the data directory: one
// file per volume that may hold writes acknowledged but not flushed
// (target.DirtyMarks), named for the SHA-256 of the volume's name (a
// name may be longer than a file name may be) and holding the name.
const dirtyDir = "dirty"

// dirtyMarks is target.DirtyMarks over dirtyDir. A mark is written with
// writeDurable (file and directory synced), once per volume and flush:
// the first write after a flush waits for it.
type dirtyMarks struct{ dir string }

func openDirtyMarks(data string) (*dirtyMarks, error) {
	d := &dirtyMarks{dir: filepath.Join(data, dirtyDir)}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return nil, fmt.Errorf("dirty marks: %w", err)
	}
	return d, nil
}

func (d *dirtyMarks) path(volume string) string {
	sum := sha256.Sum256([]byte(volume))
	return filepath.Join(d.dir, hex.EncodeToString(sum[:]))
}

// DirtyVolumes lists the marked volumes. Leftovers of an interrupted
// writeDurable (*.tmp) are no marks: the write they were for had not
// started.
func (d *dirtyMarks) DirtyVolumes() ([]string, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(d.dir, e.Name()))
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if d.path(string(b)) != filepath.Join(d.dir, e.Name()) {
			return nil, fmt.Errorf("%s: not a dirty mark of this srpd (its content does not match its name)", filepath.Join(d.dir, e.Name()))
		}
		names = append(names, string(b))
	}
	return names, nil
}

func (d *dirtyMarks) MarkDirty(volume string) error {
	return writeDurable(d.path(volume), []byte(volume))
}

func (d *dirtyMarks) ClearDirty(volume string) error {
	if err := os.Remove(d.path(volume)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// clearAll forgets every mark, once the store has been closed cleanly:
// every write it acknowledged is in it.
func (d *dirtyMarks) clearAll() error {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(d.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
