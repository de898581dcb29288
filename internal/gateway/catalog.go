package gateway

// The shell: a target.Catalog that runs the core's lock steps against a
// store and gates each handle's I/O on the volume's state.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
)

// Catalog serves a store's volumes as one gateway of several (see the
// package doc). It is safe for concurrent use.
type Catalog struct {
	inner storecatalog.Catalog
	so    block.SharedOpener // nil: the store has no locks
	lb    block.LockBreaker
	rc    block.Reconnector // nil: a fenced volume stays so

	limit Limit
	clock func() time.Time

	mu   sync.Mutex
	vols map[string]*entry
	hist map[string]*history        // each volume's past here, kept past its close
	hook func(name string, s State) // OnStateChange's; under mu
	// before is BeforeActive's; under mu.
	before func(name string) error
}

// Options are a Catalog's settings; the zero value is the defaults.
type Options struct {
	// Limit bounds how often this gateway breaks one volume's lock
	// (core.go says why); zero: no bound.
	Limit Limit
	// Clock tells the time of each takeover (default time.Now); tests
	// pass a fake one.
	Clock func() time.Time
}

// FenceWatcher is implemented by stores that learn without any I/O that
// another client broke a volume's lock this one held (gatewaytest's
// clients; the rbd store, from librbd's update watch). The Catalog then
// fences the volume at once, reconnects it if the store can, and its
// OnStateChange hook tells the initiators.
type FenceWatcher interface {
	// WatchFenced has f called with each such volume, holding no lock
	// of the store's: f may block, for as long as a Reconnect takes.
	WatchFenced(f func(volume string))
}

var _ target.Catalog = (*Catalog)(nil)

// New returns the gateway catalog of st with the default Options. A
// store that is not both a block.SharedOpener and a block.LockBreaker
// serves every volume active.
func New(st block.Store) *Catalog { return NewWithOptions(st, Options{}) }

// NewWithOptions is New with settings.
func NewWithOptions(st block.Store, o Options) *Catalog {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	c := &Catalog{inner: storecatalog.Catalog{Store: st}, vols: map[string]*entry{}, hist: map[string]*history{},
		limit: o.Limit, clock: o.Clock}
	so, ok1 := st.(block.SharedOpener)
	lb, ok2 := st.(block.LockBreaker)
	if ok1 && ok2 {
		c.so, c.lb = so, lb
		c.rc, _ = st.(block.Reconnector)
	}
	if fw, ok := st.(FenceWatcher); ok && c.so != nil {
		fw.WatchFenced(c.watchFenced)
	}
	return c
}

// OnStateChange has f called, after the change and outside the
// catalog's locks, whenever a volume's state at this gateway changes
// between standby, active and fenced (not when it closes here): srpd
// passes it to Tell, that is to target.Target.PathStateChanged, which sends the
// sessions that have the volume open a wire.PathNotice. f must not
// block.
func (c *Catalog) OnStateChange(f func(name string, s State)) {
	c.mu.Lock()
	c.hook = f
	c.mu.Unlock()
}

// BeforeActive has f called each time this gateway has taken a
// volume's lock, before the volume turns active and serves any I/O:
// srpd loads there what the gateway that served the volume before
// recorded with it (its hosts' reservations), so that nothing is served
// against an older state. An error fails the lock step: the volume
// stays standby here (its lock held until its handles close or another
// gateway breaks it), and a takeover that asked for it fails with the
// error. f may block (it reads the store).
func (c *Catalog) BeforeActive(f func(name string) error) {
	c.mu.Lock()
	c.before = f
	c.mu.Unlock()
}

// Tell passes a volume's state change at this gateway to t, as srpd's
// OnStateChange hook does: Fenced is Target.PathFenced (gosrp sessions
// hear standby, SRP hosts with ALUA see the unit unavailable), any other
// state Target.PathStateChanged.
func Tell(t *target.Target, name string, s State) {
	if s == Fenced {
		t.PathFenced(name)
		return
	}
	t.PathStateChanged(name, s != Active)
}

// watchFenced is the store telling that name's lock was broken.
func (c *Catalog) watchFenced(name string) {
	c.mu.Lock()
	e := c.vols[name]
	c.mu.Unlock()
	if e != nil {
		c.fenced(e)
	}
}

// entry is one volume this gateway has open: its core and its handles.
type entry struct {
	name string
	refs int // guarded by Catalog.mu

	// mu serializes the lock steps (an open, a takeover, a fencing);
	// state mirrors core.state for the I/O path, which reads it
	// without a lock.
	mu    sync.Mutex
	core  core
	state atomicState
	hist  *history
}

// history is what the Catalog keeps of a volume across its opens here:
// the core's break log (guarded by the entry's mu) and the counters
// Stats reports.
type history struct {
	log                     breakLog
	breaks, refused, fenced atomic.Uint64
}

// VolumeStats is a volume's record at this gateway since it started.
type VolumeStats struct {
	Name  string
	State State
	// Breaks counts the lock breaks this gateway made for takeovers,
	// each a client blocklisted on the cluster; Refused the takeovers
	// the break limit refused; Fenced the times another gateway's
	// break fenced this one.
	Breaks, Refused, Fenced uint64
}

// Stats reports every volume this gateway has opened since it started,
// by name.
func (c *Catalog) Stats() []VolumeStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]VolumeStats, 0, len(c.hist))
	for name, h := range c.hist {
		st := VolumeStats{Name: name, Breaks: h.breaks.Load(), Refused: h.refused.Load(), Fenced: h.fenced.Load()}
		if e := c.vols[name]; e != nil {
			st.State = e.state.load()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b VolumeStats) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// List implements target.Catalog.
func (c *Catalog) List() ([]target.VolumeInfo, error) { return c.inner.List() }

// OpenVolume implements target.Catalog: a volume of a shared store is
// opened shared and its lock tried; the handle reports the state
// (target.PathStater) and refuses I/O unless active.
func (c *Catalog) OpenVolume(name string) (target.Volume, error) {
	if c.so == nil || strings.Contains(name, "@") {
		// Snapshots are read-only: every gateway serves them.
		return c.inner.OpenVolume(name)
	}
	v, err := c.so.OpenShared(name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	e := c.vols[name]
	if e == nil {
		h := c.hist[name]
		if h == nil {
			h = &history{}
			c.hist[name] = h
		}
		e = &entry{name: name, core: newCore(c.rc != nil, c.limit, &h.log), hist: h}
		c.vols[name] = e
	}
	e.refs++
	c.mu.Unlock()
	// A lock refused, or failing otherwise, is not the open's failure:
	// the handle is standby, and says so.
	c.run(e, EvOpen)
	return &handle{Volume: v, c: c, e: e}, nil
}

// run feeds an event to a volume's core and runs the lock steps it asks
// for, feeding back their outcomes, until it settles; it returns the
// state it settled in and the error of the last failed step.
func (c *Catalog) run(e *entry, ev Event) (State, error) {
	before, after, err := c.settle(e, ev)
	if after != before && after != Closed {
		c.mu.Lock()
		hook := c.hook
		c.mu.Unlock()
		if hook != nil {
			hook(e.name, after)
		}
	}
	return after, err
}

// settle is run's work under the entry's lock: the state before, the
// state it settled in, and the error of the last failed step.
func (c *Catalog) settle(e *entry, ev Event) (State, State, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	before, asked := e.core.state, ev
	now := c.clock().UnixNano()
	var last error
	for a := e.core.step(ev, now); a != ActNone; a = e.core.step(ev, now) {
		// The I/O path sees each state as it is reached: a volume
		// being reconnected is fenced, not still active.
		e.setState(e.core.state)
		switch a {
		case ActLock:
			last = c.so.AcquireLock(e.name)
			if last == nil {
				last = c.beforeActive(e.name)
			}
			switch {
			case last == nil:
				ev = EvLocked
			case errors.Is(last, block.ErrFenced):
				ev = EvFenced
			case errors.Is(last, block.ErrBusy):
				ev = EvBusy
			default:
				ev = EvFailed
			}
		case ActBreak:
			last = c.lb.BreakLock(e.name)
			ev = EvBroken
			if last != nil {
				ev = EvFailed
			} else {
				e.hist.breaks.Add(1)
			}
		case ActReconnect:
			last = c.rc.Reconnect(e.name)
			ev = EvReconnected
			if last != nil {
				ev = EvFailed
			}
		}
	}
	e.setState(e.core.state)
	if e.core.state == Active {
		last = nil
	} else if asked == EvTakeover && e.core.limited {
		// limited describes the last takeover; only the event that
		// was that takeover is refused (and counted) for it.
		e.hist.refused.Add(1)
		last = fmt.Errorf("%w (this gateway broke its lock %d times in %v already; do hosts take it back and forth?)",
			errBreakLimit, c.limit.Burst, c.limit.Window)
	}
	return before, e.core.state, last
}

// beforeActive runs BeforeActive's function for the volume named name,
// once this gateway holds its lock.
func (c *Catalog) beforeActive(name string) error {
	c.mu.Lock()
	f := c.before
	c.mu.Unlock()
	if f == nil {
		return nil
	}
	if err := f(name); err != nil {
		return fmt.Errorf("gateway: volume %q: before serving it: %w", name, err)
	}
	return nil
}

// setState publishes the core's state s to the I/O path, counting a
// fencing when s is Fenced and the state was not. REQUIRES: e.mu.
func (e *entry) setState(s State) {
	if s == Fenced && e.state.load() != Fenced {
		e.hist.fenced.Add(1)
	}
	e.state.store(s)
}

// fenced records that the volume's I/O found this gateway fenced.
func (c *Catalog) fenced(e *entry) {
	c.run(e, EvFenced)
}

// release drops a handle of e; the last one closes the entry (the store
// released the lock when the volume's last handle closed).
func (c *Catalog) release(e *entry) {
	c.mu.Lock()
	e.refs--
	last := e.refs == 0
	if last && c.vols[e.name] == e {
		delete(c.vols, e.name)
	}
	c.mu.Unlock()
	if last {
		c.run(e, EvClosed)
	}
}

// Shared reports whether the store is shared by several gateways (it
// locks its volumes): only then do its volumes have a state other than
// served.
func (c *Catalog) Shared() bool { return c.so != nil }

// State reports a volume's state at this gateway (Closed when no handle
// has it open here).
func (c *Catalog) State(name string) State {
	c.mu.Lock()
	e := c.vols[name]
	c.mu.Unlock()
	if e == nil {
		return Closed
	}
	return e.state.load()
}

// errBreakLimit is a takeover's failure past the break limit.
var errBreakLimit = errors.New("not breaking the lock again so soon")

// errTakeover wraps a takeover's failure so that the target answers it
// as a path that is not active.
func errTakeover(name string, s State, err error) error {
	if err == nil {
		err = errors.New("another gateway holds the lock")
	}
	return fmt.Errorf("gateway: volume %q: still %s after the takeover: %w: %w", name, s, target.ErrStandby, err)
}
