package nbd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A hand-written NBD client for the tests: it speaks the protocol byte by
// byte, so it checks the server's encoding rather than sharing it.

type testClient struct {
	t     testing.TB
	c     net.Conn
	br    *bufio.Reader
	mu    sync.Mutex // serializes writes of requests
	size  uint64
	flags uint16
	infos map[uint16][]byte
}

type optReply struct {
	opt, typ uint32
	data     []byte
}

func dialRaw(t testing.TB, addr string) *testClient {
	t.Helper()
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &testClient{t: t, c: c, br: bufio.NewReader(c), infos: map[uint16][]byte{}}
}

func (tc *testClient) read(n int) []byte {
	tc.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(tc.br, b); err != nil {
		tc.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (tc *testClient) write(b []byte) {
	tc.t.Helper()
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if _, err := tc.c.Write(b); err != nil {
		tc.t.Fatalf("write: %v", err)
	}
}

// hello reads the server greeting and sends the client flags.
func (tc *testClient) hello(cflags uint32) {
	tc.t.Helper()
	g := tc.read(18)
	if string(g[:8]) != "NBDMAGIC" || string(g[8:16]) != "IHAVEOPT" {
		tc.t.Fatalf("greeting %q", g)
	}
	if f := be.Uint16(g[16:]); f != flagFixedNewstyle|flagNoZeroes {
		tc.t.Fatalf("handshake flags %#x", f)
	}
	tc.write(be.AppendUint32(nil, cflags))
}

func (tc *testClient) option(opt uint32, data []byte) {
	tc.t.Helper()
	b := be.AppendUint64(nil, 0x49484156454f5054)
	b = be.AppendUint32(b, opt)
	b = be.AppendUint32(b, uint32(len(data)))
	tc.write(append(b, data...))
}

func (tc *testClient) optReply() optReply {
	tc.t.Helper()
	h := tc.read(20)
	if m := be.Uint64(h); m != 0x3e889045565a9 {
		tc.t.Fatalf("option reply magic %#x", m)
	}
	r := optReply{opt: be.Uint32(h[8:]), typ: be.Uint32(h[12:])}
	r.data = tc.read(int(be.Uint32(h[16:])))
	return r
}

func infoData(name string, infos ...uint16) []byte {
	b := be.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = be.AppendUint16(b, i)
	}
	return b
}

// goReplies sends NBD_OPT_GO (or INFO) and collects replies up to the
// final one, which it returns.
func (tc *testClient) goOpt(opt uint32, name string, infos ...uint16) optReply {
	tc.t.Helper()
	tc.option(opt, infoData(name, infos...))
	for {
		r := tc.optReply()
		if r.opt != opt {
			tc.t.Fatalf("reply for option %d, sent %d", r.opt, opt)
		}
		if r.typ != RepInfo {
			return r
		}
		if len(r.data) < 2 {
			tc.t.Fatalf("short NBD_REP_INFO")
		}
		typ := be.Uint16(r.data)
		tc.infos[typ] = r.data[2:]
		if typ == InfoExport {
			tc.size, tc.flags = be.Uint64(r.data[2:]), be.Uint16(r.data[10:])
		}
	}
}

// connect does the usual client handshake: fixed newstyle, NO_ZEROES,
// NBD_OPT_GO with block sizes.
func connect(t testing.TB, addr, name string) *testClient {
	t.Helper()
	tc := dialRaw(t, addr)
	tc.hello(clientFixed | clientNoZeroes)
	if r := tc.goOpt(OptGo, name, InfoBlockSize); r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO: reply %#x %q", r.typ, r.data)
	}
	return tc
}

type simpleReply struct {
	errno  uint32
	cookie uint64
}

func (tc *testClient) send(typ, flags uint16, cookie, off uint64, length uint32, payload []byte) {
	tc.t.Helper()
	b := be.AppendUint32(nil, 0x25609513)
	b = be.AppendUint16(b, flags)
	b = be.AppendUint16(b, typ)
	b = be.AppendUint64(b, cookie)
	b = be.AppendUint64(b, off)
	b = be.AppendUint32(b, length)
	tc.write(append(b, payload...))
}

func (tc *testClient) reply() simpleReply {
	tc.t.Helper()
	h := tc.read(16)
	if m := be.Uint32(h); m != 0x67446698 {
		tc.t.Fatalf("reply magic %#x", m)
	}
	return simpleReply{errno: be.Uint32(h[4:]), cookie: be.Uint64(h[8:])}
}

// do runs one request and waits for its reply (and read data).
func (tc *testClient) do(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
	tc.t.Helper()
	tc.send(typ, flags, 42, off, length, payload)
	r := tc.reply()
	if r.cookie != 42 {
		tc.t.Fatalf("cookie %d, want 42", r.cookie)
	}
	if typ == CmdRead && r.errno == 0 {
		return 0, tc.read(int(length))
	}
	return r.errno, nil
}

// expectClosed checks that the server closes the connection.
func (tc *testClient) expectClosed() {
	tc.t.Helper()
	tc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, tc.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tc.t.Fatal("server did not close the connection")
	}
}

// logBuffer collects the server log for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type testServer struct {
	*Server
	addr  string
	mem   *Memory
	log   *logBuffer
	serve chan error
}

func startServer(t testing.TB, mem *Memory, tweak ...func(*Server)) *testServer {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "nbd.sock")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuffer{}
	s := &Server{
		Export: Export{Name: "vol0", Description: "test volume", Backend: mem},
		Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range tweak {
		f(s)
	}
	ts := &testServer{Server: s, addr: addr, mem: mem, log: lb, serve: make(chan error, 1)}
	go func() { ts.serve <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-ts.serve; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
		if t.Failed() {
			fmt.Println("server log:\n" + lb.String())
		}
	})
	return ts
}
