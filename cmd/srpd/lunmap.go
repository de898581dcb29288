package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gosrp/gosrp/internal/durable"
	"github.com/gosrp/gosrp/target"
)

// lunsFile holds the SRP LUN numbers in the data directory, replaced
// whole with durable.WriteFile as reservationsFile is: a host that reconnects
// after a restart must find each LUN number naming the volume it named
// before (target.LUNStore).
const lunsFile = "srp-luns.json"

// lunFile is target.LUNStore over lunsFile; the target serializes its
// calls.
type lunFile struct{ path string }

func openLUNFile(dir string) lunFile { return lunFile{path: filepath.Join(dir, lunsFile)} }

// LoadLUNs reads the file; a missing file is an empty map, which numbers
// the catalog in name order as srpd did before it kept one.
func (f lunFile) LoadLUNs() (target.LUNMap, error) {
	b, err := os.ReadFile(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return target.LUNMap{}, nil
	case err != nil:
		return target.LUNMap{}, err
	}
	var m target.LUNMap
	if err := json.Unmarshal(b, &m); err != nil {
		return target.LUNMap{}, fmt.Errorf("%s: %w (it numbers the SRP LUNs; restore it from a backup rather than delete it, or hosts may write into other volumes)", f.path, err)
	}
	return m, nil
}

// SaveLUNs rewrites the file durably.
func (f lunFile) SaveLUNs(m target.LUNMap) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(f.path, append(b, '\n'), 0o600)
}
