package target

// Opening an SRP session's volumes without letting one hang the rest. A
// connection opens the volumes of its LUNs itself, at login and when a
// catalog change gives the session new LUNs (conn_srp_luns.go), through
// the connection's bounded opens (conn_open.go): each volume on a
// goroutine of its own, all within one Config.OpenWait. A LUN whose
// volume has not opened by then is left opening for now instead of
// keeping the run loop from starting at login, or the other new LUNs
// from being attached and their unit attention raised on a catalog
// change. Its commands are answered NOT READY, LOGICAL UNIT IS IN
// PROCESS OF BECOMING READY (02h/04h/01h), which Linux retries for up
// to its command's (retries+1) × timeout (scsi_check_sense,
// scsi_io_completion_action): a host whose disk is that LUN rides
// out a restart of srpd with a slow store, where LOGICAL UNIT NOT
// SUPPORTED, what a failed open leaves, would fail its I/O. REPORT
// LUNS leaves it out until it is attached, so that a scan does not
// meet a unit the target cannot describe yet. The late open asks for a catalog refresh when
// it returns, which attaches its volume. A LUN whose open is still
// running is not waited for a second time: the refresh it asks for
// will attach it.

import "time"

// srpOpenAll opens the volumes of luns for the I_T nexus named nexus
// and waits for them at most OpenWait. A volume opened late since an
// earlier call is taken as it is; one whose open is still running, or
// that has not opened in time, is left out as opening (vol nil,
// opening); one that failed to open is logged and left out.
func (c *conn) srpOpenAll(luns []srpNewLUN, nexus string) []srpOpened {
	out := make([]srpOpened, len(luns))
	opens := make([]*runningOpen, len(luns))
	refused := 0
	for i, lu := range luns {
		out[i].srpNewLUN = lu
		var no bool
		if opens[i], no = c.joinOpen(openKey{name: lu.name}, true); no {
			refused++
		}
	}
	if refused > 0 {
		c.log.Warn("SRP LUNs left opening (answered NOT READY) for now: the store has too many volume opens that have not returned; they are tried again when one returns",
			"luns", refused, "abandoned_opens", c.t.abandoned.Load(), "conn", c.id)
	}
	t := time.NewTimer(c.t.cfg.OpenWait)
	defer t.Stop()
	expired := false
	for _, p := range opens {
		if p == nil || expired {
			continue
		}
		select {
		case <-p.done:
		case <-t.C:
			expired = true
		}
	}
	for i, p := range opens {
		if p == nil {
			out[i].opening = true // attached once its open, or an abandoned one, returns
			continue
		}
		r, ok := c.leaveOpen(p)
		lu := luns[i]
		switch {
		case !ok:
			out[i].opening = true
			c.log.Warn("SRP LUN left opening (answered NOT READY) for now: its volume has not opened yet; it is added, with a unit attention, once it opens",
				"volume", lu.name, "lun", lu.lun, "waited", c.t.cfg.OpenWait, "conn", c.id)
		case r.err != nil:
			c.log.Warn("SRP LUN left empty: open volume", "volume", lu.name, "lun", lu.lun, "conn", c.id, "err", r.err)
		default:
			out[i].srpVolume = srpVolume{vol: r.vol, info: r.info, mark: c.t.dirty.mark(lu.name, immediate(r.vol)),
				lost: c.t.dirty.lostFor(lu.name, nexus), pr: c.t.pr.volume(lu.name)}
		}
	}
	return out
}
