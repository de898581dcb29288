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

	"github.com/gosrp/gosrp/internal/durable"
)

// dirtyDir holds the volumes' dirty marks in the data directory: one
// file per volume that may hold writes acknowledged but not flushed
// (target.DirtyMarks), named for the SHA-256 of the volume's name (a
// name may be longer than a file name may be) and holding the name and
// the boot ID of the kernel it was written under.
const dirtyDir = "dirty"

// bootIDFile names the running kernel's boot (random(4)).
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// dirtyMarks is target.DirtyMarks over dirtyDir. A mark is written with
// durable.WriteFile (file and directory synced), once per volume and flush:
// the first write after a flush waits for it.
//
// processSafe says the backend hands every write to the kernel before
// it is acknowledged (the file backend's pwrite): killing srpd then
// loses nothing, only the machine going down does. A mark left under the
// boot still running is then no loss, and is dropped unreported, so that
// a host's file system does not see a write error after every restart
// of srpd. pebble's WAL writer and librbd's cache hold writes in the
// process for moments, so their marks are always reported.
type dirtyMarks struct {
	dir         string
	boot        string
	processSafe bool
}

func openDirtyMarks(data string, processSafe bool) (*dirtyMarks, error) {
	d := &dirtyMarks{dir: filepath.Join(data, dirtyDir), processSafe: processSafe}
	if b, err := os.ReadFile(bootIDFile); err == nil {
		d.boot = strings.TrimSpace(string(b))
	}
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
// durable.WriteFile (*.tmp) are no marks: the write they were for had not
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
		path := filepath.Join(d.dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		name, boot, _ := strings.Cut(string(b), "\n")
		if d.path(name) != path {
			return nil, fmt.Errorf("%s: not a dirty mark of this srpd (its content does not match its name)", path)
		}
		if d.processSafe && d.boot != "" && boot == d.boot {
			if err := os.Remove(path); err != nil {
				return nil, err
			}
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

func (d *dirtyMarks) MarkDirty(volume string) error {
	return durable.WriteFile(d.path(volume), []byte(volume+"\n"+d.boot), 0o600)
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
