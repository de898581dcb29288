package block

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SpaceUsage is what a file system reports about its space (statfs(2)).
type SpaceUsage struct {
	// Total is the size of the file system in bytes.
	Total int64
	// Avail is the bytes an unprivileged writer may still allocate
	// (f_bavail: the root-reserved blocks are not ours to use).
	Avail int64
}

// StatfsFunc reports the space of the file system holding dir. Tests
// inject one; the default is Statfs.
type StatfsFunc func(dir string) (SpaceUsage, error)

// SpaceInfo is a store's view of its file system's space and of how much
// of it its volumes may claim (see the package doc, "Out of space").
type SpaceInfo struct {
	// Known is false when the store cannot measure its file system (a
	// memory store, or a custom pebble vfs.FS without a StatfsFunc); the
	// fields below are then zero and nothing is refused for space.
	Known bool
	// Total and Free are the file system's size and available bytes at
	// the last measurement.
	Total, Free int64
	// Reserve is the free space below which writes are refused.
	Reserve int64
	// Full is true while writes are being refused.
	Full bool
	// RefusedWrites counts writes refused with ErrNoSpace since open.
	RefusedWrites uint64
	// Provisioned is the sum of the volume sizes.
	Provisioned int64
	// MaxOvercommit bounds Provisioned to MaxOvercommit × Total; 0 means
	// unbounded.
	MaxOvercommit float64
}

// SpaceReporter is implemented by stores that measure their space.
type SpaceReporter interface {
	// Space measures the file system now (at most every refresh
	// interval) and reports it with the provisioned total.
	Space() (SpaceInfo, error)
}

// Defaults of the space guard.
const (
	// DefaultMinReserve is the least free space a store keeps (unless the
	// file system is small, see spaceGuard.reserveFor); a pebble store
	// keeps room for two memtables' flushes besides (PebbleOptions).
	DefaultMinReserve = 64 << 20
	// DefaultMaxOvercommit is the default bound on the sum of volume
	// sizes, as a multiple of the file system's size: volumes are thin
	// (unwritten blocks take no space), so some overcommit is the point,
	// but a 1 TiB volume on a 64 MiB disk is a mistake.
	DefaultMaxOvercommit = 10.0
	// spaceRefreshInterval is how stale the cached statfs may get: a
	// write refused for space is refused within this long of the disk
	// filling (plus the bytes admitted meanwhile, bounded below), and
	// admitted again within this long of space coming back.
	spaceRefreshInterval = 100 * time.Millisecond
	// spaceLogInterval rate-limits the "out of space" log lines.
	spaceLogInterval = 10 * time.Second
)

// spaceGuard keeps a store's writes from ever filling its file system.
//
// Pebble does not survive ENOSPC in its WAL: LogWriter's error path in
// DB.rotateWAL unlocks d.mu twice ("fatal error: sync: unlock of unlocked
// mutex", which no recover catches), and a failed WAL write before that
// blocks the commit pipeline, so writers hang. The only safe answer is to
// never let pebble reach ENOSPC: every data write is admitted against a
// reserve of free space and refused with ErrNoSpace below it, while
// pebble's own flushes and compactions, which must run to free space,
// still have the reserve to work in.
//
// The free space comes from statfs, cached: refreshed when it is older
// than spaceRefreshInterval or when more than refreshBytes were admitted
// since, which bounds how far writes can overshoot the reserve between
// measurements. The hot path is a few atomics.
type spaceGuard struct {
	dir     string
	statfs  StatfsFunc
	now     func() time.Time
	log     *slog.Logger
	reserve int64 // from the options: > 0 fixed, 0 default, < 0 never refuse
	// floor is the least default reserve: room for the flushes of two
	// memtables (set by the store before its guard measures for writes).
	floor int64

	checkedAt atomic.Int64 // unix nanos of the last measurement
	total     atomic.Int64
	avail     atomic.Int64
	curRes    atomic.Int64 // reserve in effect
	written   atomic.Int64 // bytes admitted since the last measurement
	full      atomic.Bool
	refused   atomic.Uint64

	mu         sync.Mutex // serializes measurements; guards the fields below
	measured   bool
	lastLog    time.Time
	suppressed int
	lastErr    string
}

func newSpaceGuard(dir string, statfs StatfsFunc, now func() time.Time, log *slog.Logger, reserve int64) (*spaceGuard, error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	g := &spaceGuard{dir: dir, statfs: statfs, now: now, log: log, reserve: reserve}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.measureLocked(now()); err != nil {
		return nil, err
	}
	return g, nil
}

// reserveFor is the reserve on a file system of total bytes: the
// configured one, or max(DefaultMinReserve, 1% of total, room for two
// memtables) but at most a quarter of the file system, so that a small
// one (a test's loop mount) stays usable.
func (g *spaceGuard) reserveFor(total int64) int64 {
	if g.reserve != 0 {
		return max(g.reserve, 0)
	}
	r := max(int64(DefaultMinReserve), total/100, g.floor)
	return min(r, total/4)
}

// refreshBytes is how many bytes may be admitted between measurements: a
// quarter of the reserve, between 1 and 16 MiB.
func (g *spaceGuard) refreshBytes() int64 {
	return min(max(g.curRes.Load()/4, 1<<20), 16<<20)
}

// measureLocked runs statfs and updates the cache and the full state.
// REQUIRES: g.mu.
func (g *spaceGuard) measureLocked(now time.Time) error {
	w0 := g.written.Load()
	u, err := g.statfs(g.dir)
	g.checkedAt.Store(now.UnixNano())
	if err != nil {
		// Keep the last measurement: failing every write because statfs
		// failed once would be worse than the small risk of running on.
		if msg := err.Error(); msg != g.lastErr {
			g.lastErr = msg
			g.log.Error("block: cannot measure free space; using the last measurement", "dir", g.dir, "err", err)
		}
		if !g.measured {
			return fmt.Errorf("block: store %s: measure free space: %w", g.dir, err)
		}
		return nil
	}
	g.lastErr = ""
	g.measured = true
	g.total.Store(u.Total)
	g.avail.Store(u.Avail)
	g.curRes.Store(g.reserveFor(u.Total))
	// Bytes admitted while statfs ran may not be in its answer yet.
	g.written.Add(-w0)
	// Hysteresis: a full store stays full until there is room for a
	// refresh's worth of writes above the reserve, or it would flap
	// between refusing and admitting at every measurement.
	need := g.curRes.Load()
	if g.full.Load() {
		need += g.refreshBytes()
	}
	g.setFullLocked(now, u.Avail < need)
	return nil
}

// setFullLocked records the out-of-space state and logs its changes, at
// most once per spaceLogInterval (a store hovering at the reserve would
// otherwise log every refresh). REQUIRES: g.mu.
func (g *spaceGuard) setFullLocked(now time.Time, full bool) {
	if g.full.Swap(full) == full {
		return
	}
	if !g.lastLog.IsZero() && now.Sub(g.lastLog) < spaceLogInterval {
		g.suppressed++
		return
	}
	args := []any{"dir", g.dir, "free", g.avail.Load(), "reserve", g.curRes.Load(), "total", g.total.Load()}
	if g.suppressed > 0 {
		args = append(args, "changes_not_logged", g.suppressed)
	}
	g.lastLog, g.suppressed = now, 0
	if full {
		g.log.Error("block: store out of space: refusing writes until free space is above the reserve", args...)
	} else {
		g.log.Info("block: store has space again: accepting writes", args...)
	}
}

// refresh measures again if the cache is stale and no other goroutine is
// measuring already.
func (g *spaceGuard) refresh(now time.Time, force bool) {
	if !g.mu.TryLock() {
		return
	}
	defer g.mu.Unlock()
	if force || now.UnixNano()-g.checkedAt.Load() >= int64(spaceRefreshInterval) || g.written.Load() >= g.refreshBytes() {
		_ = g.measureLocked(now)
	}
}

// admit accounts for a write of n bytes, or refuses it with ErrNoSpace if
// it would take the free space below the reserve. A nil guard admits
// everything.
func (g *spaceGuard) admit(n int64) error {
	if g == nil || g.reserve < 0 {
		return nil
	}
	now := g.now()
	if now.UnixNano()-g.checkedAt.Load() >= int64(spaceRefreshInterval) || g.written.Load()+n >= g.refreshBytes() {
		g.refresh(now, false)
	}
	w := g.written.Add(n)
	// Once refused, every write is refused until a measurement shows
	// space (measureLocked): the out-of-space state is one state, logged
	// once, not a per-request guess.
	if !g.full.Load() && g.avail.Load()-w >= g.curRes.Load() {
		return nil
	}
	g.written.Add(-n)
	g.refused.Add(1)
	if !g.full.Load() && g.mu.TryLock() {
		g.setFullLocked(now, true)
		g.mu.Unlock()
	}
	return fmt.Errorf("free %d bytes, %d written since measured, reserve %d: %w", g.avail.Load(), w-n, g.curRes.Load(), ErrNoSpace)
}

// walFloor is the free space below which a pebble store refuses even the
// writes the reserve does not govern (admitWAL): the metadata changes
// (create, snapshot, clone, resize, delete) and Flush, Discard and
// WriteZeroes. Each logs a few bytes to pebble's WAL, harmless while the
// reserve stands; but once something else has filled the file system
// past it, the record that needs a new block of the WAL file meets
// ENOSPC, and pebble does not survive that ("pebble: fatal commit
// error": the process exits, with every volume). srpd died so at its
// fifth 'volume create' on a full tmpfs (TestVolumeChangesOnFullDisk in
// cmd/srpd). 1 MiB is 32 of pebble's 32 KiB WAL blocks, and nothing next
// to the reserve: in the store's usual "full" state (below the reserve)
// these writes all go on.
const walFloor = 1 << 20

// admitWAL refuses, with an error that is both syscall.ENOSPC and
// ErrNoSpace, a few bytes for pebble's WAL when less than walFloor is
// free. measure says to measure now rather than trust a measurement up
// to spaceRefreshInterval old: the metadata changes, which are rare, do;
// the I/O path (a FLUSH per host fsync) keeps to the cache. A nil guard,
// or one told never to refuse, admits everything.
func (g *spaceGuard) admitWAL(measure bool) error {
	if g == nil || g.reserve < 0 {
		return nil
	}
	g.refresh(g.now(), measure)
	if free := g.avail.Load() - g.written.Load(); free < walFloor {
		g.refused.Add(1)
		return fmt.Errorf("the store's file system has %d bytes free, under the %d a change of the store needs: %w: %w",
			max(free, 0), walFloor, syscall.ENOSPC, ErrNoSpace)
	}
	return nil
}

// info reports the guard's state, measuring first if the cache is stale.
func (g *spaceGuard) info() SpaceInfo {
	if g == nil {
		return SpaceInfo{}
	}
	g.refresh(g.now(), false)
	return SpaceInfo{
		Known: true, Total: g.total.Load(), Free: g.avail.Load(), Reserve: g.curRes.Load(),
		Full: g.full.Load(), RefusedWrites: g.refused.Load(),
	}
}

// capacity is the file system's size at the last measurement (0 with no
// guard).
func (g *spaceGuard) capacity() int64 {
	if g == nil {
		return 0
	}
	g.refresh(g.now(), false)
	return g.total.Load()
}

// checkOvercommit refuses to provision a volume of size more than
// before (the size it replaces: 0 for a create) when the sum of all volume
// sizes would exceed ratio × the file system's size. ratio <= 0 or an
// unknown capacity means no bound.
func checkOvercommit(what string, provisioned, before, size int64, ratio float64, capacity int64) error {
	if ratio <= 0 || capacity <= 0 || size <= before {
		return nil
	}
	after := provisioned - before + size
	limit := ratio * float64(capacity)
	if float64(after) <= limit {
		return nil
	}
	return fmt.Errorf("block: %s: volumes would total %d bytes, over the limit of %.4g × the %d-byte file system (max overcommit): %w",
		what, after, ratio, capacity, ErrOvercommit)
}
