package frmr

// Memory windows' rotation and quarantine, and the per-index history that
// keeps a reborn window's keys from repeating.

import (
	"github.com/gosrp/gosrp/transport"
)

// rotate replaces a FREE window that has used up its key variants with a
// fresh one. The old window is not deallocated at once: it stays in the
// quarantine, unbound (every key of its index refused), so the device
// cannot give its index to a new window whose variants might meet the
// keys a peer remembers. Only the oldest of WindowQuarantine rotated
// windows is closed. The window is FREE, so no WR names it.
func (p *Pool) rotate(s *slot) error {
	old := s.mw
	if err := p.alloc(s); err != nil {
		s.mw = old
		return err
	}
	p.retire(old)
	p.st.Rotations++
	return nil
}

// retire puts a FREE window the pool no longer uses into the quarantine
// and closes the oldest one there if it is full. A tainted window is not
// retired so: its state is unknown, and the recovery rule is to
// deallocate it at once (Recover); its index's variants are carried
// over instead (see alloc).
func (p *Pool) retire(w transport.MW) {
	if len(p.quarantine) == p.cfg.WindowQuarantine {
		// Out of quarantine: its keys are WindowQuarantine rotations
		// old, so a window reborn at its index may use every variant
		// again, starting after its last.
		q := p.quarantine[0]
		p.remember(q.Key().Index(), q.Key(), 0)
		q.Close()
		p.quarantine = append(p.quarantine[:0], p.quarantine[1:]...)
	}
	p.quarantine = append(p.quarantine, w)
}

// maxWindowHistory bounds the per-index history; a device that hands out
// indices cyclically fills it, and forgetting then only shortens the
// horizon to the quarantine's.
const maxWindowHistory = 1 << 16

// remember records where a window's variants stopped (MW only).
func (p *Pool) remember(index uint32, key transport.Key, binds int) {
	if p.mech != MW {
		return
	}
	if len(p.windows) >= maxWindowHistory {
		clear(p.windows)
	}
	p.windows[index] = retired{index, key, binds}
}
