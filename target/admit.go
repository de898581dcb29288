package target

import (
	"net"
	"time"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
)

// Defaults of the caps on connections that have not logged in yet. Each
// costs its verbs objects, buffers and worker goroutines from the
// connect request on (about 36 goroutines and 1 MB at the default
// credits), until it logs in or LoginTimeout passes, and a connect
// request is a few dozen bytes.
const (
	DefaultMaxPendingLogins    = 64
	DefaultMaxPendingPerSource = 16
)

// Defaults of the caps on all connections, logged in or not. A logged-in
// connection holds what a pending one does (a worker goroutine per credit
// and about 1 MB of buffers) for as long as its initiator likes, so
// without a cap a peer that may log in could open connections until the
// target runs out of memory. A host needs a few per session (one per
// channel; ib_srp opens one per completion vector, bench one per job):
// the per-source default leaves room for a large host's sessions, and
// the total for hundreds of hosts' at about 1 GB.
const (
	DefaultMaxConnections          = 1024
	DefaultMaxConnectionsPerSource = 256
)

// admitVerdict is what admitLocked decided for a connection request.
type admitVerdict uint8

const (
	admitted admitVerdict = iota
	refusedPending
	refusedConnections
)

// refusalLogEvery bounds how often connection requests refused for the
// caps are logged: the first at once, then one line per interval with
// the count since the last.
const refusalLogEvery = 10 * time.Second

// source is what the per-source cap counts by: the host of a host:port
// address, or the whole address of a wire without ports (shm names the
// peer's process).
func source(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// evictAge is how long a connection must have been silent before a
// newcomer may take its pre-login slot when every slot is held: an
// initiator logs in within milliseconds of its connect request, so one
// still silent after this is most likely one of a flood.
const evictAge = int64(500 * time.Millisecond)

// pendingInfo is what admission knows of a connection that has not logged
// in yet.
type pendingInfo struct {
	src     string
	since   int64 // when it was admitted (ns, the Target's clock)
	evicted bool  // told to go; its slot is still counted until it has
}

// chooseVictim picks which pending connection (its index in pending,
// oldest first) a newcomer from src takes the slot of when the total cap
// is reached, or -1 to refuse the newcomer. Like the kernel's SYN queue
// under a flood, the target sheds old silent requests rather than every
// new one, or a flood holding every slot for LoginTimeout locks everyone
// out: first the oldest of the source holding the most slots, if that
// source holds at least two more than the newcomer's (so two sources
// never take turns evicting each other); else the oldest of all, once it
// has been silent for minAge.
func chooseVictim(pending []pendingInfo, count map[string]int, src string, now, minAge int64) int {
	heavy, most := "", 0
	for s, n := range count {
		if n > most || (n == most && s < heavy) {
			heavy, most = s, n
		}
	}
	if most >= count[src]+2 {
		for i, p := range pending {
			if !p.evicted && p.src == heavy {
				return i
			}
		}
	}
	for i, p := range pending {
		if !p.evicted {
			if now-p.since >= minAge {
				return i
			}
			break
		}
	}
	return -1
}

// admitLocked counts c among the target's connections and takes a
// pre-login slot for it, or refuses it: when a connection cap is reached
// (the connections already in are never evicted for it: they may be
// logged in and doing I/O), or a pre-login cap is reached and no silent
// connection can give up its slot (its eviction is started here).
// REQUIRES: t.mu.
func (t *Target) admitLocked(c *conn, now int64) admitVerdict {
	if t.cfg.MaxConnectionsPerSource > 0 && t.connsBy[c.src] >= t.cfg.MaxConnectionsPerSource ||
		t.cfg.MaxConnections > 0 && len(t.conns) >= t.cfg.MaxConnections {
		return refusedConnections
	}
	if t.cfg.MaxPendingPerSource > 0 && t.pendingBy[c.src] >= t.cfg.MaxPendingPerSource {
		return refusedPending
	}
	if t.cfg.MaxPendingLogins > 0 && t.npending-t.evicting >= t.cfg.MaxPendingLogins {
		t.scratch = t.scratch[:0]
		for _, p := range t.pending {
			t.scratch = append(t.scratch, pendingInfo{src: p.src, since: p.pendingSince, evicted: p.evicted})
		}
		i := chooseVictim(t.scratch, t.pendingBy, c.src, now, t.evictAge)
		if i < 0 {
			return refusedPending
		}
		v := t.pending[i]
		v.evicted = true
		t.evicting++
		t.evictions.Add(1)
		v.evict()
	}
	t.npending++
	t.pendingBy[c.src]++
	c.pendingSince = now
	t.pending = append(t.pending, c)
	t.connsBy[c.src]++
	return admitted
}

// connGoneLocked uncounts c from the connections once its goroutines are done
// with it. REQUIRES: t.mu.
func (t *Target) connGoneLocked(c *conn) {
	delete(t.conns, c.id)
	if t.connsBy[c.src]--; t.connsBy[c.src] <= 0 {
		delete(t.connsBy, c.src)
	}
}

// loginDone gives back c's pre-login slot, once: when it logs in or
// ends. Called only on c's own goroutine.
func (t *Target) loginDone(c *conn) {
	if !c.prelogin {
		return
	}
	c.prelogin = false
	t.mu.Lock()
	t.npending--
	if t.pendingBy[c.src]--; t.pendingBy[c.src] <= 0 {
		delete(t.pendingBy, c.src)
	}
	if c.evicted {
		t.evicting--
	}
	for i, p := range t.pending {
		if p == c {
			t.pending = append(t.pending[:i], t.pending[i+1:]...)
			break
		}
	}
	t.mu.Unlock()
}

// refused counts and logs, at a bounded rate, a connection request
// refused for the caps (v says which).
func (t *Target) refused(remote string, v admitVerdict) {
	t.rejected.Add(1)
	t.refusals.Add(1)
	now := time.Now().UnixNano()
	last := t.refusalLogged.Load()
	if (last == 0 || now-last >= int64(refusalLogEvery)) && t.refusalLogged.CompareAndSwap(last, now) {
		n := t.refusals.Swap(0)
		if v == refusedConnections {
			t.log.Warn("connection refused: too many connections",
				"remote", remote, "max_connections", t.cfg.MaxConnections, "max_connections_per_source", t.cfg.MaxConnectionsPerSource,
				"refused", n)
			return
		}
		t.log.Warn("connection refused: too many connections have not logged in yet",
			"remote", remote, "max_pending", t.cfg.MaxPendingLogins, "max_pending_per_source", t.cfg.MaxPendingPerSource,
			"refused", n)
	}
}

// refusalData is the private data of the reject of a connection request
// refused before setup, so that the initiator can say why: an
// SRP_LOGIN_REJ for an SRP login (INSUFFICIENT RESOURCES, or UNABLE TO
// ESTABLISH while shutting down: ib_srpt's answers when it cannot take a
// channel, srpt_cm_req_recv), a wire.ConnReject for a gosrp hello, and
// nothing for anything else.
func refusalData(priv []byte, v admitVerdict, shuttingDown bool) []byte {
	var lr srp.LoginRequest
	if lr.DecodeRDMA(priv) == nil {
		r := srp.RejectInsufficientResources
		if shuttingDown {
			r = srp.RejectUnableToEstablish
		}
		return srpRejectData(&lr, r)
	}
	if _, err := wire.DecodeHello(priv); err != nil {
		return nil
	}
	switch {
	case shuttingDown:
		return wire.ConnReject{Reason: wire.RejectShuttingDown, Message: "target shutting down"}.Encode()
	case v == refusedConnections:
		return wire.ConnReject{Reason: wire.RejectInsufficientResources, Message: "too many connections"}.Encode()
	default:
		return wire.ConnReject{Reason: wire.RejectInsufficientResources, Message: "too many connections not logged in yet"}.Encode()
	}
}
