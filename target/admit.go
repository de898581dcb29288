package target

import (
	"net"
	"time"
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

// admitLocked takes a pre-login slot for c, or reports false when a cap
// is reached and no silent connection can give up its slot (its
// eviction is started here). REQUIRES: t.mu.
func (t *Target) admitLocked(c *conn, now int64) bool {
	if t.cfg.MaxPendingPerSource > 0 && t.pendingBy[c.src] >= t.cfg.MaxPendingPerSource {
		return false
	}
	if t.cfg.MaxPendingLogins > 0 && t.npending-t.evicting >= t.cfg.MaxPendingLogins {
		t.scratch = t.scratch[:0]
		for _, p := range t.pending {
			t.scratch = append(t.scratch, pendingInfo{src: p.src, since: p.pendingSince, evicted: p.evicted})
		}
		i := chooseVictim(t.scratch, t.pendingBy, c.src, now, t.evictAge)
		if i < 0 {
			return false
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
	return true
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
// refused for the pre-login caps.
func (t *Target) refused(remote string) {
	t.rejected.Add(1)
	t.refusals.Add(1)
	now := time.Now().UnixNano()
	last := t.refusalLogged.Load()
	if (last == 0 || now-last >= int64(refusalLogEvery)) && t.refusalLogged.CompareAndSwap(last, now) {
		n := t.refusals.Swap(0)
		t.log.Warn("connection refused: too many connections have not logged in yet",
			"remote", remote, "max_pending", t.cfg.MaxPendingLogins, "max_pending_per_source", t.cfg.MaxPendingPerSource,
			"refused", n)
	}
}
