package main

import (
	"bytes"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
)

// adminTap sits between the admin commands and srpd's admin socket: the
// commands are given its socket (--socket), it passes their requests to
// srpd and srpd's answers back, and it shows each DELETE request and its
// answer to a hook, before and after they pass, so that a test can kill
// srpd at a chosen point of a delete. The hook runs on the connection's
// goroutine: while it runs, the bytes wait; if it returns true at
// tapRequest or tapAnswer, they never pass: the connection is cut
// there, as srpd's death would cut it.
type adminTap struct {
	path, upstream string

	mu   sync.Mutex
	hook func(tapEvent) (cut bool)
	seq  int // DELETE requests since the hook was set
}

// tapPoint is a point of a DELETE's passage through the tap.
type tapPoint int

const (
	tapRequest   tapPoint = iota // the request has come; srpd has not seen it
	tapServing                   // srpd has been handed the request
	tapAnswer                    // srpd's answer has come; the command has not seen it
	tapDelivered                 // the command has been handed the answer
)

func (p tapPoint) String() string {
	return [...]string{"at the request", "while srpd serves it", "at the answer", "after the answer"}[p]
}

// tapEvent is a DELETE at a point of its passage.
type tapEvent struct {
	point  tapPoint
	seq    int    // 1 for the first DELETE since the hook was set, ...
	volume string // the volume it deletes
	status int    // the answer's HTTP status (tapAnswer, tapDelivered)
}

// newAdminTap listens on path and passes what comes to upstream (srpd's
// admin socket) until the test ends.
func newAdminTap(t *testing.T, path, upstream string) *adminTap {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("admin tap: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	a := &adminTap{path: path, upstream: upstream}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go a.pass(c)
		}
	}()
	return a
}

// setHook replaces the hook (nil: none) and numbers DELETEs from 1 again.
func (a *adminTap) setHook(h func(tapEvent) (cut bool)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook, a.seq = h, 0
}

func (a *adminTap) fire(ev tapEvent) (cut bool) {
	a.mu.Lock()
	h := a.hook
	a.mu.Unlock()
	return h != nil && h(ev)
}

// pass carries one command's connection. The admin client sends a
// request only once it has the whole answer to the one before (HTTP/1.1
// without pipelining), so the first bytes srpd sends after a DELETE are
// its answer.
func (a *adminTap) pass(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("unix", a.upstream)
	if err != nil {
		return // srpd is gone: the command sees its connection close
	}
	defer u.Close()
	pending := make(chan tapEvent, 1) // the DELETE waiting for its answer
	go func() {
		defer c.Close() // ends the request side's Read too
		buf := make([]byte, 64<<10)
		for {
			n, err := u.Read(buf)
			if n > 0 {
				var ev tapEvent
				var del bool
				select {
				case ev = <-pending:
					del = true
					ev.point, ev.status = tapAnswer, httpStatus(buf[:n])
					if a.fire(ev) {
						return
					}
				default:
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
				if del {
					ev.point = tapDelivered
					a.fire(ev)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			ev, del := a.deleteRequest(buf[:n])
			if del {
				if a.fire(ev) {
					return
				}
				pending <- ev
			}
			if _, err := u.Write(buf[:n]); err != nil {
				return
			}
			if del {
				ev.point = tapServing
				a.fire(ev)
			}
		}
		if err != nil {
			return
		}
	}
}

// deleteRequest reports whether b starts a DELETE of a volume, and
// numbers it.
func (a *adminTap) deleteRequest(b []byte) (tapEvent, bool) {
	const prefix = "DELETE /v1/volumes/"
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return tapEvent{}, false
	}
	path := b[len(prefix):]
	if i := bytes.IndexAny(path, " ?"); i >= 0 {
		path = path[:i]
	}
	name, err := url.PathUnescape(string(path))
	if err != nil {
		name = string(path)
	}
	a.mu.Lock()
	a.seq++
	ev := tapEvent{point: tapRequest, seq: a.seq, volume: name}
	a.mu.Unlock()
	return ev, true
}

// httpStatus is the status code of an HTTP/1.1 answer starting in b (0
// if b starts no answer).
func httpStatus(b []byte) int {
	const prefix = "HTTP/1.1 "
	if !bytes.HasPrefix(b, []byte(prefix)) || len(b) < len(prefix)+3 {
		return 0
	}
	n, _ := strconv.Atoi(string(b[len(prefix) : len(prefix)+3]))
	return n
}
