package target

// The core's side of a live SRP session's LUN table: what a catalog
// change does to the LUNs of a session that is logged in. LIO and SPDK
// add a LUN to a live session and the host finds it by a rescan
// (udev's, on REPORTED LUNS DATA HAS CHANGED); so does this target:
//
//  1. The shell lists the catalog and numbers it through the target's
//     LUN map (saved durably before anything below), and hands the
//     core the volumes by LUN: srpCatalog. The core retires the LUNs
//     whose volume is gone and names the new LUNs the session's
//     initiator may see, under the same rules as its login.
//  2. The shell opens those volumes off the run loop and hands them to
//     the core: srpAttachNew makes them units of the session.
//  3. The core then tells the I_T nexus that this channel's table is
//     that of the change (srpNexus.tableAt); REPORTED LUNS DATA HAS
//     CHANGED is raised on the nexus's units once every channel of the
//     nexus is there. Raised earlier, the host could send REPORT LUNS
//     on a channel that has not attached the new unit yet, and miss it
//     until the next change.
//
// A LUN number names one volume for the whole session: a LUN whose
// volume went (deleted, or its number given to another volume) is
// retired for the session, left out of REPORT LUNS and answered
// LOGICAL UNIT NOT SUPPORTED, and never given to another volume before
// the next login, whatever the LUN map does meanwhile.

import "fmt"

// srpNewLUN is a LUN a catalog change gives the session: the shell
// opens its volume (srpOpened) and hands it to srpAttachNew.
type srpNewLUN struct {
	lun  int
	name string
}

// srpOpened is the volume the shell opened for a new LUN (vol nil: the
// open failed, and the LUN stays empty).
type srpOpened struct {
	srpNewLUN
	srpVolume
}

// srpCatalog takes the catalog, numbered by the LUN map, as the shell
// listed it after catalog change gen: byLUN names its volumes by LUN
// ("" where none is), listErr says the list or the map failed (the
// session then keeps its table). It retires the LUNs whose volume is
// gone and returns the LUNs the shell must open, at most srpMaxLUNs in
// all; with none to open, the channel's table is that of gen at once.
func (c *core) srpCatalog(gen uint64, byLUN []string, listErr error) []srpNewLUN {
	if c.srp == nil || c.srp.nx == nil || c.state == connClosed {
		return nil
	}
	var open []srpNewLUN
	if listErr == nil {
		c.srpRetire(byLUN)
		// A LUN is opening while the shell opens its volume: one whose
		// volume is no longer to be opened (deleted, renumbered,
		// denied) is absent now.
		for i := range c.srp.luns {
			c.srpSetOpening(i, false)
		}
		if c.state == connActive {
			acl := c.p.acl()
			for i, name := range byLUN[:min(len(byLUN), srpMaxLUNs)] {
				if name != "" && c.srpFree(i) && c.allow(acl, name) != AccessNone {
					open = append(open, srpNewLUN{lun: i, name: name})
					c.srpGrow(i + 1)
					c.srpSetOpening(i, true)
				}
			}
		}
	}
	if len(open) == 0 {
		c.srpTableAt(gen)
	}
	return open
}

// srpFree reports whether LUN i of the session never had a volume: a
// number once used stays that volume's for the session.
func (c *core) srpFree(i int) bool {
	return i >= len(c.srp.luns) || c.srp.luns[i].ov == nil
}

// srpRetire retires the LUNs whose volume is no longer the catalog's
// volume of that number: the handle is revoked (commands to the LUN
// are answered LOGICAL UNIT NOT SUPPORTED, REPORT LUNS leaves it out)
// and the shell closes the volume once its running operations end, as
// a policy change's revocation does.
func (c *core) srpRetire(byLUN []string) {
	for i := range c.srp.luns {
		ov := c.srp.luns[i].ov
		if ov == nil || ov.revoked || (i < len(byLUN) && byLUN[i] == ov.name) {
			continue
		}
		ov.revoked = true
		c.handlesGen++
		c.acts.closeVols = append(c.acts.closeVols, ov)
		c.acts.policy = append(c.acts.policy, policyEffect{volume: ov.name, handle: ov.handle, access: AccessNone,
			reason: "the volume is no longer the catalog's volume of this LUN", retired: true})
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("LUN %d %s: volume gone, LUN retired", i, ov.name))
		}
	}
}

// srpAttachNew makes the volumes the shell opened for catalog change
// gen (srpCatalog's LUNs) logical units of the session, then records
// that the channel's table is that of gen. A volume that can no longer
// be attached (the connection is ending, its LUN was taken meanwhile,
// the access rules now deny it) goes back to the shell to close.
func (c *core) srpAttachNew(gen uint64, vols []srpOpened) {
	if c.srp == nil || c.srp.nx == nil {
		return
	}
	acl := c.p.acl()
	for k := range vols {
		v := &vols[k]
		if v.vol == nil {
			// Still opening, or its open failed.
			if v.lun < len(c.srp.luns) && c.srpFree(v.lun) {
				c.srpSetOpening(v.lun, v.opening && c.state == connActive)
			}
			continue
		}
		acc := c.allow(acl, v.name)
		switch {
		case c.state == connClosed:
			c.orphans = append(c.orphans, v.vol) // teardown closes them
			continue
		case c.state != connActive || v.lun >= srpMaxLUNs || !c.srpFree(v.lun) || acc == AccessNone:
			c.acts.closeVols = append(c.acts.closeVols, &openVol{name: v.name, vol: v.vol})
			continue
		}
		c.srpGrow(v.lun + 1)
		c.srp.names[v.lun], c.srp.access[v.lun] = v.name, acc
		c.srpAttachLUN(v.lun, &v.srpVolume, gen)
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("LUN %d %s: attached, %d blocks", v.lun, v.name, c.srp.luns[v.lun].dev.Blocks))
		}
	}
	if c.state != connClosed {
		c.srpTableAt(gen)
	}
}

// srpSetOpening is the one setter of srpLUN.opening: LUN i's volume
// is being opened (on), or not or no longer (off). A LUN with a volume
// is never opening: its volume answers for it.
func (c *core) srpSetOpening(i int, on bool) {
	lu := &c.srp.luns[i]
	if on && lu.ov != nil {
		c.noteBug(fmt.Errorf("target: SRP LUN %d set opening with volume %q attached", i, lu.ov.name))
		return
	}
	lu.opening = on
}

// srpGrow makes the session's LUN table n LUNs long. The slots of
// UNMAP and WRITE SAME commands keep a pointer into it (srpSlot.lu):
// they are pointed at the new table, where a resize or a policy change
// updates their unit.
func (c *core) srpGrow(n int) {
	s := c.srp
	if n <= len(s.luns) {
		return
	}
	luns := make([]srpLUN, n)
	copy(luns, s.luns)
	s.luns = luns
	for i := range c.slots {
		if x := &c.slots[i].srp; x.lu != nil && int(x.lun) < n {
			x.lu = &luns[x.lun]
		}
	}
	for len(s.names) < n {
		s.names = append(s.names, "")
		s.access = append(s.access, AccessNone)
	}
	for len(c.handles) < n {
		c.handles = append(c.handles, nil)
	}
}

// srpTableAt tells the I_T nexus that this channel's LUN table is that
// of catalog change gen; the nexus raises REPORTED LUNS DATA HAS
// CHANGED once all its channels are there (srpNexus.tableAt).
func (c *core) srpTableAt(gen uint64) {
	if c.srp.nx.tableAt(c.p.id, gen) && c.p.trace != nil {
		c.p.trace("catalog changed: unit attention luns-changed on every LUN")
	}
}
