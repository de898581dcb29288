package gateway

// The pure core: one volume's path state at this gateway. Events in,
// actions out; no goroutines, no clock, no store calls.

import (
	"time"

	"github.com/gosrp/gosrp/internal/enum"
)

// State is a volume's path state at this gateway.
type State uint8

// States.
const (
	// Closed: no handle has the volume open here; the gateway holds
	// nothing of it.
	Closed State = iota
	// Standby: open here, but another gateway holds the lock (or a lock
	// step is under way): I/O is refused.
	Standby
	// Active: this gateway holds the volume's lock and serves its I/O.
	Active
	// Fenced: another gateway broke this one's lock and the cluster
	// blocklisted the volume's client here; it cannot serve the volume
	// until a new client replaces it (ActReconnect), and stays so when
	// the store cannot reconnect or the reconnect failed.
	Fenced
)

var stateNames = [...]string{"closed", "standby", "active", "fenced"}

func (s State) String() string { return enum.Name(stateNames[:], s, "State") }

// Event is what happened to a volume.
type Event uint8

// Events.
const (
	// EvOpen: a handle opened the volume (a plain open).
	EvOpen Event = iota
	// EvTakeover: an open asked this gateway to take the volume over.
	EvTakeover
	// EvLocked: the store's AcquireLock succeeded.
	EvLocked
	// EvBusy: AcquireLock was refused, another client holds the lock.
	EvBusy
	// EvBroken: BreakLock returned: the old owner is blocklisted.
	EvBroken
	// EvFailed: a lock step failed for another reason.
	EvFailed
	// EvFenced: I/O, a flush or AcquireLock failed with block.ErrFenced:
	// this client's lock was broken.
	EvFenced
	// EvClosed: the volume's last handle here closed (the store
	// released the lock with it).
	EvClosed
	// EvReconnected: the store's Reconnect gave the volume a new
	// client, not blocklisted and without the lock.
	EvReconnected
)

var eventNames = [...]string{"open", "takeover", "locked", "busy", "broken", "failed", "fenced", "closed", "reconnected"}

func (e Event) String() string { return enum.Name(eventNames[:], e, "Event") }

// Action is what the shell must do next; it feeds the outcome back as
// an event (EvLocked, EvBusy, EvBroken, EvFailed, EvFenced,
// EvReconnected).
type Action uint8

// Actions.
const (
	// ActNone: nothing to do; the state is settled.
	ActNone Action = iota
	// ActLock: try the store's AcquireLock.
	ActLock
	// ActBreak: break the lock another gateway holds (LockBreaker),
	// which blocklists it; then the core asks for ActLock.
	ActBreak
	// ActReconnect: give the fenced volume a new cluster client
	// (block.Reconnector).
	ActReconnect
)

var actionNames = [...]string{"none", "lock", "break", "reconnect"}

func (a Action) String() string { return enum.Name(actionNames[:], a, "Action") }

// core is one volume's state machine. Its rules:
//
//   - Every open tries the lock without breaking it: a lock nobody holds
//     (the old owner closed the volume, or never opened it) is simply
//     taken, so the first gateway to open a volume serves it.
//   - Only a takeover breaks a lock, and it breaks first (ActBreak, then
//     ActLock): asking a dead owner to hand the lock over waits for the
//     cluster to time its watch out (librbd's lock request, ≈ 30 s),
//     and a takeover is asked for because the owner is thought dead.
//     Breaking a lock nobody else holds is a no-op that fences nobody.
//   - The state becomes Active only on EvLocked, that is after the lock
//     is ours; nothing before it lets I/O through, so no I/O is served
//     while the old owner may still write (issue 26's fencing rule).
//   - A break is tried once per takeover: a lock still refused after it
//     (a third gateway took it meanwhile) ends the takeover on Standby.
//     A takeover on the active gateway changes nothing.
//   - A fencing counts where this gateway held the lock or was taking
//     it (Active, or a lock step under way): then the volume is Fenced
//     and, if the store can, reconnected at once (ActReconnect), which
//     makes it Standby, ready for a takeover (a failback is asked for,
//     never taken). A fenced error anywhere else is a request that was
//     already under way when the state changed, and changes nothing.
//   - A Fenced volume whose reconnect failed (or whose store cannot)
//     stays Fenced; an open or takeover tries the reconnect again and
//     then goes on as it would from Standby.
//   - A gateway breaks one volume's lock at most Limit.Burst times in
//     any Limit.Window; a takeover past that only tries the lock
//     without breaking it, and stays Standby if it is held. Each break
//     blocklists a client on the cluster (an osdmap entry that lasts an
//     hour by default), and hosts that disagree on the active path, or
//     a hostile one, would otherwise have two gateways take the volume
//     from each other without end. A host that finds the takeover
//     refused goes on through the gateway that serves.
type core struct {
	state State
	// reconnects: the store can give a fenced volume a new client
	// (block.Reconnector); set when the core is made.
	reconnects bool
	// takingOver: a takeover is under way; broke: it broke the lock;
	// locking: an ActLock's outcome is awaited.
	takingOver, broke, locking bool
	// then is what an open or takeover that found the volume Fenced
	// does once it is reconnected (EvOpen, EvTakeover), if pending.
	then    Event
	pending bool

	// limit bounds the breaks, log records them; both outlive the
	// volume's opens here (see breakLog). limited: the last takeover
	// was past the limit, and only tried the lock without breaking it.
	limit   Limit
	log     *breakLog
	limited bool
}

// Limit bounds how often a gateway breaks one volume's lock: at most
// Burst breaks in any Window. A Burst of 0 or less means no bound, the
// default: a gateway that cannot tell a host's legitimate takeover from
// one of a pair of hosts that disagree would otherwise refuse failovers
// that a hung gateway, stopped and resumed over and over, needs.
type Limit struct {
	Burst  int
	Window time.Duration
}

// breakLog is when a gateway broke a volume's lock, oldest first, at
// most Limit.Burst times (clock nanoseconds). The Catalog keeps one per
// volume name, so that closing and opening the volume again does not
// reset it.
type breakLog struct {
	at []int64
}

// mayBreak reports whether a break at now stays within l, forgetting
// the breaks that left the window.
func (b *breakLog) mayBreak(l Limit, now int64) bool {
	if l.Burst <= 0 {
		return true
	}
	i := 0
	for i < len(b.at) && now-b.at[i] >= int64(l.Window) {
		i++
	}
	b.at = append(b.at[:0], b.at[i:]...)
	return len(b.at) < l.Burst
}

// add records a break at now.
func (b *breakLog) add(l Limit, now int64) {
	if l.Burst > 0 {
		b.at = append(b.at, now)
	}
}

// newCore is a closed volume's core; log is the volume's break log (nil:
// a fresh one).
func newCore(reconnects bool, l Limit, log *breakLog) core {
	if log == nil {
		log = &breakLog{}
	}
	return core{reconnects: reconnects, limit: l, log: log}
}

// reset makes c a closed volume's core, keeping what outlives an open.
func (c *core) reset() { *c = newCore(c.reconnects, c.limit, c.log) }

// step applies an event that happened at now (clock nanoseconds, read by
// the shell) and says what to do next.
func (c *core) step(e Event, now int64) Action {
	switch e {
	case EvClosed:
		c.reset()
		return ActNone
	case EvFenced:
		if c.state != Active && !c.locking {
			return ActNone
		}
		c.reset()
		c.state = Fenced
		if c.reconnects {
			return ActReconnect
		}
		return ActNone
	case EvLocked, EvBusy:
		c.locking = false
	}
	switch c.state {
	case Closed, Standby:
		switch e {
		case EvOpen:
			c.state, c.locking, c.limited = Standby, true, false
			return ActLock
		case EvTakeover:
			c.state, c.broke = Standby, false
			if c.limited = !c.log.mayBreak(c.limit, now); c.limited {
				// Past the limit, a takeover still takes a free lock.
				c.takingOver, c.locking = false, true
				return ActLock
			}
			c.log.add(c.limit, now)
			c.takingOver = true
			return ActBreak
		case EvLocked:
			if c.state == Standby {
				c.reset()
				c.state = Active
			}
		case EvBusy:
			c.takingOver, c.broke = false, false
		case EvBroken:
			if c.takingOver && !c.broke {
				c.broke, c.locking = true, true
				return ActLock
			}
		case EvFailed:
			c.takingOver, c.broke, c.locking = false, false, false
		}
	case Fenced:
		switch e {
		case EvOpen, EvTakeover:
			if c.reconnects {
				c.then, c.pending = e, true
				return ActReconnect
			}
		case EvReconnected:
			then, pending := c.then, c.pending
			c.reset()
			c.state = Standby
			if pending {
				return c.step(then, now)
			}
		case EvFailed:
			c.pending = false
		}
	}
	// Active takes opens and takeovers as they are (it serves already).
	return ActNone
}
