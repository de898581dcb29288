package durable

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFile: a new file is made with the mode asked for, a second
// write replaces it whole, and no temporary file is left behind; a write that cannot complete leaves the old contents and
// no temporary file either.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := WriteFile(path, []byte("first, and longer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "second\n" {
		t.Fatalf("contents %q (%v), want the second write whole", b, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	// A directory where the temporary file goes: the write fails.
	if err := os.Mkdir(path+".tmp", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("third\n"), 0o600); err == nil {
		t.Fatal("a write whose temporary file cannot be made succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "second\n" {
		t.Fatalf("after a failed write: %q, want the old contents", b)
	}
	os.Remove(path + ".tmp")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone", len(entries))
	}
	if err := WriteFile(filepath.Join(dir, "nodir", "x"), nil, 0o600); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write into a missing directory: %v, want ErrNotExist", err)
	}
}
