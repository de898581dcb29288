package target

// Opening an SRP session's volumes without letting one hang the rest. A
// connection opens the volumes of its LUNs itself, at login and when a
// catalog change gives the session new LUNs (conn_srp_luns.go). A store
// that hangs on one volume (an RBD image whose OSDs are unreachable)
// would hold the whole open: at login the connection's run loop would
// never start, and on a catalog change the other new LUNs would never
// be attached nor their unit attention raised. So each volume opens on
// a goroutine of its own, and the caller waits at most
// Config.OpenWait: what has not opened by then is left out (its LUN
// stays empty, answered LOGICAL UNIT NOT SUPPORTED, as a failed open
// leaves it). When such a late open returns, its volume is kept for
// the connection and the target is told its catalog changed
// (Target.CatalogChanged): the refresh that follows finds the LUN new,
// takes the kept volume instead of opening it again, and raises
// REPORTED LUNS DATA HAS CHANGED on the session, as for a volume just
// created. A LUN whose open is still running is not opened a second
// time. The late goroutine cannot be stopped (a Catalog's OpenVolume
// takes no context); if the connection has ended when it returns, it
// closes what it opened, and Target.Shutdown waits for it while its
// context lasts. A gosrp OPEN bounds its open the same way
// (conn_open.go).

import (
	"sync"
	"time"
)

// srpLateOpens is a connection's record of the volume opens that
// outlived OpenWait.
type srpLateOpens struct {
	mu sync.Mutex
	// pending: the volume's open is still running.
	pending map[string]bool
	// ready: opened late, kept for the next refresh that asks for it.
	ready map[string]srpVolume
	// shut: the connection ended; late opens close what they open.
	shut bool
}

// srpOpenBatch is one call's opens: the results that came in time.
type srpOpenBatch struct {
	got  []srpVolume
	done []bool
	left int
	all  chan struct{} // closed when left reaches 0
	over bool          // the caller stopped waiting
}

// srpOpenAll opens the volumes of luns for the I_T nexus named nexus,
// each on its own goroutine, and waits for them at most OpenWait. A
// volume opened late since an earlier call is taken as it is; one
// whose open is still running, or that has not opened in time, is left
// out (vol nil); one that failed to open is logged and left out.
func (c *conn) srpOpenAll(luns []srpNewLUN, nexus string) []srpOpened {
	out := make([]srpOpened, len(luns))
	b := &srpOpenBatch{got: make([]srpVolume, len(luns)), done: make([]bool, len(luns)), all: make(chan struct{})}
	l := &c.late
	l.mu.Lock()
	for i, lu := range luns {
		out[i].srpNewLUN = lu
		if v, ok := l.ready[lu.name]; ok {
			delete(l.ready, lu.name)
			out[i].srpVolume = v
			b.done[i] = true
			continue
		}
		if l.pending[lu.name] {
			b.done[i] = true // attached once its open returns
			continue
		}
		b.left++
		c.t.wg.Add(1) // c's own count is held: Shutdown cannot be past its Wait
		go c.srpOpenOne(b, i, lu, nexus)
	}
	if b.left == 0 {
		close(b.all)
	}
	l.mu.Unlock()

	t := time.NewTimer(c.t.cfg.OpenWait)
	defer t.Stop()
	select {
	case <-b.all:
	case <-t.C:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b.over = true
	for i, lu := range luns {
		switch {
		case b.got[i].vol != nil:
			out[i].srpVolume = b.got[i]
		case !b.done[i]:
			if l.pending == nil {
				l.pending = make(map[string]bool)
			}
			l.pending[lu.name] = true
			c.log.Warn("SRP LUN left empty for now: its volume has not opened yet; it is added, with a unit attention, once it opens",
				"volume", lu.name, "lun", lu.lun, "waited", c.t.cfg.OpenWait, "conn", c.id)
		}
	}
	return out
}

// srpOpenOne opens lu's volume for batch b (index i); if b's caller has
// stopped waiting, the volume is kept for a later refresh, which the
// target is asked for, or closed if the connection has ended.
func (c *conn) srpOpenOne(b *srpOpenBatch, i int, lu srpNewLUN, nexus string) {
	defer c.t.wg.Done()
	v := c.srpOpenVolume(lu.name, lu.lun, nexus)
	l := &c.late
	l.mu.Lock()
	if !b.over {
		b.got[i], b.done[i] = v, true
		if b.left--; b.left == 0 {
			close(b.all)
		}
		l.mu.Unlock()
		return
	}
	delete(l.pending, lu.name)
	keep := v.vol != nil && !l.shut
	if keep {
		if l.ready == nil {
			l.ready = make(map[string]srpVolume)
		}
		l.ready[lu.name] = v
	}
	l.mu.Unlock()
	switch {
	case keep:
		c.log.Info("SRP LUN's volume opened late; adding it to the session", "volume", lu.name, "conn", c.id)
		c.t.CatalogChanged()
	case v.vol != nil:
		closeVolume(v.vol)
	}
}
