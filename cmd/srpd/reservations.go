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

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/durable"
	"github.com/gosrp/gosrp/target"
)

// reservationsFile holds the volumes' persistent reservations in the
// data directory. It is srpd's own state file, beside access.json, rather
// than a record in the block store: reservations are the target's
// protocol state, not the volume's data or metadata, the store is one of
// several backends (memory, files, pebble) that would each have to carry
// them, and a small file replaced whole with durable.WriteFile is as durable
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
		err = durable.WriteFile(r.path, append(b, '\n'), 0o600)
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

// reservationsKey is the volume metadata key under which srpd gateways
// record a volume's reservations (rbd: the image's metadata).
const reservationsKey = "gosrp.reservations"

// sharedReservations is target.ReservationStore over a shared store's
// volume metadata, for gateways: the reservations of an RBD image are
// recorded with the image, written by the active gateway through the
// lock it holds, and read by a gateway that takes the image over before
// it serves it (load, from gateway.Catalog.BeforeActive). A host's
// reservation so fences the other hosts whichever gateway they reach,
// and a gateway that lost the image cannot change what the next one
// reads (block.VolumeMetadata refuses it). A standby gateway reports
// them as recorded (ReadReservation).
type sharedReservations struct{ md block.VolumeMetadata }

// LoadReservations returns nothing: a volume's reservations are read
// when this gateway takes the volume (load).
func (sharedReservations) LoadReservations() (map[string]target.ReservationState, error) {
	return map[string]target.ReservationState{}, nil
}

// SaveReservation records volume's state with the volume. A standby
// gateway cannot (it does not hold the lock): the change fails, and the
// host makes it through the active path.
func (r sharedReservations) SaveReservation(volume string, st target.ReservationState) error {
	val := ""
	if !st.Empty() {
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		val = string(b)
	}
	err := r.md.SetMetadata(volume, reservationsKey, val)
	if st.Empty() && errors.Is(err, block.ErrInvalid) {
		return nil // not open here (deleted): its metadata went with it
	}
	return standbyIfFenced(err)
}

// standbyIfFenced makes a store's ErrFenced (this gateway does not hold
// the volume's lock) the target's ErrStandby, which it answers as a
// path that is not active.
func standbyIfFenced(err error) error {
	if errors.Is(err, block.ErrFenced) {
		return fmt.Errorf("%w: %w", target.ErrStandby, err)
	}
	return err
}

// ReadReservation returns the reservations recorded with volume now
// (target.ReservationReader: a standby gateway reports them).
func (r sharedReservations) ReadReservation(volume string) (target.ReservationState, error) {
	var st target.ReservationState
	val, err := r.md.Metadata(volume, reservationsKey)
	if err != nil || val == "" {
		return st, standbyIfFenced(err)
	}
	if err := json.Unmarshal([]byte(val), &st); err != nil {
		return st, fmt.Errorf("the reservations recorded with %q: %w", volume, err)
	}
	return st, nil
}

// load gives tgt the reservations recorded with volume.
func (r sharedReservations) load(tgt *target.Target, volume string) error {
	st, err := r.ReadReservation(volume)
	if err != nil {
		return fmt.Errorf("read the reservations: %w", err)
	}
	return tgt.SetReservations(volume, st)
}
