package target

// The shell's part of an SRP login: the catalog calls the core's login
// decision needs and the volumes it opens, made on the connection's own
// goroutine before its loop starts.

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/internal/srp"
)

// srpLogin lists the catalog and lets the core decide the login; an
// accepted channel then joins its I_T nexus, or with SINGLE replaces the
// nexus's other channels: they end, and their volume calls finish,
// before the accept goes out, as gosrp's channel reinstatement does (a
// write an old channel had fetched must not land after the initiator
// re-issued it on the new one).
func (c *conn) srpLogin(req *srp.LoginRequest) srpLoginResult {
	// Read before the list: the table is at least this change's
	// (srpNexus.tableAt); a later change reaches c through t.conns.
	gen := c.t.srpNexuses.catalogGen.Load()
	list, err := c.t.cfg.Catalog.List()
	var byLUN []string
	if err == nil {
		var left []string
		byLUN, left, err = c.t.luns.names(list)
		if len(left) > 0 {
			c.log.Warn("volumes without an SRP LUN: every number is taken", "volumes", left, "max_luns", srpMaxLUNs)
		}
	}
	key := srpKeyPrefix + srpInitiatorName(req.InitiatorPortID) + "\x00" + srpInitiatorName(req.TargetPortID)
	res := c.core.srpLogin(req, byLUN, err, c.t.channels(c, key))
	if !res.ok {
		return res
	}
	// Joined before SINGLE ends the older channels, so that the nexus,
	// and what it has yet to report, outlives them.
	c.srpNx = c.t.srpNexuses.join(key, c.id, gen)
	if req.Flags&srp.MultiChanMask == srp.MultiChanMulti {
		c.chanKey.Store(&key)
		return res
	}
	if !c.t.reinstate(c, key) {
		c.srpLeave()
		return c.core.srpRefuse(req, srp.RejectInsufficientResources, "an older channel of this I_T nexus did not finish its I/O in time")
	}
	return res
}

// srpLeave counts the connection out of its SRP I_T nexus, if it joined
// one; release calls it, once the connection's I/O is done.
func (c *conn) srpLeave() {
	if c.srpNx != nil {
		c.t.srpNexuses.leave(c.srpNx, c.id)
		c.srpNx = nil
	}
}

// channels counts the connections other than c serving the channel or
// nexus key.
func (t *Target) channels(c *conn, key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, o := range t.conns {
		if k := o.chanKey.Load(); o != c && k != nil && *k == key {
			n++
		}
	}
	return n
}

// srpOpen opens the volumes of the session's LUNs (names by LUN, ""
// for none) and hands them to the core. A volume that fails to open
// leaves its LUN empty: the initiator sees LOGICAL UNIT NOT SUPPORTED
// there, and the failure is logged; one that has not opened within
// OpenWait is answered NOT READY until it opens, and then added
// (conn_srp_open.go).
func (c *conn) srpOpen(names []string) {
	var luns []srpNewLUN
	for i, name := range names {
		if name != "" {
			luns = append(luns, srpNewLUN{lun: i, name: name})
		}
	}
	vols := make([]srpVolume, len(names))
	for _, o := range c.srpOpenAll(luns, c.srpNexus()) {
		vols[o.lun] = o.srpVolume
		vols[o.lun].state = stateOf(o.vol)
	}
	c.core.srpAttach(c.srpNx, vols)
	countWriters(c.core.srpTakeAttached())
}

// srpNexus names the session's I_T nexus: its initiator and target port
// identifiers.
func (c *conn) srpNexus() string {
	s := c.core.srp
	return srpInitiatorName(s.port) + "\x00" + srpInitiatorName(s.tport)
}

// catalogChanged asks the run loop to bring an SRP session's LUN table
// up to the catalog's (srpLUNsStep, conn_srp_luns.go). It never blocks.
func (c *conn) catalogChanged() {
	c.lunsChanged.Store(true)
	c.policyChanged()
}

// nexusMsg is one thing another channel of the nexus asks of a
// connection or tells it: abort the commands of a unit, or (done ≥ 0)
// that the commands the task management function in slot done had them
// abort have stopped.
type nexusMsg struct {
	abort *peerAbort
	done  int32
}

// peerAbort is an SRP task management function received on one channel
// (from, its slot) carried to the nexus's other channels, or for a
// LOGICAL UNIT RESET (reset) to every other SRP channel: each aborts its
// commands of unit (another nexus's, of unit's volume), and the last to
// finish tells from.
type peerAbort struct {
	from  *conn
	slot  int32
	unit  *srpUnit
	reset bool
	left  atomic.Int32
}

// finish counts one channel done; the last tells the function's own.
func (p *peerAbort) finish() {
	if p.left.Add(-1) == 0 {
		p.from.nexusPost(nexusMsg{done: p.slot})
	}
}

// srpKeyPrefix begins the channel key of every SRP connection (srpLogin).
const srpKeyPrefix = "srp\x00"

// nexusAbort carries the core's task management function x to the
// other channels of the nexus (those logged in with its key now), and
// a reset to every SRP connection logged in now: one that has nothing
// of the unit finishes at once. It never blocks: each hears of it on
// its own run loop.
func (c *conn) nexusAbort(x srpNexusAbort) {
	p := &peerAbort{from: c, slot: x.slot, unit: x.unit, reset: x.reset}
	var peers []*conn
	if k := c.chanKey.Load(); k != nil {
		c.t.mu.Lock()
		for _, o := range c.t.conns {
			ok := o.chanKey.Load()
			if o != c && ok != nil && (*ok == *k || x.reset && strings.HasPrefix(*ok, srpKeyPrefix)) {
				peers = append(peers, o)
			}
		}
		c.t.mu.Unlock()
	}
	p.left.Store(int32(len(peers)) + 1) // + 1 until every peer has it
	for _, o := range peers {
		o.nexusPost(nexusMsg{abort: p})
	}
	p.finish()
}

// nexusPost hands m to the connection's run loop; a connection that has
// ended finishes an abort at once (its commands are all stopped).
func (c *conn) nexusPost(m nexusMsg) {
	c.nexusMu.Lock()
	if c.nexusShut {
		c.nexusMu.Unlock()
		if m.abort != nil {
			m.abort.finish()
		}
		return
	}
	c.nexusIn = append(c.nexusIn, m)
	c.nexusMu.Unlock()
	c.policyChanged()
}

// nexusTake gives the core what the nexus's other channels posted.
func (c *conn) nexusTake() {
	c.nexusMu.Lock()
	in := c.nexusIn
	c.nexusIn = nil
	c.nexusMu.Unlock()
	for _, m := range in {
		if m.abort != nil {
			c.core.srpPeerAbort(m.abort.unit, m.abort.reset, m.abort)
		} else {
			c.core.srpPeersDone(m.done)
		}
	}
}

// nexusShutdown, in teardown once the last job is done, takes nothing
// more and finishes every abort another channel is waiting for here:
// this connection's commands have all stopped. Volumes a LUN refresh
// opened and the core never took are closed, and those opened late
// for an OPEN or a LUN that nothing took (shutOpens).
func (c *conn) nexusShutdown() {
	c.nexusMu.Lock()
	c.nexusShut = true
	in, r := c.nexusIn, c.refreshIn
	c.nexusIn, c.refreshIn = nil, nil
	c.nexusMu.Unlock()
	c.srpCloseOpened(r)
	c.shutOpens()
	for _, m := range in {
		if m.abort != nil {
			m.abort.finish()
		}
	}
	c.core.srpPeersClosed()
	for _, tok := range c.core.acts.peerAborted {
		tok.(*peerAbort).finish()
	}
	c.core.acts.peerAborted = c.core.acts.peerAborted[:0]
}

// A connection logs at most tmfLogBurst lines of each kind of task
// management (its own functions, or another nexus's aborting its
// commands) per tmfLogWindow, and counts the rest into its next line, as
// refused connections are counted (admit.go). Every function is answered
// (SAM-5 7.1), so a host that resets a unit in a loop would otherwise
// write a line per reset here, and one per reset that caught commands on
// every other nexus's connection. The burst keeps what a host's error
// handling sends (a few ABORT TASKs, then a LOGICAL UNIT RESET) and a
// handful of deliberate resets (test/rxe's sg_reset phase counts them)
// one line each.
const (
	tmfLogWindow = time.Minute
	tmfLogBurst  = 32
)

// tmfLog is one kind of task management line of a connection: the
// current window, and what was left out since the last line.
type tmfLog struct {
	start   int64 // when the window began (conn.now)
	lines   int   // lines logged in it
	n       int   // functions left out since the last line
	aborted int   // the commands they aborted
	last    srp.TaskFunc
}

// logTaskMgmt logs a task management function at Info: each says a host
// gave up on commands (ABORT TASK after its timeout) or reset a unit,
// which an operator looks for first when a host reports I/O errors. Past
// the window's burst a function is counted instead, and the next line
// carries the count (not_logged, aborted_not_logged).
func (c *conn) logTaskMgmt(e srpTaskMgmtEvent, now int64) {
	l := &c.tmfLogs[0]
	if e.peer {
		l = &c.tmfLogs[1]
	}
	if l.lines == 0 || now-l.start >= int64(tmfLogWindow) {
		l.start, l.lines = now, 0
	}
	if l.lines >= tmfLogBurst {
		l.n++
		l.aborted += e.aborted
		l.last = e.fn
		return
	}
	l.lines++
	var more []any
	if l.n > 0 {
		more = []any{"not_logged", l.n, "aborted_not_logged", l.aborted}
	}
	l.n, l.aborted = 0, 0
	if e.overlap {
		c.log.Warn("SRP overlapped command: a command came under the tag of one in flight; the I_T nexus's commands are aborted (SAM-5 5.9.4)",
			append([]any{"tag", e.tag, "aborted_here", e.aborted, "initiator", c.core.initiator, "remote", c.remote, "conn", c.id}, more...)...)
		return
	}
	if e.peer {
		c.log.Info("SRP commands aborted by another I_T nexus's task management; answered TASK ABORTED",
			append([]any{"function", e.fn.String(), "volume", e.volume, "aborted", e.aborted,
				"initiator", c.core.initiator, "remote", c.remote, "conn", c.id}, more...)...)
		return
	}
	c.log.Info("SRP task management", append([]any{"function", e.fn.String(), "lun", e.lun, "volume", e.volume, "tag", e.tag,
		"aborted_here", e.aborted, "initiator", c.core.initiator, "remote", c.remote, "conn", c.id}, more...)...)
}

// flushTaskMgmtLog, at teardown, logs the task management left out since
// each kind's last line, so that the end of a flood is counted too.
func (c *conn) flushTaskMgmtLog() {
	for i := range c.tmfLogs {
		l := &c.tmfLogs[i]
		if l.n == 0 {
			continue
		}
		c.log.Info("SRP task management not logged before the connection ended", "peer", i == 1, "not_logged", l.n,
			"aborted_not_logged", l.aborted, "last_function", l.last.String(), "initiator", c.core.initiator,
			"remote", c.remote, "conn", c.id)
		l.n, l.aborted = 0, 0
	}
}
