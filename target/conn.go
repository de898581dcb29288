package target

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// conn is the shell around one connection's core: it owns the verbs
// objects, polls the CQ, posts what the core asks for, and runs backend
// jobs on a pool of workers so the poller never blocks on a volume.
// Setting up and releasing its verbs objects are here; its run loop and
// teardown are in conn_loop.go, and how it carries out the core's
// actions (posts, jobs, batches) in conn_execute.go.
type conn struct {
	t      *Target
	id     uint64
	remote string
	log    *slog.Logger
	// src is what the per-source pre-login cap counts c under; prelogin
	// is set while c holds a pre-login slot (Target.loginDone).
	src      string
	prelogin bool
	// pendingSince is when c was admitted, evicted whether a newcomer has
	// taken its slot (both under t.mu; admitLocked).
	pendingSince int64
	evicted      bool

	bufs *connBufs // its PD and registered buffers (conn_buffers.go)
	// bufsOK: the setup's verbs calls with bufs succeeded (release).
	bufsOK bool
	cq     transport.CQ
	qp     transport.QP
	cm     transport.Conn

	core *core
	wcs  [64]transport.WC

	jobs    chan int32
	done    chan int32
	inline  []int32      // jobs execute ran on the run loop, to report (finishInline)
	batches []batchChain // execute's write batches, one per volume
	wbufs   [][]byte     // runBatch's scratch on the run loop
	woffs   []int64
	workers sync.WaitGroup
	cqReady <-chan struct{}
	rearm   chan struct{}
	waiter  sync.WaitGroup
	stopW   context.CancelFunc

	drainCh   chan struct{} // closed by Shutdown
	killCh    chan struct{} // closed when Shutdown's context ends
	endCh     chan struct{} // closed when teardown starts
	evictCh   chan struct{} // closed when a newcomer takes c's pre-login slot
	drainOnce sync.Once
	killOnce  sync.Once
	evictOnce sync.Once
	// policyCh (capacity 1) says the ACL, the secrets or the size of a
	// volume changed; one pending signal covers any number of changes,
	// since the core reads the policy as it is when it handles it, and
	// the resizes are kept until then.
	policyCh chan struct{}
	// resizes are the volumes resized since the run loop last looked
	// (name → new size), under resizeMu; Target.VolumeResized records
	// them and signals policyCh, and resizeWait are closed once the core
	// has them.
	resizeMu   sync.Mutex
	resizes    map[string]int64
	resizeWait []chan struct{}
	// paths are the volumes whose path state changed since the run loop
	// last looked, under resizeMu, recorded by Target.PathStateChanged
	// and PathFenced.
	paths map[string]pathChanges
	// lunsChanged: the catalog's volumes changed (Target.CatalogChanged;
	// conn_srp.go), for the run loop to bring an SRP session's LUNs up
	// to date (conn_srp_luns.go); refreshing, the run loop's, says a
	// refresh goroutine (refreshers) is running.
	lunsChanged atomic.Bool
	refreshing  bool
	refreshers  sync.WaitGroup
	// signals counts closes of drainCh and killCh and sends on policyCh,
	// each bumped after it: the busy loop reads it instead of selecting
	// on the channels.
	signals atomic.Uint32
	// closers are the goroutines closing revoked volumes (closeRevoked);
	// teardown waits for them.
	closers sync.WaitGroup

	stats    ioCounters
	inUse    atomic.Int32
	stateNum atomic.Uint32
	nopen    atomic.Int32
	// opened is what the connection has open, republished when the
	// core's handlesGen moves past openGen; Target.OpenSessions reads it
	// from other goroutines.
	opened    atomic.Pointer[openedVols]
	openGen   uint64
	creditsGr atomic.Int32
	iniName   atomic.Pointer[string]
	// chanKey names the initiator channel this connection serves once
	// logged in. quiesced is closed when its volume I/O is over, its
	// volumes closed and its SRP nexus left: what a login replacing it
	// waits for. finished is closed when its teardown is complete, verbs
	// objects destroyed included.
	chanKey  atomic.Pointer[string]
	quiesced chan struct{}
	finished chan struct{}
	// srpNx is the SRP I_T nexus the connection joined (conn_srp.go),
	// nil for none; the run loop's own.
	srpNx *srpNexus
	// nexusIn, under nexusMu, is what the nexus's other channels asked
	// of this one or told it (conn_srp.go), handled by the run loop on a
	// policyCh signal; once nexusShut, nothing more is taken.
	nexusMu   sync.Mutex
	nexusIn   []nexusMsg
	nexusShut bool
	// tmfLogs aggregate the run loop's task management log lines: its
	// own functions, then other nexuses' aborts here (logTaskMgmt).
	tmfLogs [2]tmfLog
	// refreshIn, under nexusMu, is a LUN refresh step's result for the
	// run loop (conn_srp_luns.go).
	refreshIn *srpRefresh
	// opens: the volume opens of gosrp OPENs and SRP LUNs, each on a
	// goroutine of its own so that a hung store holds no opener past
	// Config.OpenWait (conn_open.go).
	opens connOpens
}

func (c *conn) drain() { c.drainOnce.Do(func() { close(c.drainCh); c.signals.Add(1) }) }
func (c *conn) kill()  { c.killOnce.Do(func() { close(c.killCh); c.signals.Add(1) }) }
func (c *conn) evict() { c.evictOnce.Do(func() { close(c.evictCh); c.signals.Add(1) }) }

// onEvict ends c if it still has not logged in; one that logged in since
// its eviction was decided keeps its session (prelogin is c's own).
func (c *conn) onEvict() {
	if c.prelogin {
		c.core.close("evicted: every pre-login slot was held, and this connection had been silent longest", false)
	}
}

// policyChanged asks the run loop to re-evaluate the session against the
// current policy (core.policyChanged). It never blocks.
func (c *conn) policyChanged() {
	select {
	case c.policyCh <- struct{}{}:
		c.signals.Add(1)
	default: // one is pending already
	}
}

// volumeResized records that the volume named name is now size bytes
// and asks the run loop to tell the core (core.volumeResized). It never
// blocks; the channel it returns is closed once the core has the size.
func (c *conn) volumeResized(name string, size int64) <-chan struct{} {
	done := make(chan struct{})
	c.resizeMu.Lock()
	if c.resizes == nil {
		c.resizes = map[string]int64{}
	}
	c.resizes[name] = size
	c.resizeWait = append(c.resizeWait, done)
	c.resizeMu.Unlock()
	c.policyChanged()
	return done
}

// pathChanged records that the volume named name is now in state st
// here and asks the run loop to tell the core (core.pathChanged). It
// never blocks.
func (c *conn) pathChanged(name string, st gwState) {
	c.resizeMu.Lock()
	if c.paths == nil {
		c.paths = map[string]pathChanges{}
	}
	c.paths[name] = c.paths[name].add(st)
	c.resizeMu.Unlock()
	c.policyChanged()
}

// onExternal handles a signal on policyCh: the policy, or the size or
// path state of some volumes, changed.
func (c *conn) onExternal(now int64) {
	c.core.policyChanged(now)
	c.resizeMu.Lock()
	rs, waits, ps := c.resizes, c.resizeWait, c.paths
	c.resizes, c.resizeWait, c.paths = nil, nil, nil
	c.resizeMu.Unlock()
	for name, size := range rs {
		c.core.volumeResized(name, size)
	}
	for name, pc := range ps {
		for _, st := range pc.replay() {
			c.core.pathChanged(name, st)
		}
	}
	c.srpLUNsStep()
	c.nexusTake()
	for _, w := range waits {
		close(w)
	}
}

// isIWARP guesses whether a device is iWARP, whose RDMA READ sinks need
// REMOTE_WRITE (READ responses are tagged writes; docs/verbs.md#access-flags).
func isIWARP(a transport.DeviceAttr) bool {
	s := strings.ToLower(a.Name + " " + a.Vendor)
	for _, w := range []string{"iwarp", "siw", "cxgb", "i40iw"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// setup checks the hello, creates the connection's verbs objects and
// buffers, posts the receives and accepts. It returns false (having
// rejected and cleaned up) on failure.
func (c *conn) setup(ctx context.Context, req transport.ConnRequest) bool {
	t := c.t
	cfg := &t.cfg
	// Counted before the peer can see the reject, so that Stats never
	// lags what a peer has been told (TestHello read 1 of 2).
	reject := func(priv []byte) {
		t.rejected.Add(1)
		req.Reject(priv)
	}
	h, err := wire.DecodeHello(req.PrivateData())
	var srpReq *srp.LoginRequest // an SRP login (conn_srp.go)
	if err != nil {
		var lr srp.LoginRequest
		if lr.DecodeRDMA(req.PrivateData()) != nil {
			c.log.Info("connection rejected: neither a gosrp hello nor an SRP login", "remote", c.remote)
			reject(nil)
			return false
		}
		srpReq = &lr
	} else if h.Version != wire.Version {
		c.log.Info("connection rejected: protocol version", "remote", c.remote, "version", h.Version, "want", wire.Version)
		reject(wire.Hello{Version: wire.Version}.Encode())
		return false
	}
	if req.ReadCredit().Out == 0 {
		// Every write that is not immediate data is fetched with RDMA
		// READ, and a READ without credit waits in the send queue for
		// ever, holding the responses queued behind it
		// (transport.ReadCredit): refuse the connection while nothing
		// is spent on it.
		c.log.Info("connection rejected: the initiator serves no RDMA READs (responder_resources 0), so no write could fetch its data", "remote", c.remote)
		var priv []byte
		if srpReq != nil {
			priv = srpRejectData(srpReq, srp.RejectInsufficientResources)
		}
		reject(priv)
		return false
	}
	fail := func(what string, err error) bool {
		c.log.Warn("connection setup failed", "remote", c.remote, "step", what, "err", err)
		reject(nil)
		c.release()
		return false
	}
	dev := req.Device()
	attr := dev.Attr()
	// The receive queue holds the requests of the credits and the IUs
	// that cost none: a logout, and in an SRP session the SRP_CRED_RSP
	// of the one SRP_CRED_REQ it may have outstanding
	// (core_srp_credit.go). The send queue holds each slot's RDMA
	// operations and response, and two SENDs besides: the login phase's,
	// or an SRP session's SRP_CRED_REQ, and one to spare.
	credits, maxDesc, free := cfg.Credits, cfg.MaxDesc, 1
	if srpReq != nil {
		credits = cfg.SRPCredits // its own default: config.go
		free = 2
	}
	if attr.MaxQPWR > 0 {
		credits = min(credits, attr.MaxQPWR-free, (attr.MaxQPWR-2)/(maxDesc+1))
	}
	if credits < 1 {
		return fail("size queues", fmt.Errorf("device queues of %d WRs are too small", attr.MaxQPWR))
	}
	sqDepth := credits*(maxDesc+1) + 2
	nrecv := credits + free
	iuLen := nrecv*recvSize + (credits+1)*iuSize
	dataLen := credits * cfg.MaxTransfer
	access := transport.AccessLocalWrite
	if isIWARP(attr) {
		access |= transport.AccessRemoteWrite
	}
	if c.bufs = t.spares.take(dev, iuLen, dataLen, access); c.bufs == nil {
		var step string
		if c.bufs, step, err = newConnBufs(dev, iuLen, dataLen, access); err != nil {
			return fail(step, err)
		}
	}
	if c.cq, err = dev.CreateCQ(sqDepth + nrecv + 1); err != nil {
		return fail("create CQ", err)
	}
	c.qp, err = c.bufs.pd.CreateQP(transport.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: sqDepth,
		MaxRecvWR: nrecv, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fail("create QP", err)
	}
	recvLen, b := nrecv*recvSize, c.bufs
	c.core = newCore(coreParams{
		gen: t.gen.Add(1), id: c.id, name: cfg.Name, credits: credits, maxXfer: cfg.MaxTransfer, maxDesc: maxDesc,
		offerInv: !cfg.DisableRemoteInvalidate && attr.Caps.Has(transport.CapSendWithInv),
		replays:  attr.Quirks.ReplayOnErr,
		loginTO:  cfg.LoginTimeout.Nanoseconds(), secrets: cfg.Secrets, acl: t.acl.Load, sqDepth: sqDepth, nrecv: nrecv,
		recv: b.iuArena.Bytes()[:recvLen], recvAddr: b.iuMR.Addr(),
		iu: b.iuArena.Bytes()[recvLen:iuLen], iuAddr: b.iuMR.Addr() + uint64(recvLen), iuLKey: b.iuMR.LKey(),
		data: b.dataArena.Bytes()[:dataLen], dataAddr: b.dataMR.Addr(), dataLKey: b.dataMR.LKey(),
		rand: func(b []byte) { rand.Read(b) }, instance: t.instance, volStats: t.volumeCounters, connStats: &c.stats,
		srpPort: cfg.SRPTargetPortID, portGroup: cfg.SRPPortGroup, pr: t.pr, source: c.src,
	})
	c.creditsGr.Store(int32(credits))
	if err := c.qp.Modify(transport.QPInit); err != nil {
		return fail("QP to INIT", err)
	}
	c.core.start(c.now())
	if n, err := c.qp.PostRecv(c.core.acts.recv); err != nil {
		return fail("post receives", fmt.Errorf("%d of %d posted: %w", n, len(c.core.acts.recv), err))
	}
	c.bufsOK = true
	c.core.acts.reset()
	priv := wire.Hello{Version: wire.Version}.Encode()
	var srpLogin srpLoginResult
	if srpReq != nil {
		if srpLogin = c.srpLogin(srpReq); !srpLogin.ok {
			c.log.Info("SRP login rejected", "remote", c.remote, "initiator", c.core.initiator, "reason", srpLogin.reason)
			reject(srpLogin.priv)
			c.release()
			return false
		}
		priv = srpLogin.priv
	}
	actx, cancel := context.WithTimeout(ctx, cfg.LoginTimeout)
	defer cancel()
	if c.cm, err = req.Accept(actx, c.qp, priv); err != nil {
		c.log.Warn("accept failed", "remote", c.remote, "err", err)
		t.rejected.Add(1)
		c.release()
		return false
	}
	if srpReq != nil {
		c.srpOpen(srpLogin.open)
	}
	return true
}

func (c *conn) now() int64 { return int64(time.Since(c.t.epoch)) }

// release destroys the verbs objects in dependency order: the QP first
// (no more DMA), then the CQ; the PD and its buffers go to the target's
// spares (spareBufs) or are released too.
func (c *conn) release() {
	c.srpLeave()
	var errs []error
	if c.qp != nil {
		errs = append(errs, c.qp.Close())
	}
	if c.cq != nil {
		errs = append(errs, c.cq.Close())
	}
	// Kept only when every verbs call of the setup succeeded with it (a
	// set that failed one may be what failed it) and its QP is surely
	// gone; a login refused is kept too, so that a peer whose logins
	// are refused costs no registration after the first.
	if b := c.bufs; b != nil {
		if !c.bufsOK || errors.Join(errs...) != nil {
			errs = append(errs, b.close())
		} else if drop := c.t.spares.put(b); drop != nil {
			errs = append(errs, drop.close())
		}
	}
	if err := errors.Join(errs...); err != nil {
		c.log.Warn("releasing connection resources", "conn", c.id, "err", err)
	}
}
