package emu

import (
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
func (p *Provider) acceptLoop(ln net.Listener, addr string, done <-chan struct{}, fail *listenFail, handle func(net.Conn)) {
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
