package target

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/internal/wire"
)

// prTable is the target's reservation state, one prVolume per volume
// name, shared by every connection: a reservation binds hosts, not
// connections.
type prTable struct {
	mu    sync.Mutex
	vols  map[string]*prVolume
	store ReservationStore // nil: in memory only
	// notify raises a change's unit attentions on the SRP I_T nexuses
	// of the hosts it names (srpNexusTable.raisePR); nil: nobody to
	// tell (a core of its own, in tests).
	notify func(volume string, ns []prNotice)
}

func newPRTable() *prTable { return &prTable{vols: map[string]*prVolume{}} }

// volume returns the reservation state of the volume named name, made
// empty on first use.
func (t *prTable) volume(name string) *prVolume {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.vols[name]
	if v == nil {
		v = t.newVolume(name)
		v.view.Store(&prState{})
		t.vols[name] = v
	}
	return v
}

// newVolume is a volume's reservation state, empty and unpublished,
// wired to the table's store and notifier: every volume is made here,
// whether first used or loaded from the store.
func (t *prTable) newVolume(name string) *prVolume {
	return &prVolume{name: name, store: t.store, notify: t.notify}
}

// prVolume is one volume's reservation state. Changes take mu and publish
// a fresh immutable copy in view, which the cores read per command
// without a lock.
type prVolume struct {
	name   string
	store  ReservationStore // nil: in memory only
	notify func(volume string, ns []prNotice)
	mu     sync.Mutex
	st     prState
	view   atomic.Pointer[prState]
	// serial and notices are ReservationState's: the last change this
	// target recorded or read, and the unit attentions recorded with
	// it (under mu).
	serial  uint64
	notices []ReservationNotice
	// writers are the handles open for writing (under mu), for
	// PREEMPT AND ABORT to wait for the preempted hosts' writes.
	writers map[*openVol]struct{}
	// fencing is set while a fence waits; wch, under wmu, is closed to
	// wake it when a handle's writes reach zero.
	fencing atomic.Bool
	wmu     sync.Mutex
	wch     chan struct{}
}

// fenceTimeout bounds how long PREEMPT AND ABORT waits for the preempted
// hosts' writes already in the store (a store that hangs must not hang
// the preemptor for ever).
const fenceTimeout = 30 * time.Second

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
//
// PREEMPT AND ABORT then waits, without the lock, until the writes the
// preempted hosts had already handed to the store are done (SPC-4
// §5.13.11.5: their tasks are aborted before the command completes), so
// that once it is answered no write of theirs can land: the fence a
// cluster relies on. Their writes not yet in the store are refused by
// the new view (core.dispatch).
func (v *prVolume) apply(ini string, req *wire.ControlRequest) (prOutcome, uint32) {
	v.mu.Lock()
	before := v.st.state()
	out := v.st.apply(ini, req)
	gen := v.st.gen
	if out.sense != wire.SenseNone {
		v.mu.Unlock()
		return out, gen
	}
	if v.store != nil {
		after := v.st.state()
		after.ExclusiveHolder = ""
		after.Serial = v.serial + 1
		after.Notices = record(v.notices, after.Serial, out.notices)
		if err := v.store.SaveReservation(v.name, after); err != nil {
			v.st.setState(before) // it was valid: it is what we had
			v.mu.Unlock()
			// A gateway that does not serve the volume cannot record
			// the change where the others read it: the host is to make
			// it through the active path.
			return prOutcome{sense: standbySense(err, wire.SenseInternal), msg: fmt.Sprintf("the change could not be recorded: %v", err)}, v.st.gen
		}
		v.serial, v.notices = after.Serial, after.Notices
	}
	v.view.Store(v.st.snapshot())
	var victims []*openVol
	if req.Action == wire.ActionPreemptAbort {
		for ov := range v.writers {
			if slices.Contains(out.preempted, ov.ini) {
				victims = append(victims, ov)
			}
		}
	}
	v.mu.Unlock()
	// Before the answer: the preempted host's next command, on any
	// channel, hears of it (SPC-4 5.13.11.4.3).
	v.tell(out.notices)
	if n := v.fence(victims, fenceTimeout); n > 0 {
		return prOutcome{sense: wire.SenseInternal, preempted: out.preempted,
			msg: fmt.Sprintf("preempted, but %d writes of the preempted hosts were still in the store after %s", n, fenceTimeout)}, gen
	}
	return out, gen
}

// fence waits until the handles' counted writes are done, or timeout;
// it returns how many were left.
func (v *prVolume) fence(handles []*openVol, timeout time.Duration) int {
	if len(handles) == 0 {
		return 0
	}
	v.fencing.Store(true)
	defer v.fencing.Store(false)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, ov := range handles {
		for {
			// The channel is made before the count is read, and a
			// write's end reads fencing after its count: either this
			// sees zero or that closes the channel.
			v.wmu.Lock()
			if v.wch == nil {
				v.wch = make(chan struct{})
			}
			ch := v.wch
			v.wmu.Unlock()
			if ov.writes.Load() <= 0 {
				break
			}
			select {
			case <-ch:
			case <-deadline.C:
				left := 0
				for _, h := range handles {
					left += int(max(h.writes.Load(), 0))
				}
				return left
			}
		}
	}
	return 0
}

// wake wakes a fence: some handle's writes reached zero.
func (v *prVolume) wake() {
	v.wmu.Lock()
	if v.wch != nil {
		close(v.wch)
		v.wch = nil
	}
	v.wmu.Unlock()
}

// addWriter records a handle open for writing, for fences.
func (v *prVolume) addWriter(ov *openVol) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.writers == nil {
		v.writers = map[*openVol]struct{}{}
	}
	v.writers[ov] = struct{}{}
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

// countWriters counts an SRP session's writable LUNs (handles) as
// writers in their volumes' reservation state, as a gosrp OPEN for
// writing is counted: a PREEMPT AND ABORT that preempts the host then
// waits for its writes already in the store (prVolume.fence), and
// another session's exclusive open is refused while this one may
// write. The shell calls it on the run loop with the handles the core
// just attached (core.srpTakeAttached): only those, since an older one
// may be closing on another goroutine (closeRevoked), whose releasePR
// ends what was counted.
func countWriters(handles []*openVol) {
	for _, ov := range handles {
		if ov == nil || ov.pr == nil || ov.ro || ov.writer {
			continue
		}
		ov.pr.openWriter(ov.owner, ov.ini, false) // never refused: not exclusive
		ov.pr.addWriter(ov)
		ov.writer = true
	}
}

// releasePR ends what the handle counted in its volume's reservation
// state (a writer, an exclusive open) when the handle closes, whichever
// way: CLOSE, revocation, the connection's end.
func (ov *openVol) releasePR() {
	if ov.writer && ov.pr != nil {
		ov.pr.closeWriter(ov.owner, ov.excl)
		ov.pr.mu.Lock()
		delete(ov.pr.writers, ov)
		ov.pr.mu.Unlock()
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

// isWriteJob reports whether j changes the volume's data.
func isWriteJob(j jobKind) bool {
	return j == jobWrite || j == jobWriteFUA || j == jobDiscard || j == jobWriteZeroes || j == jobUnmap
}

// ioDone ends a backend I/O job of kind j on the handle.
func (ov *openVol) ioDone(j jobKind) {
	if ov.pr != nil && isWriteJob(j) {
		ov.writeDone()
	}
	ov.inflight.Done()
}

// writeDone ends one of the handle's counted writes and wakes a fence
// waiting for it.
func (ov *openVol) writeDone() {
	if ov.writes.Add(-1) == 0 && ov.pr.fencing.Load() {
		ov.pr.wake()
	}
}
