package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/target"
)

// TestLUNFile: the SRP LUN map survives a reopen of the data directory;
// a missing file is an empty map (name order, as before the map); a
// damaged one fails with its path and a warning not to delete it.
func TestLUNFile(t *testing.T) {
	dir := t.TempDir()
	f := openLUNFile(dir)
	if m, err := f.LoadLUNs(); err != nil || len(m.LUNs) != 0 || m.Next != 0 {
		t.Fatalf("no file: %+v, %v; want an empty map", m, err)
	}
	want := target.LUNMap{LUNs: map[string]uint16{"vol0": 0, "b": 2}, Next: 3, Retired: []uint16{1}}
	if err := f.SaveLUNs(want); err != nil {
		t.Fatal(err)
	}
	got, err := openLUNFile(dir).LoadLUNs()
	if err != nil || got.Next != 3 || len(got.LUNs) != 2 || got.LUNs["b"] != 2 || len(got.Retired) != 1 || got.Retired[0] != 1 {
		t.Fatalf("reopened: %+v, %v; want %+v", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, lunsFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.LoadLUNs(); err == nil || !strings.Contains(err.Error(), lunsFile) || !strings.Contains(err.Error(), "rather than delete it") {
		t.Fatalf("damaged file: %v; want an error naming it", err)
	}
}
