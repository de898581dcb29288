package target

// The state an SRP I_T nexus keeps across its channels. ib_srp logs in
// several channels (RDMA connections) per (initiator port, target port)
// pair, ch_count of them, and each is a connection with a core of its
// own; but SAM-5 keeps unit attentions per I_T nexus (5.14: reported
// once to the nexus, then cleared for it), and the host may send the
// next command, or the flush that must hear of a lost write cache, on
// any channel. So the scsi.Nexus of each logical unit lives here,
// shared by the nexus's channels: the first command that reports a
// condition, on whichever channel, clears it for all of them.
//
// The cores run the model under the unit's lock only while something is
// pending (srpUnit.armed, one atomic load per command otherwise), so
// the channels of a busy nexus do not contend in steady state.

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/scsi"
)

// srpNexusTable is the target's SRP I_T nexuses with a channel logged
// in, by key (initiator port, target port).
type srpNexusTable struct {
	mu sync.Mutex
	m  map[string]*srpNexus
	// catalogGen counts Target.CatalogChanged calls: a nexus hears of
	// each change once, when all its channels have the LUN table of
	// that change (srpNexus.tableAt), and one made after a change has
	// nothing to hear.
	catalogGen atomic.Uint64
}

// join returns the nexus named key, made on its first channel, and
// counts channel ch in, its LUN table that of catalog change gen (the
// generation read before its login listed the catalog); leave counts
// it out.
func (t *srpNexusTable) join(key string, ch, gen uint64) *srpNexus {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*srpNexus{}
	}
	n := t.m[key]
	if n == nil {
		n = newSRPNexus(t, key)
		n.lunsGen = gen
		t.m[key] = n
	}
	n.refs++
	n.mu.Lock()
	n.chans[ch] = gen
	n.mu.Unlock()
	return n
}

// leave counts channel ch of n out; the nexus, and its pending unit
// attentions, go with its last channel (a new login is a new nexus,
// SAM-5's power on for it: nothing to report). A channel that leaves
// may be the last the nexus waited for to raise a catalog change.
func (t *srpNexusTable) leave(n *srpNexus, ch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n.mu.Lock()
	delete(n.chans, ch)
	n.raiseLocked()
	n.mu.Unlock()
	if n.refs--; n.refs == 0 && t.m[n.key] == n {
		delete(t.m, n.key)
	}
}

// resetOthers raises ResetOccurred on the unit of volume on every nexus
// but from: a LOGICAL UNIT RESET received on from (SAM-5 7.7).
func (t *srpNexusTable) resetOthers(volume string, from *srpNexus) int {
	t.mu.Lock()
	nexuses := make([]*srpNexus, 0, len(t.m))
	for _, n := range t.m {
		if n != from {
			nexuses = append(nexuses, n)
		}
	}
	t.mu.Unlock()
	raised := 0
	for _, n := range nexuses {
		raised += n.raise(volume, scsi.ResetOccurred)
	}
	return raised
}

// raisePR raises the unit attentions of a persistent reservation change
// (prOutcome.notices) on the unit of volume of every nexus of each host
// named: all its nexuses, whichever target port (SPC-4 5.13.11 speaks
// of the I_T nexuses of the host's initiator port). A nexus that does
// not have the unit yet has nothing to hear: it opens it as it is now.
func (t *srpNexusTable) raisePR(volume string, ns []prNotice) {
	t.mu.Lock()
	type hit struct {
		n    *srpNexus
		what scsi.Condition
	}
	var hits []hit
	for _, n := range t.m {
		for _, x := range ns {
			if strings.HasPrefix(n.key, srpKeyPrefix+x.initiator+"\x00") {
				hits = append(hits, hit{n, x.what})
			}
		}
	}
	t.mu.Unlock()
	for _, h := range hits {
		h.n.raise(volume, h.what)
	}
}

// raise raises c on each of n's units of volume (srpUnitKey: one per
// LUN number the volume had in the session) and returns how many.
func (n *srpNexus) raise(volume string, c scsi.Condition) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	raised := 0
	for _, u := range n.units {
		if u.name == volume {
			u.raiseLocked(c)
			raised++
		}
	}
	return raised
}

// srpNexus is one SRP I_T nexus: the logical units its channels have,
// by volume and LUN number. The volume is the unit; the number is in
// the key too because a volume deleted and created again under the
// session is another volume with another number (the LUN map retires
// the old one), which must not inherit the old unit's capacity and
// conditions.
type srpNexus struct {
	table *srpNexusTable // nil for a nexus of one core alone (tests)
	key   string
	refs  int // channels logged in, under table.mu

	mu      sync.Mutex
	units   map[srpUnitKey]*srpUnit
	lunsGen uint64 // the last catalog change raised on the units
	// chans is the catalog change each channel's LUN table is up to,
	// by channel (connection id): REPORTED LUNS DATA HAS CHANGED is
	// raised once every channel is there (tableAt).
	chans map[uint64]uint64
}

func newSRPNexus(t *srpNexusTable, key string) *srpNexus {
	return &srpNexus{table: t, key: key, units: map[srpUnitKey]*srpUnit{}, chans: map[uint64]uint64{}}
}

// srpUnitKey names a unit of a nexus: its volume and LUN number.
type srpUnitKey struct {
	volume string
	lun    int
}

// unit returns the nexus's logical unit of volume at LUN lun, made with blocks
// blocks on first use; lost raises WriteCacheLost on a new unit (the
// volume lost its write cache and this nexus was not told yet). A unit
// that exists keeps its state: a later channel's login changes nothing
// the nexus was or was not told. gen is the catalog change that added
// the unit to a live session (0 at login): such a unit is not told of
// that change, as LIO does not tell a LUN it adds
// (target_luns_data_has_changed skips it), since the host has no
// device for it yet and would only scan again.
//
// alua says the unit reports a target port group (Config.SRPPortGroup):
// a new unit that is not active then has AccessChanged raised at once.
// Linux's scsi_dh_alua reads the port group's state only when told to:
// on Linux 6.12 it queues no REPORT TARGET PORT GROUPS when it attaches
// to a new device (alua_rtpg_queue finds sdev->handler_data not yet
// set; 6.1 sent one), so without a unit attention it takes a standby
// path for active/optimized until something else makes it ask, and
// sends it I/O that fails (test/rxe/alua.sh on 6.12). ASYMMETRIC ACCESS
// STATE CHANGED on the unit's first command after the attach makes it
// ask (alua_check_sense). An active unit needs none: active/optimized
// is what the handler assumes.
func (n *srpNexus) unit(volume string, lun int, blocks uint64, lost bool, st gwState, gen uint64, alua bool) *srpUnit {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := srpUnitKey{volume, lun}
	u := n.units[k]
	if u == nil {
		u = &srpUnit{nx: n, name: volume, born: gen}
		u.blocks.Store(blocks)
		u.state.Store(uint32(st))
		n.units[k] = u
		if lost {
			u.raiseLocked(scsi.WriteCacheLost)
		}
		if alua && st != gwActive {
			u.raiseLocked(scsi.AccessChanged)
		}
	}
	return u
}

// tableAt records that channel ch's LUN table is that of catalog
// change gen (its units attached, its gone volumes retired) and raises
// LUNsChanged on the nexus's units once every channel of the nexus is
// there, never before: a host told on one channel may send REPORT LUNS
// on any, and must find the new LUNs on all. It reports whether this
// call raised it.
func (n *srpNexus) tableAt(ch, gen uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if gen > n.chans[ch] {
		n.chans[ch] = gen
	}
	return n.raiseLocked()
}

// raiseLocked raises LUNsChanged for the catalog changes every channel
// has reached and the units have not heard of (n.mu held): on the units
// that existed before them, or on all when none did.
func (n *srpNexus) raiseLocked() bool {
	if len(n.chans) == 0 {
		return false
	}
	low := ^uint64(0)
	for _, g := range n.chans {
		low = min(low, g)
	}
	if low <= n.lunsGen {
		return false
	}
	old := 0
	for _, u := range n.units {
		if u.born <= n.lunsGen {
			u.raiseLocked(scsi.LUNsChanged)
			old++
		}
	}
	if old == 0 {
		for _, u := range n.units {
			u.raiseLocked(scsi.LUNsChanged)
		}
	}
	n.lunsGen = low
	return true
}

// resetOthers is srpNexusTable.resetOthers from n (nothing for a nexus
// without a table).
func (n *srpNexus) resetOthers(volume string) int {
	if n.table == nil {
		return 0
	}
	return n.table.resetOthers(volume, n)
}

// srpUnit is one logical unit as one I_T nexus sees it: its unit
// attention state and its capacity, shared by the nexus's channels.
type srpUnit struct {
	nx   *srpNexus
	name string
	// born is the catalog change that added the unit to a live session
	// (0: a login made it; srpNexus.unit).
	born uint64
	// armed says st is not idle; set under nx.mu, read without it by
	// every command.
	armed atomic.Bool
	// blocks is the unit's capacity as last announced; every channel's
	// commands check against it, so a host told CAPACITY DATA HAS
	// CHANGED on one channel reads the new capacity on any.
	blocks atomic.Uint64
	// state is the unit's gwState at this gateway as last announced
	// (scsi.Device's Standby and Unavailable), shared like blocks.
	state atomic.Uint32
	st    scsi.Nexus // under nx.mu
	// takeovers counts the nexus's SET TARGET PORT GROUPS running a
	// takeover of the unit (under nx.mu): the change they bring is not
	// reported to this nexus, which asked for it (SPC-4 5.15.2.3).
	takeovers int
}

// raiseLocked raises c on the unit (nx.mu held).
func (u *srpUnit) raiseLocked(c scsi.Condition) {
	u.st.Raise(c)
	u.armed.Store(true)
}

// resize records the unit's new capacity and raises CapacityChanged,
// once per change: it reports whether this call did (the nexus's other
// channels, told of the same resize, find it done).
func (u *srpUnit) resize(blocks uint64) bool {
	u.nx.mu.Lock()
	defer u.nx.mu.Unlock()
	if u.blocks.Load() == blocks {
		return false
	}
	u.blocks.Store(blocks)
	u.raiseLocked(scsi.CapacityChanged)
	return true
}

// setState records the unit's new ALUA state and raises AccessChanged,
// unless the nexus itself asked for it (its takeover made the unit
// active): once per change, as resize. It reports whether this call
// changed the state.
func (u *srpUnit) setState(st gwState) bool {
	u.nx.mu.Lock()
	defer u.nx.mu.Unlock()
	if gwState(u.state.Load()) == st {
		return false
	}
	u.state.Store(uint32(st))
	if st != gwActive || u.takeovers == 0 {
		u.raiseLocked(scsi.AccessChanged)
	}
	return true
}

// takeOver counts a SET TARGET PORT GROUPS of the nexus's that starts
// (+1) or ended (-1) a takeover of the unit; one that succeeded makes
// the unit active before it answers, unreported, so that the nexus's
// next command finds it served.
func (u *srpUnit) takeOver(delta int, ok bool) {
	u.nx.mu.Lock()
	defer u.nx.mu.Unlock()
	u.takeovers += delta
	if ok {
		u.state.Store(uint32(gwActive))
	}
}

// pending returns the unit attentions not yet reported (tracing).
func (u *srpUnit) pending() scsi.Condition {
	u.nx.mu.Lock()
	defer u.nx.mu.Unlock()
	return u.st.Pending()
}

// execute runs cdb through dev with the nexus's state of the unit. With
// nothing pending it runs against idle, a zero scratch Nexus of the
// calling core's (which Execute leaves zero), and takes no lock. It
// reports whether this command told the host of a lost write cache.
func (u *srpUnit) execute(dev *scsi.Device, idle *scsi.Nexus, cdb []byte, luns []uint16) (scsi.Action, bool) {
	dev.Blocks = u.blocks.Load()
	st := gwState(u.state.Load())
	dev.Standby, dev.Unavailable = st == gwStandby, st == gwFenced
	if !u.armed.Load() {
		return dev.Execute(idle, cdb, luns), false
	}
	u.nx.mu.Lock()
	defer u.nx.mu.Unlock()
	owed := u.st.OwesLoss()
	a := dev.Execute(&u.st, cdb, luns)
	u.armed.Store(!u.st.Idle())
	return a, owed && !u.st.OwesLoss()
}
