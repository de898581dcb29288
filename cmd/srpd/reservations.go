package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/gosrp/gosrp/target"
)

// reservationsFile holds the volumes' persistent reservations in the
// data directory. It is srpd's own state file, beside access.json, rather
// than a record in the block store: reservations are the target's
// protocol state, not the volume's data or metadata, the store is one of
// several backends (memory, files, pebble) that would each have to carry
// them, and a small file replaced whole with writeDurable is as durable
// as a pebble batch with sync and simpler to read when debugging.
const reservationsFile = "reservations.json"

// reservations is target.ReservationStore over reservationsFile.
type reservations struct {
	path string
	mu   sync.Mutex
	doc  map[string]target.ReservationState
}

func openReservations(dir string) *reservations {
	return &reservations{path: filepath.Join(dir, reservationsFile), doc: map[string]target.ReservationState{}}
}

// LoadReservations reads the file; a missing file is no reservation.
func (r *reservations) LoadReservations() (map[string]target.ReservationState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return map[string]target.ReservationState{}, nil
	case err != nil:
		return nil, err
	}
	doc := map[string]target.ReservationState{}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", r.path, err)
	}
	r.doc = doc
	return maps.Clone(doc), nil
}

// SaveReservation rewrites the file with volume's new state, durably.
func (r *reservations) SaveReservation(volume string, st target.ReservationState) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.doc[volume]
	if st.Empty() {
		delete(r.doc, volume)
	} else {
		r.doc[volume] = st
	}
	b, err := json.MarshalIndent(r.doc, "", "  ")
	if err == nil {
		err = writeDurable(r.path, append(b, '\n'))
	}
	if err != nil {
		if had {
			r.doc[volume] = old
		} else {
			delete(r.doc, volume)
		}
		return fmt.Errorf("save %s: %w", r.path, err)
	}
	return nil
}
