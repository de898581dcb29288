package emu

import (
	"container/list"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// Delays between retries of a failing accept: the first retry waits
// acceptDelayMin and each further one twice as long, up to acceptDelayMax,
// as net/http's Server.Serve does. Out of descriptors (EMFILE), the
// connection that failed stays in the kernel's queue and a retry at once
// fails again; a burst of them must not become a spinning loop either.
const (
	acceptDelayMin = 5 * time.Millisecond
	acceptDelayMax = time.Second
)

// shedDelay is the wait before the accept after a shed connection
// (handshakes), for its descriptor to be released.
const shedDelay = time.Millisecond

// acceptLogEvery bounds how often a run of accept errors is logged: the
// first error of a run at once, then one line per interval with the count
// of those in between.
const acceptLogEvery = 10 * time.Second

// errListenerFailed marks the error Accept returns once the listener's
// socket failed for good.
var errListenerFailed = errors.New("emu: listener failed")

// temporaryAccept reports whether an accept(2) error leaves the listening
// socket usable: accept(2) names EMFILE, ENFILE, ENOBUFS and ENOMEM as
// resource limits, and ECONNABORTED, EPROTO and EPERM (a firewall) as the
// fault of the one connection; errors that say so themselves
// (net.Error's Temporary, as net/http tests it) count too.
func temporaryAccept(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EPROTO, syscall.EPERM, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// listenFail records the error that ended a listener's accept loop, so
// that Accept reports it instead of waiting for ever.
type listenFail struct {
	once sync.Once
	ch   chan struct{} // closed on failure
	err  error
}

func newListenFail() *listenFail { return &listenFail{ch: make(chan struct{})} }

func (f *listenFail) set(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.ch)
	})
}

// acceptLoop accepts connections on ln and hands each to handle until done
// is closed. A temporary error is counted (Counters.AcceptErrors), logged
// at a bounded rate and retried after a backoff; any other error ends the
// loop and fails the listener (fail), with a logged reason: a listener
// that silently stopped accepting would leave the daemon looking healthy
// while no initiator could connect.
//
// Out of descriptors (EMFILE, ENFILE), it first sheds the oldest
// connection of hs still waiting for its connect request, so that one
// descriptor comes free for the next connection in the queue.
func (p *Provider) acceptLoop(ln net.Listener, addr string, done <-chan struct{}, fail *listenFail, hs *handshakes, handle func(net.Conn)) {
	var delay time.Duration
	var run, since uint64 // errors in this run, and since the last log line
	var logged time.Time
	var timer *time.Timer
	for {
		nc, err := ln.Accept()
		if err == nil {
			if run > 0 {
				p.log.Info("accepting connections again", "listen", addr, "errors", run)
			}
			delay, run, since = 0, 0, 0
			handle(nc)
			continue
		}
		select {
		case <-done:
			return
		default:
		}
		if errors.Is(err, net.ErrClosed) || !temporaryAccept(err) {
			err = fmt.Errorf("%w: accept on %s: %w", errListenerFailed, addr, err)
			p.log.Error("listener failed: no more connections will be accepted", "listen", addr, "err", err)
			fail.set(err)
			return
		}
		p.counters.acceptErrors.Add(1)
		delay = min(max(2*delay, acceptDelayMin), acceptDelayMax)
		if (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)) && hs.shedOldest() {
			// A descriptor comes free as soon as the shed connection's
			// reader lets go of it: retry soon, without backing off.
			delay = shedDelay
		}
		run++
		since++
		if now := time.Now(); run == 1 || now.Sub(logged) >= acceptLogEvery {
			p.log.Warn("accept failed; retrying", "listen", addr, "err", err, "retry_in", delay, "errors", since)
			logged, since = now, 0
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
		case <-done:
			timer.Stop()
			return
		}
	}
}

// handshakes are a listener's connections still waiting for their
// connect request, oldest first. A peer that connects and sends nothing
// holds a descriptor for cmTimeout; out of descriptors, the accept loop
// closes the oldest such connection to make room, as the kernel's SYN
// queue drops its oldest entries under a flood, so that silent
// connections cannot keep an honest client waiting in the listen queue
// behind them for a timeout per descriptor. A connection that has sent
// its request is no longer here: the target's pre-login caps bound those.
type handshakes struct {
	mu    sync.Mutex
	conns list.List // of net.Conn
}

// add records nc, whose connect request is being read.
func (h *handshakes) add(nc net.Conn) *list.Element {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns.PushBack(nc)
}

// done forgets e: its request has arrived, or its connection ended. It
// reports false if e was shed (its connection is closed) before.
func (h *handshakes) done(e *list.Element) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns.Remove(e) != nil
}

// shedAll closes every connection waiting for its request: their
// listener is closing, and each would otherwise hold its Close for up to
// cmTimeout (a peer that connects and says nothing held srpd's stop for
// 10 s).
func (h *handshakes) shedAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for e := h.conns.Front(); e != nil; e = h.conns.Front() {
		h.conns.Remove(e)
		e.Value.(net.Conn).Close()
		e.Value = nil // done reports it
	}
}

// withRoom runs open, which creates descriptors. Out of descriptors
// (EMFILE, ENFILE), it sheds the oldest silent connection and tries
// again while there is one: a connection that has made its request is
// served before one that has said nothing. Closing a socket in
// non-blocking mode returns once its descriptor is released
// (internal/poll's FD.Close), so the retry finds it free.
func (h *handshakes) withRoom(open func() error) error {
	for {
		err := open()
		if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) || !h.shedOldest() {
			return err
		}
	}
}

// shedOldest closes the oldest connection waiting for its request, if
// any (its handshake then fails), and reports whether there was one.
func (h *handshakes) shedOldest() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.conns.Front()
	if e == nil {
		return false
	}
	h.conns.Remove(e)
	e.Value.(net.Conn).Close()
	e.Value = nil // done reports it
	return true
}
