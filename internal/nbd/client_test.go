package nbd

import (
	"bufio"
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

	"github.com/gosrp/gosrp/internal/logsink"
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

type testServer struct {
	*Server
	addr  string
	mem   *Memory
	log   *logsink.Buffer
	serve chan error
}

func startServer(t testing.TB, mem *Memory, tweak ...func(*Server)) *testServer {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "nbd.sock")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	lb := &logsink.Buffer{}
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

// chunk is one structured reply chunk.
type chunk struct {
	flags, typ uint16
	cookie     uint64
	payload    []byte
}

// message reads one reply message: a simple reply, or a structured reply
// chunk.
func (tc *testClient) message() (*simpleReply, *chunk) {
	tc.t.Helper()
	h := tc.read(4)
	switch m := be.Uint32(h); m {
	case 0x67446698:
		rest := tc.read(12)
		return &simpleReply{errno: be.Uint32(rest), cookie: be.Uint64(rest[4:])}, nil
	case 0x668e33ef:
		rest := tc.read(16)
		c := &chunk{flags: be.Uint16(rest), typ: be.Uint16(rest[2:]), cookie: be.Uint64(rest[4:])}
		c.payload = tc.read(int(be.Uint32(rest[12:])))
		return nil, c
	default:
		tc.t.Fatalf("reply magic %#x", m)
		return nil, nil
	}
}

// result is the whole reply to one request, simple or structured.
type result struct {
	errno   uint32
	msg     string      // an error chunk's message
	data    []byte      // READ: the OFFSET_DATA chunks, placed by offset
	ctx     uint32      // BLOCK_STATUS: the context id
	extents [][2]uint32 // BLOCK_STATUS: length and flags of each descriptor
	types   []uint16    // the chunk types in order; nil for a simple reply
}

// doS runs one request and reads its reply to the end, checking every
// chunk against the protocol's rules for its type.
func (tc *testClient) doS(typ, flags uint16, off uint64, length uint32, payload []byte) result {
	tc.t.Helper()
	tc.send(typ, flags, 42, off, length, payload)
	var res result
	for {
		sr, c := tc.message()
		if sr != nil {
			if sr.cookie != 42 || len(res.types) > 0 {
				tc.t.Fatalf("simple reply %+v after chunks %v", sr, res.types)
			}
			if typ == CmdRead || typ == CmdBlockStatus {
				tc.t.Fatalf("simple reply (errno %d) to %s with structured replies", sr.errno, cmdName(typ))
			}
			res.errno = sr.errno
			return res
		}
		if c.cookie != 42 {
			tc.t.Fatalf("chunk for cookie %d, want 42", c.cookie)
		}
		res.types = append(res.types, c.typ)
		p := c.payload
		switch c.typ {
		case ReplyTypeNone:
			if len(p) != 0 || c.flags&ReplyFlagDone == 0 {
				tc.t.Fatalf("NONE chunk with %d bytes, flags %#x", len(p), c.flags)
			}
		case ReplyTypeOffsetData:
			if len(p) < 9 {
				tc.t.Fatalf("OFFSET_DATA chunk of %d bytes", len(p))
			}
			o, d := be.Uint64(p), p[8:]
			if o < off || o+uint64(len(d)) > off+uint64(length) {
				tc.t.Fatalf("OFFSET_DATA of %d bytes at %d outside the request (%d at %d)", len(d), o, length, off)
			}
			if res.data == nil {
				res.data = make([]byte, length)
			}
			copy(res.data[o-off:], d)
		case ReplyTypeBlockStatus:
			if len(p) < 12 || (len(p)-4)%8 != 0 {
				tc.t.Fatalf("BLOCK_STATUS chunk of %d bytes", len(p))
			}
			res.ctx = be.Uint32(p)
			for i := 4; i < len(p); i += 8 {
				if be.Uint32(p[i:]) == 0 {
					tc.t.Fatal("BLOCK_STATUS descriptor of length 0")
				}
				res.extents = append(res.extents, [2]uint32{be.Uint32(p[i:]), be.Uint32(p[i+4:])})
			}
		case ReplyTypeError:
			if len(p) < 6 {
				tc.t.Fatalf("ERROR chunk of %d bytes", len(p))
			}
			ml := int(be.Uint16(p[4:]))
			if ml > len(p)-6 {
				tc.t.Fatalf("ERROR chunk message of %d bytes in %d", ml, len(p))
			}
			res.errno, res.msg = be.Uint32(p), string(p[6:6+ml])
			if res.errno == 0 {
				tc.t.Fatal("ERROR chunk with errno 0")
			}
		default:
			tc.t.Fatalf("chunk type %d", c.typ)
		}
		if c.flags&ReplyFlagDone != 0 {
			return res
		}
	}
}

// metaOpt sends a metadata context option and returns the contexts
// (name → id) and the final reply.
func (tc *testClient) metaOpt(opt uint32, name string, queries ...string) (map[string]uint32, optReply) {
	tc.t.Helper()
	tc.option(opt, appendMetaContextRequest(nil, name, queries...))
	ctxs := map[string]uint32{}
	for {
		r := tc.optReply()
		if r.opt != opt {
			tc.t.Fatalf("reply for option %d, sent %d", r.opt, opt)
		}
		if r.typ != RepMetaContext {
			return ctxs, r
		}
		if len(r.data) < 5 {
			tc.t.Fatalf("NBD_REP_META_CONTEXT of %d bytes", len(r.data))
		}
		ctxs[string(r.data[4:])] = be.Uint32(r.data)
	}
}

// connectStructured negotiates structured replies, selects the metadata
// contexts queries name (if any), and enters the transmission phase.
func connectStructured(t testing.TB, addr string, queries ...string) (*testClient, map[string]uint32) {
	t.Helper()
	tc := dialRaw(t, addr)
	tc.hello(clientFixed | clientNoZeroes)
	tc.option(OptStructuredReply, nil)
	if r := tc.optReply(); r.typ != RepAck {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %#x %q", r.typ, r.data)
	}
	var ctxs map[string]uint32
	if len(queries) > 0 {
		var r optReply
		if ctxs, r = tc.metaOpt(OptSetMetaContext, "vol0", queries...); r.typ != RepAck {
			t.Fatalf("NBD_OPT_SET_META_CONTEXT: %#x %q", r.typ, r.data)
		}
	}
	if r := tc.goOpt(OptGo, "vol0", InfoBlockSize); r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO: reply %#x %q", r.typ, r.data)
	}
	return tc, ctxs
}
