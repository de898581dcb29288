package emu

import (
	"container/list"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// flakyListener fails its first fails accepts with err, as accept(2) does
// when the process is out of descriptors, and then accepts normally.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
	calls atomic.Int32
}

func (f *flakyListener) Accept() (net.Conn, error) {
	f.calls.Add(1)
	if f.fails.Add(-1) >= 0 {
		return nil, f.err
	}
	return f.Listener.Accept()
}

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// listenFlaky starts a listener of p's wire whose accepts fail as f says.
func listenFlaky(t *testing.T, p *Provider, f *flakyListener) transport.Listener {
	t.Helper()
	switch p.cfg.Wire {
	case WireTCP:
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f.Listener = ln
		l, err := p.serveTCP(f)
		if err != nil {
			t.Fatal(err)
		}
		return l
	case WireShm:
		path := filepath.Join(t.TempDir(), "s.sock")
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		f.Listener = ln
		l, err := p.serveShm(ln, f, path)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	t.Fatalf("wire %s has no socket", p.cfg.Wire)
	return nil
}

// connectVia makes one connection to l from p (both on p's device) and
// returns both ends; the QPs are closed at the end of the test.
func connectVia(tb testing.TB, ctx context.Context, p *Provider, l transport.Listener) (client, server transport.Conn, err error) {
	dev, _ := p.OpenDevice("")
	pd, _ := dev.AllocPD()
	mk := func() transport.QP {
		cq, err := dev.CreateCQ(64)
		if err != nil {
			tb.Fatal(err)
		}
		q, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			tb.Fatal(err)
		}
		return q
	}
	qc, qs := mk(), mk()
	errc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			server, err = r.Accept(ctx, qs, nil)
		}
		errc <- err
	}()
	ep, err := p.Resolve(ctx, l.Addr())
	if err == nil {
		client, err = ep.Connect(ctx, qc, []byte("hello"))
	}
	if serr := <-errc; err == nil {
		err = serr
	}
	return client, server, err
}

// TestAcceptSurvivesTemporaryErrors: a listener whose accept fails with
// EMFILE (out of descriptors) backs off and retries, counts each failure,
// and the next client still connects. An accept loop that returns on the
// first error leaves the client waiting for an answer that never comes.
func TestAcceptSurvivesTemporaryErrors(t *testing.T) {
	for _, wire := range []string{WireTCP, WireShm} {
		t.Run(wire, func(t *testing.T) {
			p := newNIC(t, Config{Wire: wire})
			defer p.Close()
			const fails = 5
			f := &flakyListener{err: emfile()}
			f.fails.Store(fails)
			l := listenFlaky(t, p, f)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, s, err := connectVia(t, ctx, p, l)
			if err != nil {
				t.Fatalf("connect after %d accept errors: %v (accept called %d times)", fails, err, f.calls.Load())
			}
			c.Disconnect()
			s.Disconnect()
			if got := p.Counters().AcceptErrors; got != fails {
				t.Errorf("AcceptErrors = %d, want %d", got, fails)
			}
		})
	}
}

// TestAcceptReportsPermanentError: when the listening socket fails for
// good, Accept says so instead of waiting for ever (the daemon's Serve
// returns and it can exit with the reason).
func TestAcceptReportsPermanentError(t *testing.T) {
	for _, wire := range []string{WireTCP, WireShm} {
		t.Run(wire, func(t *testing.T) {
			p := newNIC(t, Config{Wire: wire})
			defer p.Close()
			f := &flakyListener{err: os.NewSyscallError("accept4", syscall.EBADF)}
			f.fails.Store(1)
			l := listenFlaky(t, p, f)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := l.Accept(ctx)
			if !errors.Is(err, errListenerFailed) || !errors.Is(err, syscall.EBADF) {
				t.Fatalf("Accept on a failed listener: %v, want the listener's failure", err)
			}
		})
	}
}

// TestLinksReleased: the NIC forgets a connection once it has ended, so
// that a long-lived provider (a daemon's) does not keep every link it
// ever had, with its buffers and QP, until Provider.Close.
func TestLinksReleased(t *testing.T) {
	for _, wire := range Wires() {
		t.Run(wire, func(t *testing.T) {
			p := newNIC(t, Config{Wire: wire})
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l, err := p.Listen(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			const cycles = 50
			for i := range cycles {
				c, s, err := connectVia(t, ctx, p, l)
				if err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
				if i%2 == 0 {
					c.Disconnect()
				} else {
					s.Disconnect()
				}
				// Destroying a QP waits for its link's disconnect to end.
				c.QP().Close()
				s.QP().Close()
			}
			if n := p.ownedCount(); n != 1 {
				t.Errorf("after %d connections ended, the NIC holds %d objects, want 1 (the listener)", cycles, n)
			}
			l.Close()
			if n := p.ownedCount(); n != 0 {
				t.Errorf("after the listener closed, the NIC holds %d objects, want 0", n)
			}
		})
	}
}

// TestHandshakesShedOldest: out of descriptors, the accept loop closes
// the oldest connection still waiting for its connect request, and only
// such a one; a handshake whose connection was shed learns so.
func TestHandshakesShedOldest(t *testing.T) {
	var h handshakes
	var ends [3]net.Conn
	var elems [3]*list.Element
	for i := range ends {
		a, b := net.Pipe()
		defer b.Close()
		ends[i] = b
		elems[i] = h.add(a)
	}
	closed := func(i int) bool {
		ends[i].SetReadDeadline(time.Now().Add(time.Second))
		_, err := ends[i].Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	if !h.done(elems[1]) {
		t.Fatal("done on a connection nobody shed: false")
	}
	if !h.shedOldest() || !closed(0) {
		t.Fatal("the oldest connection was not shed")
	}
	if h.done(elems[0]) {
		t.Fatal("done on a shed connection: true")
	}
	if !h.shedOldest() || !closed(2) {
		t.Fatal("the next oldest waiting connection was not shed")
	}
	if h.shedOldest() {
		t.Fatal("shed with nothing waiting")
	}
	var none *handshakes
	if none.shedOldest() {
		t.Fatal("a listener without handshakes shed something")
	}
}

// TestHandshakesWithRoom: a descriptor that cannot be created for want of
// descriptors is retried after each shed silent connection, oldest
// first, until it is created or none is left to shed; other errors are
// not retried.
func TestHandshakesWithRoom(t *testing.T) {
	tests := []struct {
		name    string
		fails   []error // what open returns, call by call, then nil
		waiting int
		wantErr error
		shed    int
	}{
		{name: "room at once", waiting: 2},
		{name: "EMFILE twice", fails: []error{syscall.EMFILE, syscall.EMFILE}, waiting: 3, shed: 2},
		{name: "ENFILE", fails: []error{syscall.ENFILE}, waiting: 1, shed: 1},
		{name: "nothing left to shed", fails: []error{syscall.EMFILE, syscall.EMFILE, syscall.EMFILE}, waiting: 2, wantErr: syscall.EMFILE, shed: 2},
		{name: "not a descriptor limit", fails: []error{syscall.EINVAL}, waiting: 2, wantErr: syscall.EINVAL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h handshakes
			for range tc.waiting {
				a, b := net.Pipe()
				defer b.Close()
				h.add(a)
			}
			calls := 0
			err := h.withRoom(func() error {
				calls++
				if calls <= len(tc.fails) {
					return tc.fails[calls-1]
				}
				return nil
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("withRoom: %v, want %v", err, tc.wantErr)
			}
			if shed := tc.waiting - h.conns.Len(); shed != tc.shed {
				t.Errorf("%d silent connections shed, want %d", shed, tc.shed)
			}
		})
	}
}

// TestCloseShedsSilentConnections: peers that connect and never send a
// connect request (idle sockets, a port scanner) do not hold a closing
// listener: Close ends their handshakes at once, on both stream wires,
// where each held it for its read deadline (cmTimeout, 10 s), and srpd's
// graceful stop with it.
func TestCloseShedsSilentConnections(t *testing.T) {
	for _, wire := range []string{WireTCP, WireShm} {
		t.Run(wire, func(t *testing.T) {
			p := newNIC(t, Config{Wire: wire})
			defer p.Close()
			addr := ""
			if wire == WireTCP {
				addr = "127.0.0.1:0"
			}
			l, err := p.Listen(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			network := "tcp"
			if wire == WireShm {
				network = "unixpacket"
			}
			for range 3 {
				c, err := net.Dial(network, l.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
			time.Sleep(50 * time.Millisecond) // let the accept loop take them
			closed := make(chan struct{})
			go func() {
				l.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(cmTimeout / 2):
				t.Fatalf("Close still waiting for silent connections after %s", cmTimeout/2)
			}
		})
	}
}

// TestConnectForeignListener: Connect to a TCP port where another
// service listens ends at once with ErrForeignPeer when it answers
// something that is not emu's (a whole line, or a few bytes before it
// hangs up, as a server does with a greeting it was not sent), and with
// ErrDisconnected alone when it hangs up saying nothing. Each once came
// back as a "bad answer" or "no answer" a caller could not tell from a
// target that failed mid-handshake.
func TestConnectForeignListener(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  string
		foreign bool
	}{
		{"http", "HTTP/1.0 400 Bad Request\r\nContent-Type: text/html\r\n\r\n", true},
		{"ssh banner", "SSH-2.0-x\r\n", true},
		{"two bytes", "\x15\x03", true},
		{"silent", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newNIC(t, Config{Wire: WireTCP})
			defer p.Close()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Read(make([]byte, 64))
				c.Write([]byte(tc.answer))
				c.Close()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dev, _ := p.OpenDevice("")
			pd, _ := dev.AllocPD()
			cq, err := dev.CreateCQ(8)
			if err != nil {
				t.Fatal(err)
			}
			q, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			ep, err := p.Resolve(ctx, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			_, err = ep.Connect(ctx, q, []byte("hello"))
			if ctx.Err() != nil {
				t.Fatalf("connect waited for the deadline: %v", err)
			}
			if got := errors.Is(err, transport.ErrForeignPeer); got != tc.foreign {
				t.Fatalf("connect: %v; ErrForeignPeer %t, want %t", err, got, tc.foreign)
			}
			if fe, ok := errors.AsType[*transport.ForeignPeerError](err); tc.foreign && (!ok || string(fe.Answer) != tc.answer[:min(len(tc.answer), 16)]) {
				t.Fatalf("connect: %v; want the answer's first bytes %q quoted", err, tc.answer[:min(len(tc.answer), 16)])
			}
			if !tc.foreign && !errors.Is(err, transport.ErrDisconnected) {
				t.Fatalf("connect: %v, want ErrDisconnected", err)
			}
		})
	}
}
