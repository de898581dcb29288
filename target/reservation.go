package target

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/wire"
)

// prTable is the target's reservation state, one prVolume per volume
// name, shared by every connection: a reservation binds hosts, not
// connections.
type prTable struct {
	mu    sync.Mutex
	vols  map[string]*prVolume
	store ReservationStore // nil: in memory only
}

func newPRTable() *prTable { return &prTable{vols: map[string]*prVolume{}} }

// volume returns the reservation state of the volume named name, made
// empty on first use.
func (t *prTable) volume(name string) *prVolume {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.vols[name]
	if v == nil {
		v = &prVolume{name: name, store: t.store}
		v.view.Store(&prState{})
		t.vols[name] = v
	}
	return v
}

// prVolume is one volume's reservation state. Changes take mu and publish
// a fresh immutable copy in view, which the cores read per command
// without a lock.
type prVolume struct {
	name  string
	store ReservationStore // nil: in memory only
	mu    sync.Mutex
	st    prState
	view  atomic.Pointer[prState]
}

// allows is prState.allows on the current view: one atomic load, no
// allocation, on every command.
func (v *prVolume) allows(ini, owner string, write bool) bool {
	p := v.view.Load()
	if p.holder == "" && p.excl == "" {
		return true
	}
	return p.allows(ini, owner, write)
}

// apply runs a PERSISTENT RESERVE OUT action of host ini. A change is
// saved before it is published or answered, so an acknowledged change
// survives a restart; one that cannot be saved is undone and fails.
// The commands go on meanwhile: they read the view, not v.mu.
func (v *prVolume) apply(ini string, act wire.ReserveAction, key, newKey uint64, typ wire.ReservationType) (prOutcome, uint32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	before := v.st.state()
	out := v.st.apply(ini, act, key, newKey, typ)
	if out.sense != wire.SenseNone {
		return out, v.st.gen
	}
	if v.store != nil {
		after := v.st.state()
		after.ExclusiveHolder = ""
		if err := v.store.SaveReservation(v.name, after); err != nil {
			v.st.setState(before) // it was valid: it is what we had
			return prOutcome{sense: wire.SenseInternal, msg: fmt.Sprintf("the change could not be recorded: %v", err)}, v.st.gen
		}
	}
	v.view.Store(v.st.snapshot())
	return out, v.st.gen
}

// openWriter and closeWriter are prState's, published.
func (v *prVolume) openWriter(owner, ini string, excl bool) prOutcome {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.st.openWriter(owner, ini, excl)
	if out.sense == wire.SenseNone && excl {
		v.view.Store(v.st.snapshot())
	}
	return out
}

func (v *prVolume) closeWriter(owner string, excl bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.st.closeWriter(owner, excl)
	if excl {
		v.view.Store(v.st.snapshot())
	}
}

// releasePR ends what the handle counted in its volume's reservation
// state (a writer, an exclusive open) when the handle closes, whichever
// way: CLOSE, revocation, the connection's end.
func (ov *openVol) releasePR() {
	if ov.writer && ov.pr != nil {
		ov.pr.closeWriter(ov.owner, ov.excl)
		ov.writer = false
	}
}

// report is prState.report under the lock.
func (v *prVolume) report() *wire.ControlResponse {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st.report()
}

// String is prState.String under the lock (traces, status).
func (v *prVolume) String() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st.String()
}
