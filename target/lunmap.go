package target

import (
	"fmt"
	"maps"
	"slices"
	"sync"
)

// LUNStore keeps the SRP personality's LUN numbers across restarts. A
// host holds a SCSI device per LUN number and, after a reconnect, sends
// that device's I/O to the same number: were a number to name another
// volume after a create, a snapshot or a delete, the host would write
// into the wrong volume. The target therefore gives each volume a number
// the first time a login sees it, keeps it while the volume exists,
// never gives a number of a deleted volume to a new one while a fresh
// number remains, and saves the map before a login that depends on it
// is answered (docs/srp.md, LUNs).
type LUNStore interface {
	// LoadLUNs returns the saved map; New calls it once. A store never
	// saved returns a zero LUNMap.
	LoadLUNs() (LUNMap, error)
	// SaveLUNs records m durably (on stable storage when it returns).
	SaveLUNs(m LUNMap) error
}

// LUNMap is the SRP personality's assignment of LUN numbers to volumes.
type LUNMap struct {
	// LUNs maps each volume name to its logical unit number.
	LUNs map[string]uint16 `json:"luns"`
	// Next is the lowest number never assigned.
	Next uint16 `json:"next"`
	// Retired lists the numbers of deleted volumes, the oldest first: a
	// new volume gets one of them only when no number below the limit
	// was never assigned.
	Retired []uint16 `json:"retired,omitempty"`
}

// assign updates m for the catalog's volumes (names in any order): a
// volume keeps its number; a volume gone retires it; a new volume, in
// name order (so a catalog seen for the first time numbers as name order
// does), gets Next, else the oldest retired number. limit bounds the
// numbers; a volume that finds none left gets none (left out). It
// reports whether m changed, and returns the names by LUN ("" where no
// volume is), with the volumes left out.
func (m *LUNMap) assign(names []string, limit int) (byLUN []string, left []string, changed bool) {
	if m.LUNs == nil {
		m.LUNs = map[string]uint16{}
	}
	present := make(map[string]bool, len(names))
	for _, n := range names {
		present[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(m.LUNs)) {
		if !present[n] {
			m.Retired = append(m.Retired, m.LUNs[n])
			delete(m.LUNs, n)
			changed = true
		}
	}
	for _, n := range slices.Sorted(slices.Values(names)) {
		if _, ok := m.LUNs[n]; ok {
			continue
		}
		switch {
		case int(m.Next) < limit:
			m.LUNs[n] = m.Next
			m.Next++
		case len(m.Retired) > 0:
			m.LUNs[n] = m.Retired[0]
			m.Retired = m.Retired[1:]
		default:
			left = append(left, n)
			continue
		}
		changed = true
	}
	top := 0
	for _, l := range m.LUNs {
		top = max(top, int(l)+1)
	}
	byLUN = make([]string, top)
	for n, l := range m.LUNs {
		byLUN[l] = n
	}
	return byLUN, left, changed
}

// lunTable is the target's LUNMap, shared by its SRP logins.
type lunTable struct {
	mu    sync.Mutex
	store LUNStore
	m     LUNMap
}

func (t *lunTable) load(store LUNStore) error {
	t.store = store
	if store == nil {
		return nil
	}
	m, err := store.LoadLUNs()
	if err == nil {
		err = m.check(srpMaxLUNs)
	}
	if err != nil {
		return fmt.Errorf("target: read the LUN map: %w", err)
	}
	t.m = m
	return nil
}

// check refuses a map that could send a host's I/O to the wrong volume
// or hide a volume: two volumes on one number, a number at or past
// limit or never handed out (Next), a retired number still in use or
// retired twice. A damaged or hand-edited file must stop the target
// rather than be served.
func (m *LUNMap) check(limit int) error {
	owner := map[uint16]string{}
	for _, n := range slices.Sorted(maps.Keys(m.LUNs)) {
		l := m.LUNs[n]
		switch o, dup := owner[l]; {
		case dup:
			return fmt.Errorf("LUN %d is both %q and %q", l, o, n)
		case int(l) >= limit || l >= m.Next:
			return fmt.Errorf("volume %q has LUN %d, past the %d handed out (at most %d)", n, l, m.Next, limit)
		}
		owner[l] = n
	}
	for _, l := range m.Retired {
		if o, used := owner[l]; used {
			if o == "" {
				return fmt.Errorf("LUN %d is retired twice", l)
			}
			return fmt.Errorf("LUN %d is retired and %q's", l, o)
		}
		if l >= m.Next {
			return fmt.Errorf("retired LUN %d was never handed out (%d were)", l, m.Next)
		}
		owner[l] = ""
	}
	return nil
}

// names returns the catalog's volumes by LUN for a login, after saving
// any new assignment; an error means the map could not be saved and the
// login must be refused (answering it would hand out numbers that a
// restart could give to other volumes).
func (t *lunTable) names(list []VolumeInfo) (byLUN []string, left []string, err error) {
	names := make([]string, len(list))
	for i, v := range list {
		names[i] = v.Name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.m.clone()
	byLUN, left, changed := t.m.assign(names, srpMaxLUNs)
	if changed && t.store != nil {
		if err := t.store.SaveLUNs(t.m.clone()); err != nil {
			t.m = prev
			return nil, nil, fmt.Errorf("save the LUN map: %w", err)
		}
	}
	return byLUN, left, nil
}

func (m LUNMap) clone() LUNMap {
	return LUNMap{LUNs: maps.Clone(m.LUNs), Next: m.Next, Retired: slices.Clone(m.Retired)}
}
