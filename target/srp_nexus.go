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
	// each change once (srpNexus.lunsChanged), and one made after a
	// change has nothing to hear.
	catalogGen atomic.Uint64
}

// join returns the nexus named key, made on its first channel, and
// counts the channel in; leave counts it out.
func (t *srpNexusTable) join(key string) *srpNexus {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*srpNexus{}
	}
	n := t.m[key]
	if n == nil {
		n = newSRPNexus(t, key)
		n.lunsGen = t.catalogGen.Load()
		t.m[key] = n
	}
	n.refs++
	return n
}

// leave counts a channel of n out; the nexus, and its pending unit
// attentions, go with its last channel (a new login is a new nexus,
// SAM-5's power on for it: nothing to report).
func (t *srpNexusTable) leave(n *srpNexus) {
	t.mu.Lock()
	defer t.mu.Unlock()
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
		n.mu.Lock()
		if u := n.units[volume]; u != nil {
			u.raiseLocked(scsi.ResetOccurred)
			raised++
		}
		n.mu.Unlock()
	}
	return raised
}

// srpNexus is one SRP I_T nexus: the logical units its channels have,
// by volume name (a LUN number is per login, the volume is the unit).
type srpNexus struct {
	table *srpNexusTable // nil for a nexus of one core alone (tests)
	key   string
	refs  int // channels logged in, under table.mu

	mu      sync.Mutex
	units   map[string]*srpUnit
	lunsGen uint64 // the last catalog change raised on the units
}

func newSRPNexus(t *srpNexusTable, key string) *srpNexus {
	return &srpNexus{table: t, key: key, units: map[string]*srpUnit{}}
}

// unit returns the nexus's logical unit of volume, made with blocks
// blocks on first use; lost raises WriteCacheLost on a new unit (the
// volume lost its write cache and this nexus was not told yet). A unit
// that exists keeps its state: a later channel's login changes nothing
// the nexus was or was not told.
func (n *srpNexus) unit(volume string, blocks uint64, lost bool) *srpUnit {
	n.mu.Lock()
	defer n.mu.Unlock()
	u := n.units[volume]
	if u == nil {
		u = &srpUnit{nx: n, name: volume}
		u.blocks.Store(blocks)
		n.units[volume] = u
		if lost {
			u.raiseLocked(scsi.WriteCacheLost)
		}
	}
	return u
}

// lunsChanged raises LUNsChanged on every unit of the nexus for catalog
// change gen, once: each channel passes it on, the first raises it.
func (n *srpNexus) lunsChanged(gen uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if gen <= n.lunsGen {
		return false
	}
	n.lunsGen = gen
	for _, u := range n.units {
		u.raiseLocked(scsi.LUNsChanged)
	}
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
	// armed says st is not idle; set under nx.mu, read without it by
	// every command.
	armed atomic.Bool
	// blocks is the unit's capacity as last announced; every channel's
	// commands check against it, so a host told CAPACITY DATA HAS
	// CHANGED on one channel reads the new capacity on any.
	blocks atomic.Uint64
	st     scsi.Nexus // under nx.mu
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
