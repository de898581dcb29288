package target

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// ErrClosed is returned by Serve once Shutdown has been called.
var ErrClosed = errors.New("target: shut down")

// Target serves volumes to initiators over transport listeners.
type Target struct {
	cfg Config
	// evictAge is evictAge, except in tests that must not depend on how
	// fast a loaded machine opens their connections.
	evictAge int64
	log      *slog.Logger
	epoch    time.Time
	gen      atomic.Uint32
	ids      atomic.Uint64
	// instance is the write verifier every login response carries; see
	// Instance.
	instance uint64

	// base is the context of connection setup; cancelled by a forced
	// shutdown.
	base     context.Context
	cancel   context.CancelFunc
	closedCh chan struct{}

	mu        sync.Mutex
	shutdown  bool
	conns     map[uint64]*conn
	listeners map[transport.Listener]struct{}
	volStats  map[string]*ioCounters
	wg        sync.WaitGroup // connection goroutines
	// connsBy counts conns by source (admitLocked).
	connsBy map[string]int
	// Connections not logged in yet, in all and by source (admitLocked).
	npending  int
	pendingBy map[string]int
	// pending are those connections, oldest first; evicting counts the
	// ones told to give up their slot that still hold it (admitLocked).
	pending  []*conn
	evicting int
	scratch  []pendingInfo

	accepted, rejected, violations atomic.Uint64
	evictions                      atomic.Uint64 // silent connections shed for a newcomer
	acl                            atomic.Pointer[ACL]
	// pr holds the volumes' reservations (reservation.go).
	pr *prTable
	// luns numbers the volumes as SRP logical units (lunmap.go).
	luns lunTable
	// spares are released connections' buffer sets kept for the next
	// accepts (conn_buffers.go).
	spares spareBufs
	// dirty holds the volumes' dirty marks (dirty.go).
	dirty dirtyTable
	// srpNexuses holds the SRP I_T nexuses' unit attention state,
	// shared by each nexus's channels (srp_nexus.go).
	srpNexuses srpNexusTable
	// abandoned counts the volume opens still running that no opener
	// waits for any more (conn_open.go); none starts while it is at
	// maxAbandoned (maxAbandonedOpens, except in tests). lunRefused
	// says an SRP LUN's open was refused for it: the next abandoned
	// open to return asks the sessions to try again.
	abandoned    atomic.Int32
	maxAbandoned int32
	lunRefused   atomic.Bool
	// refusals since the last log line about them, and when that was
	// (Unix nanoseconds); see refused.
	refusals      atomic.Int64
	refusalLogged atomic.Int64
}

// New creates a target; it serves nothing until Serve.
func New(cfg Config) (*Target, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Target{
		cfg: cfg, log: cfg.Logger, epoch: time.Now(), base: ctx, cancel: cancel,
		closedCh: make(chan struct{}),
		conns:    map[uint64]*conn{}, listeners: map[transport.Listener]struct{}{},
		volStats: map[string]*ioCounters{}, pendingBy: map[string]int{}, connsBy: map[string]int{},
		evictAge: evictAge, pr: newPRTable(), maxAbandoned: maxAbandonedOpens,
	}
	t.spares.max = cfg.SpareBuffers
	t.acl.Store(cfg.ACL)
	t.pr.notify = t.srpNexuses.raisePR
	if err := t.pr.load(cfg.Reservations); err != nil {
		return nil, err
	}
	if err := t.dirty.load(cfg.DirtyMarks); err != nil {
		return nil, err
	}
	if err := t.luns.load(cfg.LUNs); err != nil {
		return nil, err
	}
	for _, name := range t.dirty.lostVolumes() {
		// An operator reading the log of a restart must learn it here,
		// not from a host's failed journal commit (docs/srp.md, Unit attentions).
		t.log.Warn("the previous run ended with acknowledged writes not flushed: each SRP host's next flush of the volume fails with WRITE ERROR", "volume", name)
	}
	t.instance = newInstance()
	return t, nil
}

// newInstance draws a random, nonzero write verifier: zero on the wire
// means "no promise", and a random value (rather than a start time or a
// counter) cannot repeat across a restart with a clock set back or a data
// directory restored from a copy.
func newInstance() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// Instance is the target's write verifier, sent in every login response:
// it is chosen afresh by New, so a restarted process (whose store may have
// lost writes it had acknowledged but not flushed) always has another one.
func (t *Target) Instance() uint64 { return t.instance }

// SetACL replaces the access rules and re-evaluates every session
// against them (see PolicyChanged): LISTs and OPENs from now on use the
// new rules, and a volume a session has open loses what the new rules
// no longer allow, within milliseconds. nil allows everything
// read-write.
func (t *Target) SetACL(a *ACL) {
	t.acl.Store(a)
	rules, deny := 0, false
	if a != nil {
		rules, deny = len(a.Rules), a.DenyByDefault
	}
	t.log.Info("access rules changed; re-evaluating open sessions", "rules", rules, "deny_by_default", deny)
	t.notifyPolicy()
}

// PolicyChanged tells the target that the answers of Config.Secrets may
// have changed (SetACL implies it). Every session is re-evaluated on
// its own goroutine, without waiting for its next request: one whose
// initiator's secret changed or was removed is disconnected, and must
// log in again with the current secret; a handle to a volume the ACL no
// longer allows is revoked (its volume closed, its commands answered
// access denied); one narrowed to read-only refuses writes (write
// protected). Commands a volume is already running finish. Access is
// never widened on an open handle: the initiator reopens for that.
// PolicyChanged does not block.
func (t *Target) PolicyChanged() {
	t.log.Info("secrets changed; re-evaluating open sessions")
	t.notifyPolicy()
}

func (t *Target) notifyPolicy() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.policyChanged()
	}
}

// VolumeResized tells the target that the volume named volume is now
// size bytes: every connection that has it open checks commands against
// the new size, and one whose initiator reads notices
// (wire.RespCapacityChanged) gets one in the next response on that
// handle, so its Volume.Size follows without a reopen. It returns once
// every connection has the new size (a connection that ends meanwhile
// no longer counts), or with ctx's error.
//
// Call it after growing the store, and before shrinking it: commands
// past the new end are then refused as out of range, rather than reaching
// the store and failing there. A command already running when a shrink
// lands may still fail in the store; it is answered out of range too.
func (t *Target) VolumeResized(ctx context.Context, volume string, size int64) error {
	type wait struct {
		c    *conn
		done <-chan struct{}
	}
	t.mu.Lock()
	waits := make([]wait, 0, len(t.conns))
	for _, c := range t.conns {
		waits = append(waits, wait{c, c.volumeResized(volume, size)})
	}
	t.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w.done:
		case <-w.c.quiesced:
		case <-w.c.finished:
		case <-ctx.Done():
			return fmt.Errorf("target: resize of %q to %d bytes reaching the connections: %w", volume, size, ctx.Err())
		}
	}
	return nil
}

// CatalogChanged tells the target that the catalog's list of volumes
// changed (a volume or snapshot created or deleted). A gosrp session
// sees it in its next LIST. Every SRP session brings its LUN table up
// to the catalog (docs/srp.md, LUNs): a new volume the initiator may
// see becomes a LUN with the number the LUN map saved for it, a gone
// volume's LUN is retired; then each I_T nexus gets REPORTED LUNS DATA
// HAS CHANGED as a unit attention on its logical units (SPC-4 6.33),
// so that Linux rescans and finds the new LUN. CatalogChanged does not
// block: the sessions list and open off their run loops.
func (t *Target) CatalogChanged() {
	t.srpNexuses.catalogGen.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.catalogChanged()
	}
}

// OpenSessions returns how many initiator sessions have the volume named
// volume open: the channels (connections) of one session count once, and
// so do several handles of one connection. A snapshot is a volume of its
// own name (VOLUME@SNAPSHOT): its readers are not counted for VOLUME. An
// OPEN still running, or a handle the policy revoked, does not count.
// srpd asks before shrinking a volume, which would cut off blocks those
// sessions were told they could address.
func (t *Target) OpenSessions(volume string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var seen []string
	for _, c := range t.conns {
		if o := c.opened.Load(); o != nil && slices.Contains(o.names, volume) && !slices.Contains(seen, o.session) {
			seen = append(seen, o.session)
		}
	}
	return len(seen)
}

// Serve accepts connection requests on l until ctx is done, l fails or is
// closed, or Shutdown is called; it closes l when it returns. Each accepted
// connection is served by goroutines the Target owns: they outlive Serve
// and end with the connection or with Shutdown. Serve returns ErrClosed
// after Shutdown, ctx.Err() when ctx ends, or the listener's error.
func (t *Target) Serve(ctx context.Context, l transport.Listener) error {
	t.mu.Lock()
	if t.shutdown {
		t.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	t.listeners[l] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.listeners, l)
		t.mu.Unlock()
		l.Close()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-t.closedCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			select {
			case <-t.closedCh:
				return ErrClosed
			default:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		remote := req.RemoteAddr()
		src := source(remote)
		t.mu.Lock()
		if t.shutdown {
			t.mu.Unlock()
			req.Reject(refusalData(req.PrivateData(), admitted, true))
			return ErrClosed
		}
		c := &conn{t: t, remote: remote, src: src, prelogin: true, log: t.log,
			drainCh: make(chan struct{}), killCh: make(chan struct{}), endCh: make(chan struct{}), evictCh: make(chan struct{}),
			policyCh: make(chan struct{}, 1), quiesced: make(chan struct{}), finished: make(chan struct{})}
		if v := t.admitLocked(c, int64(time.Since(t.epoch))); v != admitted {
			t.mu.Unlock()
			// Counted before the peer can see the reject, so that Stats
			// never lags what a peer has been told.
			t.refused(remote, v)
			req.Reject(refusalData(req.PrivateData(), v, false))
			continue
		}
		c.id = t.ids.Add(1)
		t.conns[c.id] = c
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serveConn(c, req)
	}
}

func (t *Target) serveConn(c *conn, req transport.ConnRequest) {
	defer t.wg.Done()
	defer func() {
		t.loginDone(c)
		t.mu.Lock()
		t.connGoneLocked(c)
		t.mu.Unlock()
		close(c.finished)
	}()
	if !c.setup(t.base, req) {
		return // setup counted the reject
	}
	t.accepted.Add(1)
	c.log.Debug("connection accepted", "remote", c.remote, "conn", c.id)
	c.run()
}

// Shutdown stops accepting connections (closing every listener Serve is
// using), lets each connection finish and answer the requests it has in
// flight (new ones are answered Busy, logins in progress are rejected),
// disconnects them, and waits for their goroutines. When ctx ends first,
// every connection is disconnected at once and Shutdown returns an error
// wrapping ctx.Err(); their teardown (which waits for running volume
// calls) finishes in the background. The error says how many connections
// were cut, and how many had only their QPs' destroy left, which some
// devices take minutes over (rxe: docs/performance.md).
func (t *Target) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	if !t.shutdown {
		t.shutdown = true
		close(t.closedCh)
		for l := range t.listeners {
			l.Close()
		}
	}
	for _, c := range t.conns {
		c.drain()
	}
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		t.cancel()
		t.closeSpares()
		return nil
	case <-ctx.Done():
	}
	t.cancel()
	// The connections still tearing down release their own sets.
	t.closeSpares()
	t.mu.Lock()
	n, destroying := len(t.conns), 0
	for _, c := range t.conns {
		select {
		case <-c.quiesced:
			destroying++ // only its verbs objects are left to go
		default:
			c.kill()
		}
	}
	t.mu.Unlock()
	switch {
	case n == 0: // the last one ended as the deadline came
		return ctx.Err()
	case n == destroying:
		return fmt.Errorf("target: shutdown: the device still destroying the QPs of %d connections: %w", n, ctx.Err())
	}
	return fmt.Errorf("target: shutdown: %d connections cut with I/O in flight or a volume open unanswered, %d more waiting on the device to destroy their QPs: %w",
		n-destroying, destroying, ctx.Err())
}

// closeSpares releases the spare buffer sets; none is kept after.
func (t *Target) closeSpares() {
	if err := t.spares.close(); err != nil {
		t.log.Warn("releasing spare connection buffers", "err", err)
	}
}

func (t *Target) volumeCounters(name string) *ioCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.volStats[name]
	if s == nil {
		s = &ioCounters{}
		t.volStats[name] = s
	}
	return s
}

// Stats returns a snapshot of the target's counters.
func (t *Target) Stats() Stats {
	var s Stats
	s.Accepted, s.Rejected, s.Violations = t.accepted.Load(), t.rejected.Load(), t.violations.Load()
	s.Evicted = t.evictions.Load()
	t.mu.Lock()
	for name, vc := range t.volStats {
		s.Volumes = append(s.Volumes, VolumeStats{Name: name, IOStats: vc.load()})
	}
	for _, c := range t.conns {
		cs := ConnStats{ID: c.id, Remote: c.remote, State: connState(c.stateNum.Load()).String(),
			Credits: int(c.creditsGr.Load()), CreditsInUse: int(c.inUse.Load()), OpenVolumes: int(c.nopen.Load()),
			IOStats: c.stats.load()}
		if p := c.iniName.Load(); p != nil {
			cs.Initiator = *p
		}
		s.Conns = append(s.Conns, cs)
		s.CreditsInUse += cs.CreditsInUse
	}
	t.mu.Unlock()
	s.Connections = len(s.Conns)
	sort.Slice(s.Volumes, func(i, j int) bool { return s.Volumes[i].Name < s.Volumes[j].Name })
	sort.Slice(s.Conns, func(i, j int) bool { return s.Conns[i].ID < s.Conns[j].ID })
	return s
}

// reinstateTimeout bounds how long a new login waits for the connection it
// replaces to finish its volume I/O (conn.quiesced).
const reinstateTimeout = 30 * time.Second

// reinstate makes c the only connection serving an initiator channel: any
// other connection logged in under key is ended, and reinstate returns
// once its teardown, including the volume calls it had started, is done.
// Without this a write the dead connection had fetched but not yet
// applied could land after the initiator re-issued it and then wrote
// newer data. It reports false if the old connection did not finish in
// time.
func (t *Target) reinstate(c *conn, key string) bool {
	t.mu.Lock()
	var old []*conn
	for _, o := range t.conns {
		if k := o.chanKey.Load(); o != c && k != nil && *k == key {
			old = append(old, o)
		}
	}
	t.mu.Unlock()
	deadline := time.NewTimer(reinstateTimeout)
	defer deadline.Stop()
	for _, o := range old {
		t.log.Info("login replaces an older connection of the same channel", "conn", c.id, "old", o.id, "remote", c.remote)
		o.kill()
		// Its volume I/O over and its volumes closed, the old
		// connection can touch nothing the new one serves; the destroy
		// of its QP, which rxe may take minutes over, is not waited
		// for (TestDestroyHeldDuringReconnect).
		select {
		case <-o.quiesced:
		case <-o.finished:
		case <-deadline.C:
			return false
		}
	}
	c.chanKey.Store(&key)
	return true
}
