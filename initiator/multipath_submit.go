package initiator

// Asynchronous requests on a Multipath volume: Submit, and the
// goroutine that re-issues what failed over.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// mpReq is a request of the application travelling through a Multipath
// volume: its own completion is kept aside while the request runs on a
// path, so that a failure of the path sends it back here instead.
type mpReq struct {
	mv     *MultipathVolume
	r      *Request
	done   chan<- *Request
	onDone func(*Request)
	gen    uint64    // the generation of the path it was submitted on
	since  time.Time // when it first failed over; zero until then
	err    error     // why it failed over (worse)
	// takeover is why the last failover tried for it failed, if one
	// did: said in its failure (unserved).
	takeover error
	fn       func(*Request)
}

var mpReqPool sync.Pool

func init() {
	mpReqPool.New = func() any {
		w := &mpReq{}
		w.fn = w.complete // bound once, so that a submit allocates nothing
		return w
	}
}

// mpRetry is the re-issue queue of a volume and its goroutine, started
// by the first Submit; Close stops it.
type mpRetry struct {
	once    sync.Once
	mu      sync.Mutex
	q       []*mpReq
	kick    chan struct{}
	quit    chan struct{}
	stopped chan struct{}
}

// Submit starts an asynchronous request on the active path (see
// Volume.Submit); it comes back on r.Done (or r.OnDone) once it
// completed on some path. A request that fails because its path was
// lost or answered standby is re-issued on the path a failover makes
// active (so is one a gateway left unanswered through five I/O
// timeouts), by a goroutine of the volume, until Config.LossTimeout
// from its first failure; r.Buf stays the request's until it comes back. Requests
// still waiting for a path when the volume closes come back with
// ErrClosed.
func (mv *MultipathVolume) Submit(r *Request) error {
	mv.retry.once.Do(mv.startRetry)
	w := mpReqPool.Get().(*mpReq)
	w.mv, w.r, w.done, w.onDone, w.since = mv, r, r.Done, r.OnDone, time.Time{}
	r.Done, r.OnDone = nil, w.fn
	if err := mv.submitOn(w); err != nil {
		w.restore()
		return err
	}
	return nil
}

// submitOn submits w's request on the active path; a path that fails it
// at once queues it for the retry goroutine.
func (mv *MultipathVolume) submitOn(w *mpReq) error {
	a, err := mv.active()
	if err != nil {
		return err
	}
	w.gen = a.gen
	err = a.v.Submit(w.r)
	if err != nil && mv.retriable(err, a.gen) {
		mv.requeue(w)
		return nil
	}
	return err
}

// retriable reports whether a request that failed on the path of
// generation gen should be re-issued after a failover: the path failed,
// or a failover closed its handle.
func (mv *MultipathVolume) retriable(err error, gen uint64) bool {
	return failsOver(err) || errors.Is(err, ErrClosed) && mv.moved(gen)
}

// complete is the request's OnDone on a path (the poller's goroutine):
// it must not block, so a request to re-issue goes to the queue.
func (w *mpReq) complete(r *Request) {
	if r.Err != nil && w.mv.retriable(r.Err, w.gen) {
		w.err = worse(w.err, r.Err)
		w.mv.requeue(w)
		return
	}
	w.finish(r.Err)
}

// restore gives the request its own completion back and frees w.
func (w *mpReq) restore() *Request {
	r := w.r
	r.Done, r.OnDone = w.done, w.onDone
	*w = mpReq{fn: w.fn}
	mpReqPool.Put(w)
	return r
}

// finish completes the application's request with err.
func (w *mpReq) finish(err error) {
	w.restore().deliver(err)
}

func (mv *MultipathVolume) requeue(w *mpReq) {
	rt := &mv.retry
	rt.mu.Lock()
	rt.q = append(rt.q, w)
	rt.mu.Unlock()
	select {
	case rt.kick <- struct{}{}:
	default:
	}
}

func (mv *MultipathVolume) startRetry() {
	rt := &mv.retry
	rt.kick, rt.quit, rt.stopped = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go mv.retryLoop()
}

// stopRetry ends the retry goroutine (if Submit started one); what it
// still held comes back with ErrClosed.
func (mv *MultipathVolume) stopRetry() {
	rt := &mv.retry
	started := false
	rt.once.Do(func() {}) // no goroutine can start after this
	rt.mu.Lock()
	started = rt.quit != nil
	rt.mu.Unlock()
	if started {
		close(rt.quit)
		<-rt.stopped
	}
}

// retryLoop re-issues failed-over requests: for each, a failover away
// from the path it failed on (one per generation: the first request
// does it, the others find the volume moved), then a submit on the new
// path.
func (mv *MultipathVolume) retryLoop() {
	rt := &mv.retry
	defer close(rt.stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-rt.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	// later: requests no path took yet, tried again when timer fires.
	var later []*mpReq
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	take := func() []*mpReq {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		q := append(later, rt.q...)
		rt.q, later = nil, nil
		return q
	}
	for {
		select {
		case <-rt.kick:
		case <-timer.C:
		case <-rt.quit:
			for _, w := range take() {
				w.finish(fmt.Errorf("initiator: multipath %q: %w", mv.name, ErrClosed))
			}
			return
		}
		for _, w := range take() {
			if !mv.reissue(ctx, w) {
				later = append(later, w)
			}
		}
		if len(later) > 0 {
			timer.Reset(100 * time.Millisecond)
		}
	}
}

// reissue fails the volume over from w's path if nobody has yet and
// submits w on the new one; past LossTimeout from its first failure it
// completes with ErrConnectionLost instead. It returns false when no
// path took the volume over yet: w is to be tried again later.
func (mv *MultipathVolume) reissue(ctx context.Context, w *mpReq) bool {
	if w.since.IsZero() {
		w.since = time.Now()
	}
	deadline := w.since.Add(mv.m.cfg.LossTimeout)
	if time.Now().After(deadline) {
		why := ErrConnectionLost
		if errors.As(w.err, new(*unansweredError)) {
			why = w.err // left unanswered: the deadline, not a lost path
		}
		w.finish(mv.unserved(why, w.takeover))
		return true
	}
	a, err := mv.active()
	if err == nil && a.gen == w.gen {
		// Bounded as do's: a hung takeover holds no request past its
		// deadline.
		fctx, cancel := context.WithDeadline(ctx, deadline)
		err = mv.failover(fctx, a.gen, a.path, -1)
		cancel()
	}
	if errors.Is(err, ErrClosed) || ctx.Err() != nil {
		w.finish(fmt.Errorf("initiator: multipath %q: %w", mv.name, ErrClosed))
		return true
	}
	if err != nil {
		w.takeover = err
		return false
	}
	if err := mv.submitOn(w); err != nil {
		w.finish(err)
	}
	return true
}
