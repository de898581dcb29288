package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gosrp/gosrp/internal/e2etest"
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

// TestStoreOpenErrors: "in use by another srpd" is said only when the
// store's lock is held, by another srpd process or by this one. A store
// that fails to open for any other reason (here, a CURRENT file that is
// not pebble's) is reported as what it is. Every pebble error used to be
// called "in use" (a read-only file system, --data /sys/kernel), because
// the check looked for "lock" in the message and "block: pebble store"
// contains it.
func TestStoreOpenErrors(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("held", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		s, err := openStore("pebble", dir, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := openStore("pebble", dir, log, nil); err == nil || !strings.Contains(err.Error(), "in use by another srpd") {
			t.Fatalf("second open of a held store: %v, want \"in use by another srpd\"", err)
		}
	})
	t.Run("not-a-store", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "CURRENT"), []byte("not a manifest name\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := openStore("pebble", dir, log, nil)
		if err == nil {
			t.Fatal("a store with a bogus CURRENT opened")
		}
		if strings.Contains(err.Error(), "in use") {
			t.Fatalf("a store that is not pebble's is reported as %q", err)
		}
	})
	// Every backend: the file and memory backends have no lock of their
	// own, and a second srpd on one file-backend directory once served
	// its volumes beside the first (srpd.lock, datalock.go).
	for _, backend := range []string{"pebble", "file", "memory"} {
		t.Run("other-process/"+backend, func(t *testing.T) {
			srpd, _ := e2etest.Binaries(t)
			data := filepath.Join(t.TempDir(), "data")
			e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), "", "--backend", backend)
			for _, second := range []string{backend, "pebble"} {
				r := e2etest.Run(t, nil, srpd, "--data", data, "--listen", e2etest.FreeAddr(t), "--backend", second)
				if r.Code == 0 || !strings.Contains(r.Stderr, "in use by another srpd") {
					t.Fatalf("a second srpd (--backend %s) on the data directory of a %s one: exit %d, %q; want \"in use by another srpd\"", second, backend, r.Code, r.Stderr)
				}
			}
		})
	}
}

// TestOfflineAdminBackend: with no srpd running, an admin command works
// on the store of the backend that last served the directory: a file
// backend's volumes are listed and a volume created among them (it once
// opened a pebble store there, listed nothing, and created a volume srpd
// never saw); a memory backend's directory is refused in one line.
func TestOfflineAdminBackend(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	d := e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), "", "--backend", "file", "--default-volume-size", "8MiB")
	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exit %d", code)
	}
	e2etest.MustRun(t, srpd, "volume", "create", "--data", data, "--size", "4MiB", "extra")
	d = e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), "", "--backend", "file")
	r := e2etest.MustRun(t, srpd, "volume", "list", "--data", data)
	if !strings.Contains(r.Stdout, "extra") || !strings.Contains(r.Stdout, "vol0") {
		t.Fatalf("srpd --backend file after an offline create lists:\n%s", r.Stdout)
	}
	if _, err := os.Stat(filepath.Join(data, "CURRENT")); err == nil {
		t.Fatal("the offline command made a pebble store in a file-backend directory")
	}
	d.Stop(t)

	mem := filepath.Join(t.TempDir(), "mem")
	d = e2etest.StartDaemon(t, srpd, mem, e2etest.FreeAddr(t), "", "--backend", "memory")
	d.Stop(t)
	r = e2etest.Run(t, nil, srpd, "volume", "list", "--data", mem)
	if r.Code != 1 || !strings.Contains(r.Stderr, "memory-backend store, which only a running srpd can change") {
		t.Fatalf("offline volume list of a memory-backend directory: exit %d, %q", r.Code, r.Stderr)
	}
}

// TestDataLockRecord: the lock file records the backend exactly, whatever
// it said before, and a record that already says so is not rewritten (a
// start on a full disk must not fail over it).
func TestDataLockRecord(t *testing.T) {
	dir := t.TempDir()
	l, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, b := range []string{"pebble", "file", "pebble", "memory"} {
		if err := l.setBackend(b); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, dataLockFile))
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) != b+"\n" || l.backend() != b {
			t.Fatalf("after recording %q the file holds %q", b, raw)
		}
	}
	st, _ := os.Stat(filepath.Join(dir, dataLockFile))
	if err := os.Chmod(filepath.Join(dir, dataLockFile), 0o444); err != nil {
		t.Fatal(err)
	}
	ro, err := os.Open(filepath.Join(dir, dataLockFile))
	if err != nil {
		t.Fatal(err)
	}
	// The same backend again through a descriptor that cannot write.
	if err := (&dataLock{f: ro}).setBackend("memory"); err != nil {
		t.Fatalf("recording the backend the file already holds wrote to it: %v", err)
	}
	ro.Close()
	if st2, _ := os.Stat(filepath.Join(dir, dataLockFile)); !st2.ModTime().Equal(st.ModTime()) {
		t.Fatal("the record was rewritten")
	}
}
