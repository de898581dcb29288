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
// is answered (docs/srp.md, LUNs). A volume deleted and created again
// under its name while the target did not look (before a crash, or by
// another gateway of a shared store) is told by its identity
// (VolumeInfo.Identity): it is a new volume, with a new number, and the
// old number is retired; the host's disk there fails its I/O rather
// than write into the new volume, which the kernel's sd would never
// notice on its own.
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
	// Identities maps each numbered volume whose identity the catalog
	// gives (VolumeInfo.Identity) to that identity: the volume the
	// number was given to.
	Identities map[string]uint64 `json:"identities,omitempty"`
}

// assign updates m for the catalog's volumes (in any order): a volume
// keeps its number; a volume gone, or replaced by another of its name
// (an identity other than the one recorded), retires it; a new volume,
// in name order (so a catalog seen for the first time numbers as name
// order does), gets Next, else the oldest retired number. limit bounds
// the numbers; a volume that finds none left gets none (left out). It
// reports whether m changed, and returns the names by LUN ("" where no
// volume is), with the volumes left out.
func (m *LUNMap) assign(vols []VolumeInfo, limit int) (byLUN []string, left []string, changed bool) {
	if m.LUNs == nil {
		m.LUNs = map[string]uint16{}
	}
	present := make(map[string]uint64, len(vols)) // name → identity (0: unknown)
	names := make([]string, 0, len(vols))
	for _, v := range vols {
		present[v.Name] = v.Identity
		names = append(names, v.Name)
	}
	for _, n := range slices.Sorted(maps.Keys(m.LUNs)) {
		id, ok := present[n]
		was := m.Identities[n]
		if !ok || id != 0 && was != 0 && id != was {
			m.Retired = append(m.Retired, m.LUNs[n])
			delete(m.LUNs, n)
			delete(m.Identities, n)
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
	for n, id := range present {
		if _, numbered := m.LUNs[n]; numbered && id != 0 && m.Identities[n] != id {
			if m.Identities == nil {
				m.Identities = map[string]uint64{}
			}
			m.Identities[n] = id
			changed = true
		}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.m.clone()
	byLUN, left, changed := t.m.assign(list, srpMaxLUNs)
	if changed && t.store != nil {
		if err := t.store.SaveLUNs(t.m.clone()); err != nil {
			t.m = prev
			return nil, nil, fmt.Errorf("save the LUN map: %w", err)
		}
	}
	return byLUN, left, nil
}

func (m LUNMap) clone() LUNMap {
	return LUNMap{LUNs: maps.Clone(m.LUNs), Next: m.Next, Retired: slices.Clone(m.Retired), Identities: maps.Clone(m.Identities)}
}
