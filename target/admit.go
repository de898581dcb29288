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

// admitLocked takes a pre-login slot for a connection from src, or
// reports false when a cap is reached. REQUIRES: t.mu.
func (t *Target) admitLocked(src string) bool {
	if (t.cfg.MaxPendingLogins > 0 && t.npending >= t.cfg.MaxPendingLogins) ||
		(t.cfg.MaxPendingPerSource > 0 && t.pendingBy[src] >= t.cfg.MaxPendingPerSource) {
		return false
	}
	t.npending++
	t.pendingBy[src]++
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
