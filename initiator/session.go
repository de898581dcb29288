package initiator

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// Session is a logged-in connection to a target, over one or more
// channels (QPs). It is safe for concurrent use.
type Session struct {
	cfg    Config
	dev    transport.Device
	pd     transport.PD
	data   *transport.Arena // bounce buffers, then the application's pool
	dataMR transport.MR
	bufOff int // where the application's buffer pool starts
	// isolate: every I/O is bounced (see channel.isolate); set before the
	// channels' loops start, read-only after.
	isolate bool

	chans []*channel
	next  atomic.Uint32
	id    uint64 // names the session's channels to the target (reinstatement)
	// fence orders the channels' logins in an SRP session of several
	// (srp_fence.go); nil otherwise.
	fence *srpFence

	mu          sync.Mutex
	vols        map[*Volume]struct{}
	target      string
	maxTransfer int
	bufFree     []bufRange
	closed      bool

	stats stats
	verifier

	// destroys are the destroys of old connections' QPs and CQs under
	// way in the background (Session.destroy); destroying holds a slot
	// for each.
	destroys   sync.WaitGroup
	destroying chan struct{}
}

type bufRange struct{ off, n int }

// Dial connects to a target and logs in on every channel.
func Dial(ctx context.Context, cfg Config) (*Session, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, vols: map[*Volume]struct{}{}, maxTransfer: cfg.MaxTransfer,
		destroying: make(chan struct{}, maxDestroying)}
	s.stats.init()
	if cfg.Protocol == ProtocolSRP && cfg.Channels > 1 {
		s.fence = newSRPFence()
	}
	var idb [8]byte
	rand.Read(idb[:])
	s.id = binary.LittleEndian.Uint64(idb[:]) | 1 // zero would opt out of reinstatement
	ep, err := cfg.Provider.Resolve(ctx, cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("initiator: resolve %s: %w", cfg.Addr, err)
	}
	s.dev = ep.Device()
	ep.Close()
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return nil, err
	}
	bounce := cfg.Channels * cfg.Credits * cfg.MaxTransfer
	s.bufOff = bounce
	size := bounce + cfg.BufferBytes
	if s.data, err = transport.NewArena(size, transport.ArenaOptions{}); err != nil {
		s.pd.Close()
		return nil, err
	}
	if cfg.BufferBytes > 0 {
		s.bufFree = []bufRange{{s.bufOff, s.data.Len() - s.bufOff}}
	}
	if err := s.initReplay(); err != nil {
		s.data.Close()
		s.pd.Close()
		return nil, err
	}
	// The data MR is the base for memory windows; its own rkey is never
	// sent to the target (only window keys are).
	if s.dataMR, err = s.pd.RegMR(s.data, 0, s.data.Len(), transport.AccessLocalWrite|transport.AccessMWBind); err != nil {
		s.data.Close()
		s.pd.Close()
		if s.ringMem != nil {
			s.ringMem.Close()
		}
		return nil, fmt.Errorf("initiator: register data buffers: %w", err)
	}
	for i := 0; i < cfg.Channels; i++ {
		c := newChannel(s, i)
		if err := c.setup(s.dev); err != nil {
			s.abort()
			return nil, err
		}
		s.chans = append(s.chans, c)
		s.isolate = c.isolate
		if err := c.connectRetry(ctx); err != nil {
			s.abort()
			return nil, err
		}
	}
	for _, c := range s.chans {
		go c.run()
	}
	return s, nil
}

// dialAttempts bounds Dial's attempts at each channel's first connection;
// a refused login or failed authentication is not retried.
const dialAttempts = 3

func (c *channel) connectRetry(ctx context.Context) error {
	var err error
	for i := 0; i < dialAttempts; i++ {
		if err = c.connect(ctx); err == nil {
			return nil
		}
		var le *LoginError
		if errors.As(err, &le) || errors.Is(err, ErrAuth) || ctx.Err() != nil {
			return err
		}
		c.log.Debug("connect failed; retrying", "attempt", i+1, "err", err)
	}
	return err
}

// abort releases what Dial built before the loops started.
func (s *Session) abort() {
	for _, c := range s.chans {
		c.teardown()
		c.shutdown()
	}
	s.destroys.Wait()
	s.dataMR.Close()
	s.data.Close()
	s.pd.Close()
	if s.ringMem != nil {
		s.ringMem.Close()
	}
}

func (s *Session) noteLogin(ch int, target string, maxTransfer int) {
	s.mu.Lock()
	s.target = target
	s.maxTransfer = min(s.maxTransfer, maxTransfer)
	s.mu.Unlock()
}

// Target is the target's name from the login.
func (s *Session) Target() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

// MaxTransfer is the largest transfer one command carries; Volume splits
// larger I/O.
func (s *Session) MaxTransfer() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxTransfer
}

func (s *Session) bounceOff(ch, slot int) int {
	return (ch*s.cfg.Credits + slot) * s.cfg.MaxTransfer
}

// segmentFor reports whether b lies in the session's buffer pool, and
// where: such buffers are registered in place (zero copy).
func (s *Session) segmentFor(b []byte) (frmr.Segment, bool) {
	if len(b) == 0 || s.data.Len() == s.bufOff {
		return frmr.Segment{}, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.data.Bytes())))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base+uintptr(s.bufOff) || p+uintptr(len(b)) > base+uintptr(s.data.Len()) {
		return frmr.Segment{}, false
	}
	return frmr.Segment{Arena: s.data, Off: int(p - base), Len: len(b)}, true
}

// Check verifies the invariants of every channel: its registration pool's
// accounting (every MR free, in use or tainted exactly once; no FREE MR
// named by an outstanding work request; signaling bounds) and its credit
// slots. It runs on the channels' own goroutines between two passes, so a
// test can call it at any moment of a live session; it waits for a
// channel that is reconnecting until ctx ends.
func (s *Session) Check(ctx context.Context) error {
	for _, c := range s.chans {
		reply := make(chan error, 1)
		select {
		case c.checks <- reply:
		case <-c.done:
			continue // closed: nothing left to check
		case <-ctx.Done():
			return fmt.Errorf("initiator: check channel %d: %w", c.id, ctx.Err())
		}
		if err := <-reply; err != nil {
			return err
		}
	}
	return nil
}

// zeroCopy is segmentFor for I/O: where the device cannot keep a key
// inside its window (isolate), no buffer is registered in place.
func (s *Session) zeroCopy(b []byte) (frmr.Segment, bool) {
	if s.isolate {
		return frmr.Segment{}, false
	}
	return s.segmentFor(b)
}

// abandon gives up on a synchronous request whose caller's context ended.
// It succeeds only where the request can no longer reach the caller's
// buffer once abandon returns: the buffer was never exposed (bounced
// I/O) and the poller is not copying from it this instant. Otherwise the
// caller must wait for the completion.
func (s *Session) abandon(r *Request) bool {
	if _, zc := s.zeroCopy(r.Buf); zc {
		return false // the target may reach the buffer itself until the key is dead
	}
	for {
		if r.abandon() {
			return true
		}
		if !r.pinned() {
			return false // claimed: it completes soon
		}
		runtime.Gosched() // a copy of at most MaxTransfer bytes
	}
}

// AllocBuffer returns n bytes (rounded up to the page size) of the
// session's registered buffer pool (Config.BufferBytes). I/O on such
// buffers is registered in place instead of going through a bounce
// buffer. Return it with FreeBuffer.
func (s *Session) AllocBuffer(n int) ([]byte, error) {
	n = (n + transport.PageSize - 1) &^ (transport.PageSize - 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.bufFree {
		if r.n >= n {
			s.bufFree[i] = bufRange{r.off + n, r.n - n}
			if s.bufFree[i].n == 0 {
				s.bufFree = append(s.bufFree[:i], s.bufFree[i+1:]...)
			}
			return s.data.Bytes()[r.off : r.off+n : r.off+n], nil
		}
	}
	return nil, fmt.Errorf("initiator: no %d bytes left in the %d-byte buffer pool (Config.BufferBytes): %w", n, s.cfg.BufferBytes, transport.ErrNoMemory)
}

// FreeBuffer returns a buffer from AllocBuffer.
func (s *Session) FreeBuffer(b []byte) {
	seg, ok := s.segmentFor(b[:cap(b)])
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bufFree = append(s.bufFree, bufRange{seg.Off, seg.Len})
	// Coalesce neighbours so the pool does not fragment for good.
	for i := 0; i < len(s.bufFree); i++ {
		for j := 0; j < len(s.bufFree); j++ {
			if i != j && s.bufFree[i].off+s.bufFree[i].n == s.bufFree[j].off {
				s.bufFree[i].n += s.bufFree[j].n
				s.bufFree = append(s.bufFree[:j], s.bufFree[j+1:]...)
				i, j = -1, len(s.bufFree)
			}
		}
		if i < 0 {
			continue
		}
	}
}

func (s *Session) pick() *channel {
	return s.chans[int(s.next.Add(1))%len(s.chans)]
}

func (s *Session) openVolumes() []*Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := make([]*Volume, 0, len(s.vols))
	for v := range s.vols {
		vs = append(vs, v)
	}
	return vs
}

// control runs a control request on channel c and waits for its answer.
func (s *Session) control(ctx context.Context, c *channel, req *wire.ControlRequest) (*wire.ControlResponse, error) {
	return s.controlReq(ctx, c, &Request{Op: opControl, ctrl: req})
}

func (s *Session) controlReq(ctx context.Context, c *channel, r *Request) (*wire.ControlResponse, error) {
	done := make(chan *Request, 1)
	r.Done = done
	if err := c.submit(r); err != nil {
		return nil, err
	}
	select {
	case <-done:
		if r.Err != nil {
			return nil, r.Err
		}
		return &r.ctrlRsp, nil
	case <-ctx.Done():
		if !r.abandon() {
			<-done
			return &r.ctrlRsp, r.Err
		}
		return nil, ctx.Err()
	}
}

// VolumeInfo describes a volume the target offers this initiator.
type VolumeInfo struct {
	Name      string
	Size      int64
	BlockSize int
	ReadOnly  bool
	// ID is the volume's identity where the target reports one that
	// stays the same across logins and renumbering: for ProtocolSRP the
	// LUN's device identification (VPD 0x83: "naa.<hex>", "eui.<hex>"
	// or "t10.<vendor id>"), what udev and multipath name a disk by.
	ID string
}

// Volumes lists the volumes this initiator may open.
func (s *Session) Volumes(ctx context.Context) ([]VolumeInfo, error) {
	if s.cfg.Protocol == ProtocolSRP {
		return s.srpVolumes(ctx)
	}
	rsp, err := s.control(ctx, s.chans[0], &wire.ControlRequest{Op: wire.ControlList})
	if err != nil {
		return nil, fmt.Errorf("initiator: list volumes: %w", err)
	}
	if rsp.Error != "" {
		return nil, fmt.Errorf("initiator: list volumes: %s", rsp.Error)
	}
	out := make([]VolumeInfo, len(rsp.Volumes))
	for i, v := range rsp.Volumes {
		out[i] = VolumeInfo{Name: v.Name, Size: int64(v.Size), BlockSize: int(v.BlockSize), ReadOnly: v.ReadOnly}
	}
	return out, nil
}

// OpenOptions modify Open.
type OpenOptions struct {
	ReadOnly bool
	// OnResize, if set, is called with the volume's new size when the
	// target reports that it changed (a resize under the open volume;
	// see Volume.Size): once per change, on one of the session's I/O
	// goroutines, so it must return quickly and must not wait for I/O
	// on the session. A target that predates capacity notices never
	// reports one; the size then changes only with a reopen.
	OnResize func(size int64)
	// Exclusive opens the volume as its only writer: an implicit
	// write-exclusive reservation of this session, which the target
	// refuses (ErrReservationConflict) while another session has the
	// volume open for writing or another host's reservation forbids
	// this one's writes, and which ends when the volume is closed or
	// the session ends. Other sessions may still open the volume; their
	// writes fail with ErrReservationConflict, their reads work. A
	// target that predates it opens the volume as usual.
	Exclusive bool
	// Takeover asks a target that is a standby gateway for the volume
	// (Volume.Standby) to become the active one: it fences the gateway
	// that served the volume and takes it before it answers, and before
	// it serves any I/O. A failed takeover fails the open with
	// ErrStandby. Re-opens after a reconnect do not ask again. A target
	// without gateways ignores it. Multipath uses it to fail over. Over
	// ProtocolSRP it is SET TARGET PORT GROUPS for the LUN's target port
	// group, sent when the LUN reports explicit ALUA and REPORT TARGET
	// PORT GROUPS says the group is standby (srpd with
	// --srp-port-group).
	Takeover bool
	// OnPathState, if set, is called when the target tells, unasked,
	// that the volume became standby (it was fenced, or lost the lock
	// to another gateway) or active at it (wire.PathNotice; Standby
	// follows): on one of the session's I/O goroutines, so it must
	// return quickly and must not wait for I/O on the session.
	// Multipath fails over on it. A target that predates path notices
	// sends none; the state then shows at the next open or I/O.
	OnPathState func(standby bool)
}

// Open opens a volume on every channel of the session.
func (s *Session) Open(ctx context.Context, name string, opts OpenOptions) (*Volume, error) {
	if opts.Exclusive && opts.ReadOnly {
		return nil, fmt.Errorf("initiator: open %q: an exclusive open must be read-write: %w", name, ErrInvalid)
	}
	if s.cfg.Protocol == ProtocolSRP {
		if opts.Exclusive {
			return nil, fmt.Errorf("initiator: open %q: exclusive opens are gosrp's, not SRP's: %w", name, ErrInvalid)
		}
		return s.srpOpen(ctx, name, opts)
	}
	v := &Volume{s: s, name: name, readOnly: opts.ReadOnly, exclusive: opts.Exclusive, onResize: opts.OnResize, onPath: opts.OnPathState}
	v.dur.ovf.OnDone = s.overflowDone
	// Known to the session first, so a reconnect in the middle re-opens it.
	s.mu.Lock()
	s.vols[v] = struct{}{}
	s.mu.Unlock()
	opened := false
	fail := func(err error) (*Volume, error) {
		if opened {
			// Close the handles the other channels got: an exclusive
			// open would otherwise hold the volume until the session
			// ends.
			v.Close()
			return nil, err
		}
		s.mu.Lock()
		delete(s.vols, v)
		s.mu.Unlock()
		return nil, err
	}
	for _, c := range s.chans {
		rsp, epoch, err := s.openOn(ctx, c, wire.ControlRequest{Op: wire.ControlOpen, Volume: name, ReadOnly: opts.ReadOnly, Exclusive: opts.Exclusive, Takeover: opts.Takeover})
		if err != nil {
			return fail(fmt.Errorf("initiator: open %q: %w", name, err))
		}
		if rsp.Error != "" {
			return fail(fmt.Errorf("initiator: open %q: %s: %w", name, rsp.Error, errNoVolume(rsp.Sense)))
		}
		if !opened {
			s.dmu.Lock()
			gen := s.instGen
			s.dmu.Unlock()
			v.learnIdentity(rsp.Identity, rsp.Caps&wire.CapVolatile != 0, gen)
		} else if k := v.ident.Load(); k.id != rsp.Identity {
			return fail(fmt.Errorf("initiator: open %q: channel %d opened another volume of that name than the first: %w", name, c.id, ErrVolumeReplaced))
		}
		v.bs, v.readOnly, v.caps = int(rsp.BlockSize), rsp.ReadOnly || opts.ReadOnly, rsp.Caps
		v.standby.Store(rsp.PathState != wire.PathActive)
		v.size.Store(int64(rsp.Size))
		c.setHandle(v, rsp.Handle, epoch)
		opened = true
	}
	if v.bs <= 0 || v.bs&(v.bs-1) != 0 {
		return fail(fmt.Errorf("initiator: open %q: target reports block size %d: %w", name, v.bs, ErrProtocol))
	}
	return v, nil
}

// openRetry is how long Open waits before it asks again for a volume
// the target is still opening. The target's own wait (its OpenWait,
// seconds) paces the tries; this only keeps a target that answers at
// once from being asked in a loop.
const openRetry = 100 * time.Millisecond

// openRetryWait waits d, or until ctx ends (its error).
func openRetryWait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openOn sends the OPEN req on c, and sends it again while the target
// answers that it is still opening the volume (SenseBecomingReady: its
// store has not answered within the target's OpenWait), until ctx
// ends. It returns the answer and the epoch of the connection that
// gave it.
func (s *Session) openOn(ctx context.Context, c *channel, req wire.ControlRequest) (*wire.ControlResponse, uint64, error) {
	notReady := "" // the last NOT READY answer
	for {
		q := req // the loop writes a request's tag into it
		r := &Request{Op: opControl, ctrl: &q}
		rsp, err := s.controlReq(ctx, c, r)
		if err == nil && rsp.Sense == wire.SenseBecomingReady {
			notReady = rsp.Error
			if err = openRetryWait(ctx, openRetry); err == nil {
				continue
			}
		}
		switch {
		case err != nil && notReady != "" && ctx.Err() != nil:
			return nil, 0, fmt.Errorf("%w (%s): %w", ErrNotReady, notReady, err)
		case err != nil:
			// r may be abandoned: the loop still writes it.
			return nil, 0, err
		}
		return rsp, r.epoch, nil
	}
}

func errNoVolume(s wire.Sense) error {
	switch s {
	case wire.SenseWriteProtected:
		return ErrReadOnly
	case wire.SenseAccessDenied:
		return ErrAccessDenied
	case wire.SenseReservationConflict:
		return ErrReservationConflict
	case wire.SenseNotActive:
		return ErrStandby
	}
	return ErrInvalid
}

// setHandle records a volume's handle; the loop reads handles only while
// dispatching, so the update goes through the channel's mutex.
func (c *channel) setHandle(v *Volume, h uint32, epoch uint64) {
	c.mu.Lock()
	c.pendingHandles = append(c.pendingHandles, handleUpdate{v: v, h: h, epoch: epoch})
	c.mu.Unlock()
	c.ring()
}

type handleUpdate struct {
	v      *Volume
	h      uint32
	epoch  uint64
	remove bool
	// replaced: v was found replaced (ErrVolumeReplaced); its parked
	// requests go back to the queue, where dispatch fails them.
	replaced bool
}

// Close finishes the I/O already submitted (bounded by the I/O timeout),
// then disconnects every channel and releases the session's memory. A
// request whose caller gave up on it (an Open or I/O whose context
// ended) is not waited for: the disconnect ends it at the target.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	for _, c := range s.chans {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		close(c.stop)
	}
	for _, c := range s.chans {
		<-c.done
	}
	s.destroys.Wait() // the QPs and CQs go before their PD
	var errs []error
	if err := s.dataMR.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.pd.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.data.Close(); err != nil {
		errs = append(errs, err)
	}
	if s.ringMem != nil {
		if err := s.ringMem.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxDestroying bounds the destroys of a session's old QPs that run in
// the background; past it, a teardown destroys in line, so a link that
// keeps flapping over a device that keeps stalling holds a bounded
// number of QPs.
const maxDestroying = 4

// destroy destroys an old connection's QP, then its CQ (either may be
// nil). A device may take minutes over a QP's destroy: rxe's waits for
// the references the QP's tasks still hold, and on Linux 6.12 one took
// 9 minutes (docs/performance.md). The reconnect need not wait for it:
// the QP is in ERR, its registrations were replaced or invalidated
// before (replaceRegistrations, frmr.Pool.Close), and its receives are
// flushed. So up to maxDestroying destroys run in the background, and
// Session.Close waits for them before it deallocates the PD they
// belong to.
func (s *Session) destroy(log *slog.Logger, qp transport.QP, cq transport.CQ) {
	select {
	case s.destroying <- struct{}{}:
		s.destroys.Add(1)
		go func() {
			defer s.destroys.Done()
			destroyConn(log, qp, cq)
			<-s.destroying
		}()
	default:
		destroyConn(log, qp, cq)
	}
}

func destroyConn(log *slog.Logger, qp transport.QP, cq transport.CQ) {
	if qp != nil {
		if err := qp.Close(); err != nil {
			// Only a window still bound through it keeps a QP alive
			// (ErrBusy); replaceRegistrations should have made that
			// impossible, so say so loudly rather than leak in silence.
			log.Error("destroying the QP failed; it is leaked", "err", err)
		}
	}
	if cq != nil {
		cq.Close()
	}
}
