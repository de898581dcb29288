package target

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// DirtyMarks keeps, on stable storage, which volumes may hold writes
// that were acknowledged but not yet flushed: the durable half of
// reporting a lost write cache to an SRP host. gosrp's own initiator
// counts its unflushed writes and notices a restart by the target's
// instance (Target.Instance); the kernel's ib_srp knows nothing of the
// target's cache, so only the target can tell it, and only if it wrote
// down, before it acknowledged the first such write, that the volume had
// some. srpd keeps the marks as files of its data directory.
type DirtyMarks interface {
	// DirtyVolumes lists the volumes marked dirty; New calls it once,
	// and each such volume reports WriteCacheLost to the SRP hosts
	// that log in to this target (once per I_T nexus).
	DirtyVolumes() ([]string, error)
	// MarkDirty records durably (on stable storage when it returns)
	// that volume may hold unflushed writes. The target calls it before
	// the first write after a flush, and runs that write, and the ones
	// that arrive meanwhile, only after it returned nil.
	MarkDirty(volume string) error
	// ClearDirty forgets the mark once a flush covered every write
	// acknowledged before it; it need not be durable (a mark left
	// behind only makes the next restart report a loss that was not).
	ClearDirty(volume string) error
}

// volMark is one volume's dirty mark, shared by every SRP session with
// the volume open. Writes wait in beforeWrite until the mark is on
// stable storage; a flush that began with no write running and ends
// with none begun since clears it, unless the volume is volatile.
type volMark struct {
	store DirtyMarks
	name  string
	// volatile: the volume lives in memory (an Immediate volume, the
	// memory backend's), so a restart loses all of it, what was flushed
	// too. No flush clears its mark: once written to, it reports its
	// loss after every restart, to every host, until it is gone.
	volatile bool

	mu    sync.Mutex
	dirty atomic.Bool // the mark is on stable storage; set under mu

	marking chan struct{} // closed when the MarkDirty under way returns
	begun   uint64        // writes begun, ever
	running int           // writes begun and not yet done
}

// flushMark is what a flush saw of its volume's mark when it began.
type flushMark struct {
	begun uint64
	idle  bool // no write was running
}

// beforeWrite returns once the mark is durable, writing it if it is not;
// the write must then be reported done with afterWrite.
func (m *volMark) beforeWrite() error {
	m.mu.Lock()
	for !m.dirty.Load() {
		if ch := m.marking; ch != nil {
			m.mu.Unlock()
			<-ch
			m.mu.Lock()
			continue
		}
		ch := make(chan struct{})
		m.marking = ch
		m.mu.Unlock()
		err := m.store.MarkDirty(m.name)
		m.mu.Lock()
		m.marking = nil
		close(ch)
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("target: mark volume %q dirty before writing: %w", m.name, err)
		}
		m.dirty.Store(true)
	}
	m.begun++
	m.running++
	m.mu.Unlock()
	return nil
}

// durable reports whether a write may start without waiting for the
// mark, so the shell knows whether it can run it on its own goroutine;
// the run loop asks it for every batch, so it takes no lock.
func (m *volMark) durable() bool { return m.dirty.Load() }

func (m *volMark) afterWrite() {
	m.mu.Lock()
	m.running--
	m.mu.Unlock()
}

// flushStart records what a flush about to begin covers.
func (m *volMark) flushStart() flushMark {
	m.mu.Lock()
	defer m.mu.Unlock()
	return flushMark{begun: m.begun, idle: m.running == 0}
}

// flushed clears the mark after a successful flush that covered every
// write begun before it (none was running when it began) if none began
// since. The store's clear runs under the lock, so a MarkDirty cannot
// start between the decision and the removal. A mark the store failed
// to clear stays: it can only report a loss that was not, after a
// crash.
func (m *volMark) flushed(f flushMark) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.volatile || !m.dirty.Load() || !f.idle || m.begun != f.begun || m.running != 0 {
		return
	}
	m.dirty.Store(m.store.ClearDirty(m.name) != nil)
}

// dirtyTable is the target's marks, by volume, and the volumes it found
// marked when it started, with the I_T nexuses told so far.
type dirtyTable struct {
	store DirtyMarks
	mu    sync.Mutex
	marks map[string]*volMark
	lost  map[string]map[string]bool // volume → nexus keys told
}

func (d *dirtyTable) load(store DirtyMarks) error {
	d.store = store
	d.marks = map[string]*volMark{}
	d.lost = map[string]map[string]bool{}
	if store == nil {
		return nil
	}
	names, err := store.DirtyVolumes()
	if err != nil {
		return fmt.Errorf("target: read the dirty marks: %w", err)
	}
	for _, n := range names {
		d.lost[n] = map[string]bool{}
		// Still dirty: what the lost writes' host does next is not
		// covered by a flush yet.
		m := &volMark{store: store, name: n}
		m.dirty.Store(true)
		d.marks[n] = m
	}
	return nil
}

// mark returns volume's mark, nil without a store; volatile says the
// volume lives in memory (volMark.volatile).
func (d *dirtyTable) mark(volume string, volatile bool) *volMark {
	if d.store == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.marks[volume]
	if !ok {
		m = &volMark{store: d.store, name: volume}
		d.marks[volume] = m
	}
	if volatile {
		m.mu.Lock()
		m.volatile = true
		m.mu.Unlock()
	}
	return m
}

// lostVolumes returns the volumes that lost their write cache in the
// target's previous life, sorted.
func (d *dirtyTable) lostVolumes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(maps.Keys(d.lost))
}

// lostFor reports whether volume lost its write cache in the target's
// previous life and the I_T nexus has not been told yet. Every channel
// of the nexus that opens the volume until then is told, since the host
// may flush through any of them.
func (d *dirtyTable) lostFor(volume, nexus string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	told, ok := d.lost[volume]
	return ok && !told[nexus]
}

// told records that a flush reported volume's lost write cache to the
// I_T nexus: its later logins are not told again.
func (d *dirtyTable) told(volume, nexus string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t, ok := d.lost[volume]; ok {
		t[nexus] = true
	}
}
