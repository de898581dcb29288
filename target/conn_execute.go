package target

import (
	"fmt"
)

// execute carries out the core's actions: receives, sends, jobs.
func (c *conn) execute() {
	a := &c.core.acts
	c.publishOpen(a.disconnect || c.core.state == connClosed)
	if a.loggedIn && !a.disconnect && c.core.session != 0 {
		// Before the login response goes out, retire any older connection
		// of the same initiator channel, volume I/O and all. An initiator
		// that names no session opts out.
		key := fmt.Sprintf("%s\x00%d\x00%d", c.core.initiator, c.core.session, c.core.channel)
		if !c.t.reinstate(c, key) {
			c.core.close("an older connection of this channel did not finish its I/O in time", false)
			a.send = a.send[:0]
		}
	}
	if a.loggedIn {
		// The pre-login slot is given back before the login response
		// goes out: a client told it is logged in must not still hold
		// one, or a newcomer that follows it is refused for a slot that
		// is about to be free.
		c.t.loginDone(c)
	}
	if len(a.recv) > 0 && !a.disconnect {
		if n, err := c.qp.PostRecv(a.recv); err != nil {
			c.core.postFailed(fmt.Errorf("post %d receives (%d accepted): %w", len(a.recv), n, err))
		}
	}
	if len(a.send) > 0 {
		// Sends queued before a disconnect (a LoginReject, a last response)
		// are still posted; the disconnect waits for nothing more.
		if n, err := c.qp.PostSend(a.send); err != nil {
			c.core.postFailed(fmt.Errorf("post %d sends (%d accepted): %w", len(a.send), n, err))
		}
	}
	batches := c.batches[:0] // one per volume with plain writes in this pass
	for _, idx := range a.jobs {
		s := &c.core.slots[idx]
		if s.job >= jobRead && s.job <= jobWriteZeroes && s.ov.now && (s.job == jobRead || s.ov.mark == nil || s.ov.mark.durable()) {
			// A memory volume's I/O is a copy: run it here, and report
			// it on the run loop's next pass (finishInline) without
			// waking a worker or passing it through a channel. Not a
			// write that must wait for the volume's dirty mark to reach
			// stable storage (volMark.beforeWrite): a worker waits.
			runJob(s, c.t.cfg.Catalog)
			c.inline = append(c.inline, idx)
			continue
		}
		if s.job == jobWrite && s.ov.batch != nil {
			// Plain writes to a batching volume that became ready in
			// this pass are written as one batch (runBatch).
			i := 0
			for i < len(batches) && batches[i].ov != s.ov {
				i++
			}
			if i == len(batches) {
				batches = append(batches, batchChain{ov: s.ov, lead: idx})
			} else {
				c.core.slots[batches[i].tail].next = idx
			}
			batches[i].tail = idx
			continue
		}
		c.jobs <- idx // never blocks: capacity covers every slot
	}
	for _, b := range batches {
		lead := b.lead
		if b.ov.batch.Stalled() || b.ov.mark != nil && !b.ov.mark.durable() {
			// The worker waits for the volume, or for its dirty mark
			// to reach stable storage (volMark.beforeWrite).
			c.jobs <- lead
		} else {
			// Unless the volume is holding writes back, the batch costs
			// CPU only: run it here. On a worker it cost two goroutine
			// hand-offs per batch, and each woke an idle thread; with
			// pebble on tmpfs, bench randwrite 4 KiB QD32 over tcp ran
			// 104k-111k IOPS this way against 90k-94k on a worker.
			c.wbufs, c.woffs = runBatch(c.core.slots, lead, c.wbufs[:0], c.woffs[:0])
			c.inline = append(c.inline, lead) // finishInline walks the chain
		}
	}
	clear(batches) // no openVol outlives its handle here
	c.batches = batches[:0]
	for _, e := range a.policy {
		if e.volume == "" {
			c.log.Info("session ended by a policy change", "reason", e.reason, "initiator", c.core.initiator,
				"remote", c.remote, "conn", c.id)
			continue
		}
		if e.retired {
			c.log.Warn("SRP LUN retired for the session: its volume left the catalog; the LUN stays empty until the next login",
				"lun", e.handle-1, "volume", e.volume, "reason", e.reason, "initiator", c.core.initiator, "remote", c.remote, "conn", c.id)
			continue
		}
		c.log.Info("open volume re-evaluated after a policy change", "reason", e.reason, "volume", e.volume,
			"handle", e.handle, "access", e.access.String(), "initiator", c.core.initiator, "remote", c.remote, "conn", c.id)
	}
	for _, ov := range a.closeVols {
		c.closeRevoked(ov)
	}
	for _, name := range a.lossTold {
		c.t.dirty.told(name, c.srpNexus())
	}
	for _, e := range a.taskMgmt {
		c.logTaskMgmt(e, c.now())
	}
	for _, x := range a.srpAborts {
		c.nexusAbort(x)
	}
	for _, tok := range a.peerAborted {
		tok.(*peerAbort).finish()
	}
	if a.loggedIn {
		ini := c.core.initiator
		c.iniName.Store(&ini)
		c.creditsGr.Store(int32(c.core.credits))
		c.log.Debug("login", "remote", c.remote, "initiator", ini, "credits", c.core.credits)
	}
	c.inUse.Store(int32(c.core.outstanding))
	c.stateNum.Store(uint32(c.core.state))
	c.nopen.Store(int32(c.core.nhandles))
	a.reset()
}

// publishOpen republishes what the connection has open if a handle was
// opened, closed or revoked, and clears them when the connection ends.
// execute calls it before posting the step's sends, so an initiator that
// has the answer to its CLOSE (or whose connection ended) is no longer
// counted by Target.OpenSessions.
func (c *conn) publishOpen(ending bool) {
	switch {
	case ending:
		c.opened.Store(nil)
		c.openGen = c.core.handlesGen + 1 // nothing is published again
	case c.core.handlesGen != c.openGen && c.core.state != connClosed:
		c.openGen = c.core.handlesGen
		o := &openedVols{session: fmt.Sprintf("conn %d", c.id)}
		switch {
		case c.core.srp != nil:
			// The channels of one I_T nexus are one SRP session.
			o.session = "srp\x00" + c.srpNexus()
		case c.core.session != 0:
			// The channels of one initiator session are one session.
			o.session = fmt.Sprintf("%s\x00%d", c.core.initiator, c.core.session)
		}
		for _, ov := range c.core.openVolumes() {
			o.names = append(o.names, ov.name)
		}
		c.opened.Store(o)
	}
}

// openedVols are the volumes one connection has open, and the session it
// is a channel of.
type openedVols struct {
	session string
	names   []string
}

// closeRevoked closes a volume the policy took away, off the run loop:
// it waits for the operations the volume is still running (they were
// handed to it before the revocation, and nothing new starts on it).
func (c *conn) closeRevoked(ov *openVol) {
	c.closers.Add(1)
	go func() {
		defer c.closers.Done()
		ov.inflight.Wait()
		if err := closeVolume(ov.vol); err != nil {
			c.log.Warn("close revoked volume", "volume", ov.name, "conn", c.id, "err", err)
		}
		ov.releasePR()
	}()
}

// finishInline reports the jobs execute ran inline, all with one clock
// reading; it reports whether there were any. Sending each through the
// done channel cost a channel send and a select per I/O: 4–5 % of a memory
// target's CPU at 4 KiB QD32 over shm.
func (c *conn) finishInline() bool {
	if len(c.inline) == 0 {
		return false
	}
	now := c.now()
	for _, idx := range c.inline {
		c.finish(idx, now)
	}
	c.inline = c.inline[:0]
	return true
}

// batchChain is a chain of plain writes to one volume, gathered in one pass
// (see BatchWriter); the slots' next fields link lead to tail.
type batchChain struct {
	ov         *openVol
	lead, tail int32
}

// finish reports the finished job of slot idx and, if idx leads a write
// batch, of every slot in its chain, unlinking them.
func (c *conn) finish(idx int32, now int64) {
	for idx >= 0 {
		s := &c.core.slots[idx]
		next := s.next
		s.next = -1
		c.core.backendDone(idx, now)
		idx = next
	}
}

func (c *conn) worker() {
	defer c.workers.Done()
	cat := c.t.cfg.Catalog
	var bufs [][]byte
	var offs []int64
	for idx := range c.jobs {
		if s := &c.core.slots[idx]; s.next >= 0 {
			bufs, offs = runBatch(c.core.slots, idx, bufs[:0], offs[:0])
		} else if s.job == jobOpen {
			c.runOpen(s)
			if s.err == nil {
				s.err = openWriter(s)
			}
		} else {
			runJob(&c.core.slots[idx], cat)
		}
		c.done <- idx
	}
}
