package initiator

// Multipath: one volume through several gateways (targets over one
// shared store), I/O on the active one, a fenced takeover on the next
// when the active path is lost or turns standby.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// MultipathConfig configures a Multipath.
type MultipathConfig struct {
	// Config is every path's session configuration; its Addr is
	// ignored (Addrs has them) and its LossTimeout bounds how long an
	// I/O keeps trying paths before it fails with ErrConnectionLost
	// (default 60 s). A command a gateway leaves unanswered through
	// five of its IOTimeouts (Config.IOTimeout) fails over as well, the
	// gateway fenced, instead of failing with os.ErrDeadlineExceeded;
	// it fails so only when no path answered it within LossTimeout.
	// The takeovers a failover asks for end at that deadline too: a
	// standby whose store hangs cannot hold an I/O past it.
	Config
	// Addrs are the gateways' addresses, in order of preference: the
	// first one that answers an open active serves the volume.
	Addrs []string
	// FastFail is how long a path may stay disconnected before its I/O
	// fails over to another path (each path's session gets it as its
	// LossTimeout: ib_srp's fast_io_fail_tmo beside dev_loss_tmo). A
	// path that comes back sooner keeps its I/O, re-issued on the same
	// gateway, and nobody is fenced. A path whose reconnect is refused
	// (nobody listens at its address: the gateway's process is gone)
	// fails over at once: there is nothing to wait for, and the takeover
	// fences only the dead process's cluster client (a restarted srpd is
	// a new one). Default 1 s.
	FastFail time.Duration
	// Keepalive is each path's Config.KeepaliveTimeout: a gateway that
	// answers nothing, pings included, for that long is taken for
	// lost, and since LossTimeout counts from its last answer, its I/O
	// fails over at once. So a gateway that hangs with its connections
	// up (a stopped srpd) is left within about Keepalive plus a 100 ms
	// tick, not IOTimeout. An idle path (a standby, a quiet volume)
	// is pinged every Keepalive/2; one whose I/O completes is not.
	// Default FastFail; negative: no keepalive (IOTimeout finds a hung
	// gateway).
	Keepalive time.Duration
}

// Multipath is a session with several gateways of the same volumes.
// It is safe for concurrent use.
type Multipath struct {
	cfg MultipathConfig

	mu    sync.Mutex
	paths []*Session // by Addrs index; nil until dialed
	// bg: the closes of handles failed over from, which wait for their
	// path (Close ends them by closing the sessions, then waits).
	bg     sync.WaitGroup
	closed bool
}

// DialMultipath dials every address; it fails only when none answers (a
// path that does not is dialed again when a failover needs it).
func DialMultipath(ctx context.Context, cfg MultipathConfig) (*Multipath, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("initiator: multipath: no target address: %w", ErrInvalid)
	}
	if cfg.Protocol != ProtocolGoSRP {
		return nil, fmt.Errorf("initiator: multipath speaks gosrp's protocol only (path states): %w", ErrInvalid)
	}
	if cfg.FastFail <= 0 {
		cfg.FastFail = time.Second
	}
	if cfg.LossTimeout <= 0 {
		cfg.LossTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Keepalive == 0:
		cfg.Keepalive = cfg.FastFail
	case cfg.Keepalive < 0:
		cfg.Keepalive = 0
	}
	m := &Multipath{cfg: cfg, paths: make([]*Session, len(cfg.Addrs))}
	var errs []error
	for i := range cfg.Addrs {
		if _, err := m.session(ctx, i); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == len(cfg.Addrs) {
		return nil, fmt.Errorf("initiator: multipath: no path answered: %w", pathErrors(errs))
	}
	return m, nil
}

// session returns path i's session, dialing it if it has none.
func (m *Multipath) session(ctx context.Context, i int) (*Session, error) {
	m.mu.Lock()
	s, closed := m.paths[i], m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if s != nil {
		return s, nil
	}
	cfg := m.cfg.Config
	cfg.Addr = m.cfg.Addrs[i]
	cfg.LossTimeout = m.cfg.FastFail
	cfg.KeepaliveTimeout = m.cfg.Keepalive
	cfg.refusedIsLost = true
	s, err := Dial(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", cfg.Addr, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.paths[i] != nil {
		s.Close()
		if m.closed {
			return nil, ErrClosed
		}
		return m.paths[i], nil
	}
	m.paths[i] = s
	return s, nil
}

// Close closes every path's session.
func (m *Multipath) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	paths := m.paths
	m.paths = make([]*Session, len(paths))
	m.mu.Unlock()
	var errs []error
	for _, s := range paths {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	m.bg.Wait()
	return errors.Join(errs...)
}

// MultipathVolume is a volume opened through a Multipath: its I/O goes
// to the active path, and fails over (see Multipath) when that path is
// lost or answers standby. It is safe for concurrent use.
type MultipathVolume struct {
	m    *Multipath
	name string
	opts OpenOptions

	mu  sync.Mutex
	cur mpActive
	// switching is closed when the failover under way ends; nil when
	// none is.
	switching chan struct{}
	failovers int
	closed    bool
	retry     mpRetry // Submit's re-issues (multipath_submit.go)
	// watch are handles on the paths that answered the open standby,
	// by path index (nil: none), kept for their path notices: one that
	// says its gateway became active moves the volume there.
	watch []*Volume
}

// mpActive is the path the volume's I/O goes to; gen counts failovers,
// so that the I/Os that failed on one path start one failover, not one
// each.
type mpActive struct {
	v    *Volume
	path int
	gen  uint64
}

// Open opens a volume on every path that answers and picks the first
// that is active; when none is (the gateway that served it is gone), the
// first path that answers is asked to take over (OpenOptions.Takeover).
// The handles of the other paths stay open, standby, for their path
// notices (wire.PathNotice): when another host takes the volume over
// through one of them, this volume follows it there at once, even when
// the gateway it uses learns of its fencing only at its next request
// (not for an Exclusive open: those are closed).
func (m *Multipath) Open(ctx context.Context, name string, opts OpenOptions) (*MultipathVolume, error) {
	if opts.Takeover {
		return nil, fmt.Errorf("initiator: multipath open %q: Multipath decides when to take over: %w", name, ErrInvalid)
	}
	mv := &MultipathVolume{m: m, name: name, opts: opts, watch: make([]*Volume, len(m.cfg.Addrs))}
	var errs []error
	for i := range m.cfg.Addrs {
		s, err := m.session(ctx, i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := s.Open(ctx, name, mv.optsFor(i, false))
		if err != nil {
			errs = append(errs, fmt.Errorf("path %s: %w", m.cfg.Addrs[i], err))
			continue
		}
		mv.mu.Lock()
		switch {
		case !v.Standby() && mv.cur.v == nil:
			mv.cur = mpActive{v: v, path: i}
		case opts.Exclusive:
			// An exclusive open's standby handle would hold an
			// implicit reservation at that gateway too, refusing the
			// other hosts' writers there: a change of what Exclusive
			// means across gateways (each keeps its own) that is
			// not made here.
			v.Close()
		default:
			mv.watch[i] = v
		}
		mv.mu.Unlock()
	}
	if mv.cur.v != nil {
		return mv, nil
	}
	if err := mv.failover(ctx, 0, -1, -1); err != nil {
		mv.Close()
		return nil, fmt.Errorf("initiator: multipath open %q: %w", name, pathErrors(append(errs, err)))
	}
	return mv, nil
}

// optsFor are the options of an open on path i: the caller's, the
// takeover, and the path notices' hook.
func (mv *MultipathVolume) optsFor(i int, takeover bool) OpenOptions {
	o := mv.opts
	o.Takeover = takeover
	o.OnPathState = func(standby bool) { mv.noticed(i, standby) }
	return o
}

// noticed takes a path notice of path i (on its session's I/O
// goroutine, so it only starts work): the active path turning standby
// (its gateway was fenced, or lost the lock) fails the volume over at
// once, instead of at the next I/O's ErrStandby; another path turning
// active (another host took the volume over through it, so this one's
// gateway lost it) moves the volume there at once, its takeover open a
// no-op on a gateway that is active already.
func (mv *MultipathVolume) noticed(i int, standby bool) {
	mv.mu.Lock()
	a, closed := mv.cur, mv.closed
	mv.mu.Unlock()
	prefer := -1
	switch {
	case closed || a.v == nil:
		return
	case standby && a.path == i:
	case !standby && a.path != i:
		prefer = i
	default:
		return
	}
	m := mv.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.bg.Add(1) // before Close's Wait: Close sets closed under m.mu first
	go func() {
		defer m.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.LossTimeout)
		defer cancel()
		if err := mv.failover(ctx, a.gen, a.path, prefer); err != nil && !errors.Is(err, ErrClosed) {
			m.cfg.Logger.Warn("multipath: failover on a path notice failed; the next I/O tries again", "volume", mv.name, "err", err)
		}
	}()
}

// active returns the path I/O goes to now.
func (mv *MultipathVolume) active() (mpActive, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.closed {
		return mpActive{}, ErrClosed
	}
	return mv.cur, nil
}

// failover makes another path active after the one of generation gen
// failed (from: its index, -1 at open): it asks each path in turn, the
// failed one last, to take the volume over, path prefer first (-1:
// none; a path a notice said is active). Concurrent callers for the
// same generation wait for the one that runs it; a caller whose
// generation is stale returns at once, the volume has moved already.
func (mv *MultipathVolume) failover(ctx context.Context, gen uint64, from, prefer int) error {
	mv.mu.Lock()
	for {
		if mv.closed {
			mv.mu.Unlock()
			return ErrClosed
		}
		if mv.cur.v != nil && mv.cur.gen != gen {
			mv.mu.Unlock()
			return nil
		}
		if mv.switching == nil {
			break
		}
		ch := mv.switching
		mv.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		mv.mu.Lock()
	}
	mv.switching = make(chan struct{})
	old := mv.cur
	mv.mu.Unlock()

	m := mv.m
	n := len(m.cfg.Addrs)
	var next mpActive
	var errs []error
	for k := 0; k <= n; k++ {
		i := (from + k) % n
		switch {
		case k == 0 && prefer < 0:
			continue
		case k == 0:
			i = prefer
		case i == prefer:
			continue // asked first
		case from < 0:
			i = k - 1
		}
		s, err := m.session(ctx, i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := s.Open(ctx, mv.name, mv.optsFor(i, true))
		if err == nil && v.Standby() {
			v.Close()
			err = fmt.Errorf("answered standby to a takeover: %w", ErrStandby)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("path %s: %w", m.cfg.Addrs[i], err))
			continue
		}
		next = mpActive{v: v, path: i, gen: gen + 1}
		break
	}

	mv.mu.Lock()
	defer mv.mu.Unlock()
	close(mv.switching)
	mv.switching = nil
	if next.v == nil {
		return fmt.Errorf("no path took %q over: %w", mv.name, pathErrors(errs))
	}
	if mv.closed {
		next.v.Close()
		return ErrClosed
	}
	mv.cur = next
	mv.failovers++
	if w := mv.watch[next.path]; w != nil {
		// The new active handle replaces the standby one.
		mv.watch[next.path] = nil
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			w.Close()
		}()
	}
	if old.v != nil {
		// The old path's handle goes. Its I/O that failed completed
		// under the session's rules (a lost connection's
		// registrations were invalidated or replaced before it
		// failed); what is still queued there fails with ErrClosed
		// and is re-issued here (do). Its session stays: it keeps
		// reconnecting, so a later failover finds the gateway back.
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			old.v.Close()
		}()
	}
	return nil
}

// pathErrors is what each path answered, on one line (a log line, a
// command's one-line error); errors.Is and errors.As see each.
type pathErrors []error

func (e pathErrors) Error() string {
	if len(e) == 0 {
		return "no path was tried"
	}
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e pathErrors) Unwrap() []error { return e }

// failsOver reports whether an I/O error means the path, not the I/O,
// failed: the connection stayed down past FastFail, the gateway no
// longer serves the volume, or it left the command unanswered through
// five I/O timeouts (a gateway whose store hangs while it answers
// pings). Re-issuing such a command on another gateway is safe because
// the takeover fences the old one first: whatever it still holds can
// no longer reach the volume.
func failsOver(err error) bool {
	return errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrStandby) || errors.As(err, new(*unansweredError))
}

// worse returns the failure an I/O that failed over reports if no path
// serves it in time: a command left unanswered (the deadline) once one
// path did so, whatever the paths did after (a handle closed by the
// failover, a path lost), else the latest.
func worse(was, err error) error {
	if errors.As(was, new(*unansweredError)) {
		return was
	}
	return err
}

// do runs op on the active path, failing over and re-issuing it until it
// succeeds, fails for a reason of its own, or LossTimeout passes.
func (mv *MultipathVolume) do(ctx context.Context, op func(v *Volume) error) error {
	var deadline time.Time
	var why, takeover error
	for {
		a, err := mv.active()
		if err != nil {
			return err
		}
		err = op(a.v)
		if err != nil && errors.Is(err, ErrClosed) && mv.moved(a.gen) {
			continue // the handle closed by a failover: re-issue
		}
		if err == nil || !failsOver(err) || ctx.Err() != nil {
			return err
		}
		why = worse(why, err)
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(mv.m.cfg.LossTimeout)
		} else if now.After(deadline) {
			return mv.unserved(why, takeover)
		}
		// The takeover too ends at the deadline: a standby whose store
		// hangs (its lock break, its reservations' load) must not hold
		// the caller past LossTimeout (TestMultipathWedgedStandby).
		fctx, cancel := context.WithDeadline(ctx, deadline)
		ferr := mv.failover(fctx, a.gen, a.path, -1)
		cancel()
		if ferr != nil {
			if errors.Is(ferr, ErrClosed) || ctx.Err() != nil {
				return ferr
			}
			takeover = ferr
			// No path took over yet (both gateways restarting, say):
			// try again shortly, until the deadline.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// unserved is the failure of an I/O that no path served within
// LossTimeout: why, the path's failure, wrapped (what callers test), and
// the last takeover's failure, if one failed, said.
func (mv *MultipathVolume) unserved(why, takeover error) error {
	if takeover != nil {
		return fmt.Errorf("initiator: multipath %q: no path served it within %v: %w (takeover: %v)", mv.name, mv.m.cfg.LossTimeout, why, takeover)
	}
	return fmt.Errorf("initiator: multipath %q: no path served it within %v: %w", mv.name, mv.m.cfg.LossTimeout, why)
}

// moved reports whether a failover replaced the path of generation gen.
func (mv *MultipathVolume) moved(gen uint64) bool {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return !mv.closed && mv.cur.gen != gen
}

// Name is the volume's name.
func (mv *MultipathVolume) Name() string { return mv.name }

// Size is the volume's size in bytes, as the active path knows it.
func (mv *MultipathVolume) Size() int64 {
	a, err := mv.active()
	if err != nil {
		return 0
	}
	return a.v.Size()
}

// BlockSize is the volume's block size.
func (mv *MultipathVolume) BlockSize() int {
	a, err := mv.active()
	if err != nil {
		return 0
	}
	return a.v.BlockSize()
}

// ReadOnly reports whether the volume was opened read-only (or the
// active path serves it so).
func (mv *MultipathVolume) ReadOnly() bool {
	a, err := mv.active()
	if err != nil {
		return true
	}
	return a.v.ReadOnly()
}

// Path returns the address of the active path.
func (mv *MultipathVolume) Path() string {
	a, err := mv.active()
	if err != nil {
		return ""
	}
	return mv.m.cfg.Addrs[a.path]
}

// Failovers counts the failovers since the open.
func (mv *MultipathVolume) Failovers() int {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.failovers
}

// ReadAt reads len(p) bytes at off (Volume.ReadAt).
func (mv *MultipathVolume) ReadAt(p []byte, off int64) (int, error) {
	return mv.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt bounded by ctx.
func (mv *MultipathVolume) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	var n int
	err := mv.do(ctx, func(v *Volume) (err error) { n, err = v.ReadAtContext(ctx, p, off); return err })
	return n, err
}

// WriteAt writes p at off (Volume.WriteAt).
func (mv *MultipathVolume) WriteAt(p []byte, off int64) (int, error) {
	return mv.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt bounded by ctx.
func (mv *MultipathVolume) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	var n int
	err := mv.do(ctx, func(v *Volume) (err error) { n, err = v.WriteAtContext(ctx, p, off); return err })
	return n, err
}

// WriteAtFUA writes p at off durably (Volume.WriteAtFUA).
func (mv *MultipathVolume) WriteAtFUA(ctx context.Context, p []byte, off int64) (int, error) {
	var n int
	err := mv.do(ctx, func(v *Volume) (err error) { n, err = v.WriteAtFUA(ctx, p, off); return err })
	return n, err
}

// Flush makes the writes acknowledged before it durable (Volume.Flush).
// A flush re-issued on a new path covers what the old path acknowledged
// only if the old gateway's acknowledged writes were in the shared store
// when it answered: so with srpd's rbd backend, which turns librbd's
// cache off (a write returns once the OSDs have it), not with a gateway
// that acknowledges writes from a cache of its own.
func (mv *MultipathVolume) Flush(ctx context.Context) error {
	return mv.do(ctx, func(v *Volume) error { return v.Flush(ctx) })
}

// Discard deallocates a range (Volume.Discard).
func (mv *MultipathVolume) Discard(ctx context.Context, off, n int64) error {
	return mv.do(ctx, func(v *Volume) error { return v.Discard(ctx, off, n) })
}

// WriteZeroes zeroes a range (Volume.WriteZeroes).
func (mv *MultipathVolume) WriteZeroes(ctx context.Context, off, n int64) error {
	return mv.do(ctx, func(v *Volume) error { return v.WriteZeroes(ctx, off, n) })
}

// Extents reports which parts of [off, off+n) hold data, as the active
// path's gateway knows them (Volume.Extents).
func (mv *MultipathVolume) Extents(ctx context.Context, off, n int64) ([]Extent, error) {
	var exts []Extent
	err := mv.do(ctx, func(v *Volume) (err error) { exts, err = v.Extents(ctx, off, n); return err })
	return exts, err
}

// Refresh asks the active path's gateway for the volume's size now
// (Volume.Refresh).
func (mv *MultipathVolume) Refresh(ctx context.Context) (int64, error) {
	var size int64
	err := mv.do(ctx, func(v *Volume) (err error) { size, err = v.Refresh(ctx); return err })
	if err != nil {
		return mv.Size(), err
	}
	return size, nil
}

// Close closes the volume on its active path.
func (mv *MultipathVolume) Close() error {
	mv.mu.Lock()
	if mv.closed {
		mv.mu.Unlock()
		return nil
	}
	mv.closed = true
	v, watch := mv.cur.v, mv.watch
	mv.watch = nil
	mv.mu.Unlock()
	mv.stopRetry()
	var errs []error
	for _, w := range watch {
		if w != nil {
			errs = append(errs, w.Close())
		}
	}
	if v != nil {
		errs = append(errs, v.Close())
	}
	return errors.Join(errs...)
}
