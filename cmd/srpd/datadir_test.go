package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDataDirPrivate: under umask 022 srpd creates its data directory,
// and pebble its files, for the daemon's user alone; an existing
// directory open to others is kept, with a warning.
func TestDataDirPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, backend := range []string{"pebble", "file"} {
		t.Run(backend, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			s, err := openStore(backend, dir, log, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if perm := fi.Mode().Perm(); perm != 0o700 {
				t.Errorf("new data directory is %#o, want 0700", perm)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if fi, err := e.Info(); err == nil && fi.Mode().Perm()&0o077 != 0 {
					t.Errorf("%s is %v", e.Name(), fi.Mode())
				}
			}
		})
	}
	open := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	if err := makeDataDir(open, log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "open to other users") {
		t.Errorf("no warning for a data directory of mode 0755; log:\n%s", logs.String())
	}
}
