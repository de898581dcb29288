package target

// Gateways: volumes that several targets export, one of them serving at a
// time (wire.PathState).

import (
	"errors"

	"github.com/gosrp/gosrp/internal/wire"
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

// standbySense is the sense a failed control operation (an open, a
// reservation change or report) is answered with: SenseNotActive when
// the error matches ErrStandby, so that the initiator makes it through
// the active path, else other. senseOf is the data path's.
func standbySense(err error, other wire.Sense) wire.Sense {
	if errors.Is(err, ErrStandby) {
		return wire.SenseNotActive
	}
	return other
}

// Fencer is implemented by PathStater volumes that know when this
// gateway is fenced: another gateway broke its lock, and it cannot serve
// the volume until it has a new client of the cluster (a blocklisted
// Ceph client; internal/gateway reconnects at once, so a volume stays
// fenced only while the cluster is out of reach). An SRP host with ALUA (Config.SRPPortGroup) then sees the
// unit unavailable rather than standby, so that it does not count on
// this path to take the volume over; gosrp sessions see it standby.
type Fencer interface {
	Fenced() bool
}

// gwState is a volume's state at this gateway as the target reports it.
type gwState uint32

const (
	gwActive gwState = iota
	gwStandby
	gwFenced
)

// stateOf is v's state at this gateway (active for a volume without path
// states, and for nil).
func stateOf(v Volume) gwState {
	ps, ok := v.(PathStater)
	switch {
	case !ok || !ps.Standby():
		return gwActive
	case isFenced(v):
		return gwFenced
	}
	return gwStandby
}

// pathChanges are the states a volume passed through at this gateway
// since a connection's run loop last looked: the last one, and every
// other one it went through. Keeping only the last would lose a change
// that went and came back (standby, active, standby again) before the
// run loop ran, and with it the unit attention a SCSI host is owed for
// each change of its port's state (SPC-4 5.15.2.3): its multipath layer
// would never ask again what the other gateways hold. The order of the
// states before the last is not kept; a host asks REPORT TARGET PORT
// GROUPS for the present anyway.
type pathChanges struct {
	passed uint8 // bit 1<<st for each state passed through but the last
	last   gwState
	set    bool
}

// add records that the volume is now in state st.
func (p pathChanges) add(st gwState) pathChanges {
	if p.set && p.last != st {
		p.passed |= 1 << p.last
	}
	p.passed &^= 1 << st
	p.last, p.set = st, true
	return p
}

// replay returns the states to apply in order: those passed through,
// then the last.
func (p pathChanges) replay() []gwState {
	var out []gwState
	for st := gwActive; st <= gwFenced; st++ {
		if p.passed&(1<<st) != 0 {
			out = append(out, st)
		}
	}
	if p.set {
		out = append(out, p.last)
	}
	return out
}

func isFenced(v Volume) bool {
	f, ok := v.(Fencer)
	return ok && f.Fenced()
}

// PathStateChanged tells the target that the volume named name is now
// standby (or active) at this gateway: it was fenced or lost its lock,
// or took it. Every session that has the volume open and asked for
// notices at login gets a wire.PathNotice at once, so that an initiator
// fails over (or learns of a new active path) without waiting for an
// I/O to fail. The gateway catalog calls it (through its OnStateChange
// hook); it does not block.
func (t *Target) PathStateChanged(name string, standby bool) {
	st := gwActive
	if standby {
		st = gwStandby
	}
	t.pathChanged(name, st)
}

// PathFenced tells the target that this gateway was fenced from the
// volume named name (see Fencer): gosrp sessions that have it open get a
// standby notice, as from PathStateChanged, and SRP hosts with ALUA see
// the unit unavailable. It does not block.
func (t *Target) PathFenced(name string) { t.pathChanged(name, gwFenced) }

func (t *Target) pathChanged(name string, st gwState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.pathChanged(name, st)
	}
}
