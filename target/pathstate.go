package target

// Gateways: volumes that several targets export, one of them serving at a
// time (wire.PathState).

import (
	"errors"
	"fmt"
)

// PathStater is implemented by volumes that several gateways (targets
// over one shared store, as srpd processes over one Ceph RBD image)
// export, exactly one of them serving I/O at a time. The target answers
// an OPEN with the volume's state (wire.PathState), and an OPEN that
// asks for a takeover calls TakeOver before it answers. A volume that
// does not implement it is always active.
type PathStater interface {
	// Standby reports whether this gateway does not serve the volume
	// now: its I/O fails with an error matching ErrStandby.
	Standby() bool
	// TakeOver makes this gateway the one that serves the volume. It
	// returns only once no other gateway's I/O can reach the volume any
	// more (the old owner is fenced) and this one holds it; it is a
	// no-op on the active gateway. It may block (it runs on a worker).
	TakeOver() error
}

// ErrStandby is the error of I/O on a volume this gateway does not serve
// now (PathStater): the target answers it with wire.SenseNotActive, and
// the initiator retries on the active path or asks this one to take over.
var ErrStandby = errors.New("target: volume is served by another gateway (standby path)")

// takeOver runs an OPEN's takeover, if it asked for one, and records
// the volume's path state in the slot; a failed takeover closes the
// volume, so the OPEN fails.
func takeOver(s *slot) error {
	ps, ok := s.opened.(PathStater)
	if !ok {
		return nil
	}
	if s.ctl.Takeover {
		if err := ps.TakeOver(); err != nil {
			closeVolume(s.opened)
			s.opened = nil
			return fmt.Errorf("take over: %w", err)
		}
	}
	s.openInfo.Standby = ps.Standby()
	return nil
}

// standbyOf reports whether v is a volume this gateway does not serve
// now (false for one without path states, and for nil).
func standbyOf(v Volume) bool {
	ps, ok := v.(PathStater)
	return ok && ps.Standby()
}

// PathStateChanged tells the target that the volume named name is now
// standby (or active) at this gateway: it was fenced or lost its lock,
// or took it. Every session that has the volume open and asked for
// notices at login gets a wire.PathNotice at once, so that an initiator
// fails over (or learns of a new active path) without waiting for an
// I/O to fail. The gateway catalog calls it (through its OnStateChange
// hook); it does not block.
func (t *Target) PathStateChanged(name string, standby bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.pathChanged(name, standby)
	}
}
