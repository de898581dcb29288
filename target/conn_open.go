package target

// Opening a volume without letting a hung store stop the session. A
// gosrp OPEN runs the catalog's OpenVolume and, for a takeover, the
// volume's TakeOver; an SRP session opens the volumes of its LUNs at
// login and when a catalog change gives it new ones
// (conn_srp_open.go). A store that hangs there (an RBD image whose OSDs
// are unreachable, a lock that cannot be broken) must not hold the
// rest: a gosrp OPEN held past the initiator's IOTimeout ends the
// connection, whose teardown waits for its jobs, and the login that
// reinstates the channel waits for that teardown (Target.reinstate), so
// every volume of the session would stop until the store answered; an
// SRP login would never start its run loop. An open writes nothing, so
// nothing obliges anyone to wait for it.
//
// So every open runs on a goroutine of its own, and whoever asked for
// it (the opener) waits at most Config.OpenWait, or until the
// connection ends. An OPEN whose volume has not opened by then is
// answered NOT READY, becoming ready (wire.SenseBecomingReady), which
// the initiator tries again; an SRP LUN is left opening for now,
// answered NOT READY as well (conn_srp_open.go). The open
// goes on: what it returns once no opener waits is kept for the
// connection's next opener of the volume, or closed if the connection
// has ended, and for an SRP LUN the target is told its catalog changed
// (Target.CatalogChanged), so that the refresh that follows attaches
// the kept volume and raises REPORTED LUNS DATA HAS CHANGED, as for a
// volume just created. An opener of a volume whose open is running
// waits for that one instead of starting another, so a hung store
// costs one goroutine per volume and connection, not one per try. The
// goroutine cannot be stopped (OpenVolume takes no context);
// Target.Shutdown waits for it while its context lasts, as for a
// connection.
//
// An open nobody waits for any more (abandoned) is a goroutine the peer
// made and cannot take back, and a gosrp OPEN names any volume it
// likes: a store that hangs on every name (a cluster out of reach
// hangs on names it has no image for, too) would let one initiator pile
// up goroutines by opening names one after another, and reconnecting
// to start over. So no open starts while the connection has
// maxConnAbandonedOpens abandoned gosrp opens, or the target
// maxAbandonedOpens of any kind: the OPEN is answered NOT READY at
// once, and the SRP LUN left opening, to be tried again when an
// abandoned open returns. A healthy store abandons nothing, so neither
// bound is ever met there.

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// The bounds on abandoned opens. maxConnAbandonedOpens leaves a session
// a dozen volumes that open slowly; maxAbandonedOpens is the whole
// target's, a few kilobytes of stack each.
const (
	maxConnAbandonedOpens = 16
	maxAbandonedOpens     = 256
)

// errOpenPending answers an OPEN whose volume has not opened within
// Config.OpenWait (SenseBecomingReady).
var errOpenPending = errors.New("the volume's store has not opened it yet; try again")

// openKey names one kind of open: a takeover does more than an open, so
// an open without one does not satisfy it.
type openKey struct {
	name     string
	takeover bool
}

// openResult is what an open returned.
type openResult struct {
	vol     Volume
	info    VolumeInfo
	standby bool // the volume is a PathStater in standby
	err     error
}

// runningOpen is one open on its goroutine, or a kept volume handed to
// an opener.
type runningOpen struct {
	done     chan struct{} // closed when res is set
	res      openResult
	waiting  int  // openers waiting for it
	finished bool // res is set
	taken    bool // an opener took res, or nobody was left to take it
	// abandoned: every opener stopped waiting before it finished, and
	// the connection's and the target's counts include it.
	abandoned bool
	// refresh: an SRP LUN asked for the volume; opened late, it is
	// attached by the catalog refresh the target is asked for.
	refresh bool
}

// connOpens are a connection's volume opens that run, or ran, past
// their openers' wait.
type connOpens struct {
	mu      sync.Mutex
	running map[openKey]*runningOpen
	// ready: opened after its openers stopped waiting, kept for the next.
	ready map[openKey]openResult
	// shut: the connection ended; opens close what they open.
	shut bool
	// abandoned counts the running gosrp opens nobody waits for.
	abandoned int
}

// joinOpen makes the caller an opener of k and returns the open to wait
// for (done) and then leave (leaveOpen): the volume kept from a late
// open, the open running, or a new one. For an SRP LUN (lun), an open
// already running is not joined (nil: the refresh it asks for attaches
// its volume), and one that returns late asks for a refresh. A new open
// the bounds on abandoned ones refuse is nil too, with refused set.
func (c *conn) joinOpen(k openKey, lun bool) (p *runningOpen, refused bool) {
	l := &c.opens
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.ready[k]; ok {
		delete(l.ready, k)
		done := make(chan struct{})
		close(done)
		return &runningOpen{done: done, res: r, finished: true, waiting: 1}, false
	}
	p = l.running[k]
	if p != nil && lun {
		return nil, false
	}
	if p == nil {
		if (!lun && l.abandoned >= maxConnAbandonedOpens) || c.t.abandoned.Load() >= c.t.maxAbandoned {
			if lun {
				c.t.lunRefused.Store(true)
			}
			return nil, true
		}
		p = &runningOpen{done: make(chan struct{}), refresh: lun}
		if l.running == nil {
			l.running = make(map[openKey]*runningOpen)
		}
		l.running[k] = p
		c.t.wg.Add(1) // c's own count is held: Shutdown cannot be past its Wait
		go c.openVolume(k, p)
	}
	p.waiting++
	return p, false
}

// leaveOpen stops the caller's wait for p and returns p's result if it
// has one that no other opener took.
func (c *conn) leaveOpen(p *runningOpen) (openResult, bool) {
	l := &c.opens
	l.mu.Lock()
	defer l.mu.Unlock()
	p.waiting--
	if p.finished && !p.taken {
		p.taken = true
		return p.res, true
	}
	if p.waiting == 0 && !p.finished && !p.abandoned {
		p.abandoned = true
		if !p.refresh {
			l.abandoned++
		}
		c.t.abandoned.Add(1)
	}
	return openResult{}, false
}

// runOpen carries out the open of a gosrp OPEN job: the volume in
// s.opened and s.openInfo, or s.err (errOpenPending if it did not open
// in time).
func (c *conn) runOpen(s *slot) {
	k := openKey{s.ctl.Volume, s.ctl.Takeover}
	wait := time.NewTimer(c.t.cfg.OpenWait)
	defer wait.Stop()
	for {
		p, refused := c.joinOpen(k, false)
		if refused {
			s.opened, s.err = nil, errOpenPending
			return
		}
		expired := false
		select {
		case <-p.done:
		case <-wait.C:
			expired = true
		case <-c.killCh:
			expired = true
		case <-c.endCh:
			expired = true
		}
		if r, ok := c.leaveOpen(p); ok {
			s.setOpened(r)
			return
		}
		if expired || !p.finished {
			s.opened, s.err = nil, errOpenPending
			return
		}
		// Another OPEN of the volume took this open's volume: open one
		// of our own, within what is left of the wait.
	}
}

// setOpened records an open's result in the OPEN's slot.
func (s *slot) setOpened(r openResult) {
	s.opened, s.openInfo, s.err = r.vol, r.info, r.err
	s.openInfo.Standby = r.standby
	if ps, ok := r.vol.(PathStater); ok {
		// The state now, not when a kept volume was opened.
		s.openInfo.Standby = ps.Standby()
	}
}

// openFor opens k's volume, and takes it over if k says so (a volume
// that is not a PathStater needs no takeover), turning a panic of the
// store into an error as runJob does.
func openFor(cat Catalog, k openKey) (r openResult) {
	defer func() {
		if x := recover(); x != nil {
			r = openResult{err: fmt.Errorf("target: open of %q panicked: %v", k.name, x)}
		}
	}()
	if r.vol, r.info, r.err = openVolume(cat, k.name); r.err != nil {
		return r
	}
	ps, ok := r.vol.(PathStater)
	if !ok {
		return r
	}
	if k.takeover {
		if err := ps.TakeOver(); err != nil {
			closeVolume(r.vol)
			return openResult{err: fmt.Errorf("take over: %w", err)}
		}
	}
	r.standby = ps.Standby()
	return r
}

// openVolume runs openFor for the openers waiting in p; if none is left
// to take the volume, it keeps it for the connection's next opener, or
// closes it if the connection has ended.
func (c *conn) openVolume(k openKey, p *runningOpen) {
	defer c.t.wg.Done()
	r := openFor(c.t.cfg.Catalog, k)
	l := &c.opens
	l.mu.Lock()
	delete(l.running, k)
	p.res, p.finished = r, true
	close(p.done)
	orphan, refresh, abandoned := p.waiting == 0, p.refresh, p.abandoned
	if abandoned {
		if !refresh {
			l.abandoned--
		}
		c.t.abandoned.Add(-1)
	}
	var drop []Volume
	kept := false
	if orphan {
		p.taken = true
		switch {
		case r.err != nil:
		case l.shut:
			drop = append(drop, r.vol)
		default:
			if l.ready == nil {
				l.ready = make(map[openKey]openResult)
			}
			if old, ok := l.ready[k]; ok {
				drop = append(drop, old.vol) // one kept volume of a kind is enough
			}
			l.ready[k] = r
			kept = true
		}
	}
	l.mu.Unlock()
	for _, v := range drop {
		closeVolume(v)
	}
	switch {
	case orphan && r.err != nil:
		c.log.Warn("a volume's open failed after its opener stopped waiting", "volume", k.name, "err", r.err, "conn", c.id)
	case kept && refresh:
		c.log.Info("an SRP LUN's volume opened late; adding it to the session", "volume", k.name, "conn", c.id)
	case kept:
		c.log.Info("a volume opened after its OPEN stopped waiting; kept for the next OPEN", "volume", k.name, "conn", c.id)
	}
	// A refused LUN is tried again by the refresh that a catalog change
	// starts, as is the LUN just kept.
	if refused := abandoned && c.t.lunRefused.Swap(false); refused || (kept && refresh) {
		c.t.CatalogChanged()
	}
}

// shutOpens, in teardown, closes the volumes opened late that nothing
// took; opens still running close theirs when they return.
func (c *conn) shutOpens() {
	c.opens.mu.Lock()
	c.opens.shut = true
	ready := c.opens.ready
	c.opens.ready = nil
	c.opens.mu.Unlock()
	for _, r := range ready {
		closeVolume(r.vol)
	}
}
