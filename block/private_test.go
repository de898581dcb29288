package block

import (
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
)

// TestStoresArePrivate: under the usual umask 022, a store's directory
// and every file in it are the owner's alone, since they hold volume
// data; pebble's defaults (0755, 0644) let any local user read them.
func TestStoresArePrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	for _, kind := range []string{"pebble", "file"} {
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			s, err := OpenStore(kind, dir)
			if err != nil {
				t.Fatal(err)
			}
			v, err := s.Create("v", 1<<20, 4096)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			buf[0] = 1
			if _, err := v.WriteAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if err := v.Flush(); err != nil {
				t.Fatal(err)
			}
			v.Close()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			n := 0
			err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := d.Info()
				if err != nil {
					return err
				}
				n++
				if perm := fi.Mode().Perm(); perm&0o077 != 0 {
					t.Errorf("%s is %v, readable or writable by others", path, fi.Mode())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if n < 3 {
				t.Fatalf("found %d entries under %s; the store wrote nothing?", n, dir)
			}
		})
	}
}
