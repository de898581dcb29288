package target

// Opening a volume for a gosrp OPEN without letting a hung store stop
// the session. An OPEN runs the catalog's OpenVolume and, for a
// takeover, the volume's TakeOver. A store that hangs there (an RBD
// image whose OSDs are unreachable, a lock that cannot be broken)
// would hold the OPEN past the initiator's IOTimeout; the initiator
// then ends the connection, whose teardown waits for its jobs, and the
// login that reinstates the channel waits for that teardown
// (Target.reinstate): every volume of the session would stop until the
// store answered. An OPEN writes nothing, so nothing obliges anyone to
// wait for it. The open runs on a goroutine of its own and the OPEN
// waits for it at most Config.OpenWait, or until the connection ends;
// one that has not returned by then is answered NOT READY, becoming
// ready (wire.SenseBecomingReady), which the initiator tries again.
// The open goes on: what it returns is kept for the connection's next
// OPEN of the volume, so that a store slower than OpenWait still opens
// it in as many tries as it takes, or closed if the connection has
// ended. An OPEN of a volume whose open is running waits for that one
// instead of starting another, so a hung store costs one goroutine per
// volume and connection, not one per try. The goroutine cannot be
// stopped (OpenVolume takes no context); Target.Shutdown waits for it
// while its context lasts, as for a connection.

import (
	"errors"
	"fmt"
	"sync"
	"time"
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

// runningOpen is one open on its goroutine.
type runningOpen struct {
	done     chan struct{} // closed when res is set
	res      openResult
	waiting  int  // OPENs waiting for it
	finished bool // res is set
	taken    bool // an OPEN took res, or nobody was left to take it
}

// connOpens are a connection's opens that ran, or still run, past
// their OPEN's wait.
type connOpens struct {
	mu      sync.Mutex
	running map[openKey]*runningOpen
	// ready: opened after its OPENs stopped waiting, kept for the next.
	ready map[openKey]openResult
	// shut: the connection ended; opens close what they open.
	shut bool
}

// runOpen carries out the open of an OPEN job: the volume in s.opened
// and s.openInfo, or s.err (errOpenPending if it did not open in time).
func (c *conn) runOpen(s *slot) {
	k := openKey{s.ctl.Volume, s.ctl.Takeover}
	wait := time.NewTimer(c.t.cfg.OpenWait)
	defer wait.Stop()
	l := &c.opens
	for {
		l.mu.Lock()
		if r, ok := l.ready[k]; ok {
			delete(l.ready, k)
			l.mu.Unlock()
			s.setOpened(r)
			return
		}
		p := l.running[k]
		if p == nil {
			p = &runningOpen{done: make(chan struct{})}
			if l.running == nil {
				l.running = make(map[openKey]*runningOpen)
			}
			l.running[k] = p
			c.t.wg.Add(1) // c's own count is held: Shutdown cannot be past its Wait
			go c.openVolume(k, p)
		}
		p.waiting++
		l.mu.Unlock()

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
		l.mu.Lock()
		p.waiting--
		if p.finished && !p.taken {
			p.taken = true
			l.mu.Unlock()
			s.setOpened(p.res)
			return
		}
		l.mu.Unlock()
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

// openFor opens k's volume for an OPEN, and takes it over if k says so
// (a volume that is not a PathStater needs no takeover), turning a
// panic of the store into an error as runJob does.
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

// openVolume runs openFor for the OPENs waiting in p; if none is left to
// take the volume, it keeps it for the connection's next OPEN, or closes
// it if the connection has ended.
func (c *conn) openVolume(k openKey, p *runningOpen) {
	defer c.t.wg.Done()
	r := openFor(c.t.cfg.Catalog, k)
	l := &c.opens
	l.mu.Lock()
	delete(l.running, k)
	p.res, p.finished = r, true
	close(p.done)
	orphan := p.waiting == 0
	var drop []Volume
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
		}
	}
	l.mu.Unlock()
	for _, v := range drop {
		closeVolume(v)
	}
	switch {
	case orphan && r.err != nil:
		c.log.Warn("a volume's open failed after its OPEN stopped waiting", "volume", k.name, "err", r.err, "conn", c.id)
	case orphan && len(drop) == 0:
		c.log.Info("a volume opened after its OPEN stopped waiting; kept for the next OPEN", "volume", k.name, "conn", c.id)
	}
}

// shutOpens, in teardown, closes the volumes opened late, for a gosrp
// OPEN or an SRP LUN (conn_srp_open.go), that nothing took; opens still
// running close theirs when they return.
func (c *conn) shutOpens() {
	var vols []Volume
	c.opens.mu.Lock()
	c.opens.shut = true
	for _, r := range c.opens.ready {
		vols = append(vols, r.vol)
	}
	c.opens.ready = nil
	c.opens.mu.Unlock()
	c.late.mu.Lock()
	c.late.shut = true
	for _, v := range c.late.ready {
		vols = append(vols, v.vol)
	}
	c.late.ready = nil
	c.late.mu.Unlock()
	for _, v := range vols {
		closeVolume(v)
	}
}
