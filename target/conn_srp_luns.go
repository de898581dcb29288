package target

// The shell's part of a live SRP session's LUN table
// (core_srp_luns.go): on a catalog change, the catalog listed and
// numbered, then the new LUNs' volumes opened, off the run loop on a
// goroutine the connection owns, one refresh at a time, each volume
// within Config.OpenWait (conn_srp_open.go); the run loop hands each
// result to the core.

// srpRefresh is what a refresh goroutine hands the run loop: the
// catalog numbered by LUN for catalog change gen (listed), or the
// volumes it opened for the core's new LUNs.
type srpRefresh struct {
	gen    uint64
	listed bool
	byLUN  []string
	err    error
	opened []srpOpened
}

// srpLUNsStep, on the run loop, hands a finished refresh step to the
// core, starts the next step it asks for, and starts a refresh when the
// catalog changed and none is running (a change during a refresh
// starts another once it ends: the one running may have listed the
// catalog before the change).
func (c *conn) srpLUNsStep() {
	c.nexusMu.Lock()
	r := c.refreshIn
	c.refreshIn = nil
	c.nexusMu.Unlock()
	if r != nil {
		c.refreshing = false
		if r.listed {
			if r.err != nil {
				c.log.Warn("SRP LUNs not updated after a catalog change", "err", r.err, "conn", c.id)
			}
			if open := c.core.srpCatalog(r.gen, r.byLUN, r.err); len(open) > 0 {
				nexus := c.srpNexus()
				c.srpRefreshGo(func() *srpRefresh { return &srpRefresh{gen: r.gen, opened: c.srpOpenAll(open, nexus)} })
			}
		} else {
			for i := range r.opened {
				r.opened[i].state = stateOf(r.opened[i].vol)
			}
			c.core.srpAttachNew(r.gen, r.opened)
			countWriters(c.core.srpTakeAttached())
		}
	}
	if c.refreshing || !c.lunsChanged.Swap(false) {
		return
	}
	if s := c.core.srp; s != nil && s.nx != nil {
		c.srpRefreshGo(c.srpListLUNs)
	}
}

// srpRefreshGo runs step on a goroutine of the connection's
// (refreshers, which teardown waits for) and posts its result to the
// run loop.
func (c *conn) srpRefreshGo(step func() *srpRefresh) {
	c.refreshing = true
	c.refreshers.Add(1)
	go func() {
		defer c.refreshers.Done()
		c.srpRefreshPost(step())
	}()
}

// srpRefreshPost hands r to the run loop; once the connection has
// ended (nexusShutdown), r's volumes are closed here instead.
func (c *conn) srpRefreshPost(r *srpRefresh) {
	c.nexusMu.Lock()
	if c.nexusShut {
		c.nexusMu.Unlock()
		c.srpCloseOpened(r)
		return
	}
	c.refreshIn = r
	c.nexusMu.Unlock()
	c.policyChanged()
}

// srpCloseOpened closes the volumes of a refresh no core took.
func (c *conn) srpCloseOpened(r *srpRefresh) {
	if r == nil {
		return
	}
	for _, v := range r.opened {
		if v.vol != nil {
			if err := closeVolume(v.vol); err != nil {
				c.log.Warn("close volume", "volume", v.name, "conn", c.id, "err", err)
			}
		}
	}
}

// srpListLUNs lists the catalog and numbers it through the target's LUN
// map, which saves any new number durably before it returns: no host
// hears of a number a restart could give to another volume. The
// generation is read first, so the table is at least that change's.
func (c *conn) srpListLUNs() *srpRefresh {
	r := &srpRefresh{gen: c.t.srpNexuses.catalogGen.Load(), listed: true}
	list, err := c.t.cfg.Catalog.List()
	if err == nil {
		var left []string
		r.byLUN, left, err = c.t.luns.names(list)
		if len(left) > 0 {
			c.log.Warn("volumes without an SRP LUN: every number is taken", "volumes", left, "max_luns", srpMaxLUNs)
		}
	}
	r.err = err
	return r
}
