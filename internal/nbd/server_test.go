package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	testSize = 1 << 20
	testBS   = 4096
)

func TestNegotiateGo(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed | clientNoZeroes)
	r := tc.goOpt(OptGo, "vol0", InfoBlockSize, InfoName, InfoDescription, 999)
	if r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO: %#x %q", r.typ, r.data)
	}
	if tc.size != testSize {
		t.Errorf("size %d", tc.size)
	}
	want := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn | FlagSendCache
	if tc.flags != want {
		t.Errorf("transmission flags %#x, want %#x", tc.flags, want)
	}
	bs := tc.infos[InfoBlockSize]
	if len(bs) != 12 || be.Uint32(bs) != testBS || be.Uint32(bs[4:]) != 4096 || be.Uint32(bs[8:]) != DefaultMaxPayload {
		t.Errorf("NBD_INFO_BLOCK_SIZE %x", bs)
	}
	if string(tc.infos[InfoName]) != "vol0" || string(tc.infos[InfoDescription]) != "test volume" {
		t.Errorf("name %q description %q", tc.infos[InfoName], tc.infos[InfoDescription])
	}
	// Transmission works.
	if errno, _ := tc.do(CmdFlush, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("flush: errno %d", errno)
	}
	tc.send(CmdDisc, 0, 1, 0, 0, nil)
	tc.expectClosed()
}

func TestNegotiateInfoThenDefaultExport(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, true))
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed)
	if r := tc.goOpt(OptInfo, "vol0"); r.typ != RepAck {
		t.Fatalf("NBD_OPT_INFO: %#x", r.typ)
	}
	if tc.flags&FlagReadOnly == 0 {
		t.Errorf("read-only export without NBD_FLAG_READ_ONLY: %#x", tc.flags)
	}
	if _, ok := tc.infos[InfoBlockSize]; !ok {
		t.Error("no NBD_INFO_BLOCK_SIZE (sent even when not asked)")
	}
	// The empty name is the default export.
	if r := tc.goOpt(OptGo, ""); r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO with the default name: %#x", r.typ)
	}
	if errno, _ := tc.do(CmdWrite, 0, 0, 4096, make([]byte, 4096)); errno != EPERM {
		t.Errorf("write to a read-only export: errno %d, want EPERM", errno)
	}
	if errno, _ := tc.do(CmdTrim, 0, 0, 4096, nil); errno != EPERM {
		t.Errorf("trim on a read-only export: errno %d, want EPERM", errno)
	}
	if errno, _ := tc.do(CmdRead, 0, 0, 4096, nil); errno != 0 {
		t.Errorf("read: errno %d", errno)
	}
}

func TestNegotiateRefusals(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed)
	for _, opt := range []uint32{OptStartTLS, OptExtendedHeaders, 4242} {
		tc.option(opt, nil)
		r := tc.optReply()
		if r.opt != opt || r.typ != RepErrUnsup {
			t.Errorf("%s: reply %#x, want NBD_REP_ERR_UNSUP", optName(opt), r.typ)
		}
	}
	// Unknown export: a clear error, and the client may try again.
	r := tc.goOpt(OptGo, "nope")
	if r.typ != RepErrUnknown || !strings.Contains(string(r.data), `"vol0"`) {
		t.Errorf("unknown export: %#x %q", r.typ, r.data)
	}
	// Malformed NBD_OPT_GO data.
	tc.option(OptGo, []byte{0, 0, 0, 9, 'x'})
	if r := tc.optReply(); r.typ != RepErrInvalid {
		t.Errorf("truncated NBD_OPT_GO: %#x", r.typ)
	}
	tc.option(OptList, []byte{1})
	if r := tc.optReply(); r.typ != RepErrInvalid {
		t.Errorf("NBD_OPT_LIST with data: %#x", r.typ)
	}
	// LIST names the export.
	tc.option(OptList, nil)
	r = tc.optReply()
	if r.typ != RepServer || be.Uint32(r.data) != 4 || string(r.data[4:8]) != "vol0" || string(r.data[8:]) != "test volume" {
		t.Errorf("NBD_OPT_LIST: %#x %q", r.typ, r.data)
	}
	if r := tc.optReply(); r.typ != RepAck {
		t.Errorf("NBD_OPT_LIST end: %#x", r.typ)
	}
	if r := tc.goOpt(OptGo, "vol0"); r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO after refusals: %#x", r.typ)
	}
}

func TestNegotiateAbort(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed)
	tc.option(OptAbort, nil)
	if r := tc.optReply(); r.typ != RepAck {
		t.Errorf("NBD_OPT_ABORT: %#x", r.typ)
	}
	tc.expectClosed()
}

func TestExportName(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	for _, noZeroes := range []bool{false, true} {
		tc := dialRaw(t, ts.addr)
		cf := uint32(clientFixed)
		if noZeroes {
			cf |= clientNoZeroes
		}
		tc.hello(cf)
		tc.option(OptExportName, []byte("vol0"))
		b := tc.read(10)
		if be.Uint64(b) != testSize || be.Uint16(b[8:])&FlagSendWriteZeroes == 0 {
			t.Fatalf("export name reply %x", b)
		}
		if !noZeroes && !bytes.Equal(tc.read(124), make([]byte, 124)) {
			t.Fatal("padding is not 124 zeros")
		}
		if errno, _ := tc.do(CmdRead, 0, 0, 512, nil); errno != 0 {
			t.Fatalf("read after NBD_OPT_EXPORT_NAME: errno %d", errno)
		}
	}
	// An unknown name cannot be refused politely: the connection closes.
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed)
	tc.option(OptExportName, []byte("nope"))
	tc.expectClosed()
	waitLog(t, ts, "unknown export")
}

func waitLog(t *testing.T, ts *testServer, s string) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if strings.Contains(ts.log.String(), s) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("server log lacks %q:\n%s", s, ts.log.String())
}

func TestReadWrite(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	tc := connect(t, ts.addr, "vol0")
	data := make([]byte, 3*testBS)
	rand.Read(data)
	if errno, _ := tc.do(CmdWrite, CmdFlagFUA, testBS, uint32(len(data)), data); errno != 0 {
		t.Fatalf("write: errno %d", errno)
	}
	_, got := tc.do(CmdRead, 0, testBS, uint32(len(data)), nil)
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	// Unaligned I/O reaches the backend as is.
	if errno, _ := tc.do(CmdWrite, 0, 7, 5, []byte("hello")); errno != 0 {
		t.Fatalf("unaligned write: errno %d", errno)
	}
	if _, got := tc.do(CmdRead, 0, 5, 9, nil); string(got) != "\x00\x00hello\x00\x00" {
		t.Fatalf("unaligned read %q", got)
	}
	// Zero-length requests succeed and carry no data.
	if errno, _ := tc.do(CmdRead, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("empty read: errno %d", errno)
	}
	var fuaWrites int
	for _, c := range ts.mem.Calls() {
		if c.Op == "write" && c.FUA {
			fuaWrites++
		}
	}
	if fuaWrites != 1 {
		t.Errorf("%d FUA writes reached the backend, want 1: %v", fuaWrites, ts.mem.Calls())
	}
}

func TestErrors(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem, func(s *Server) { s.MaxPayload = 1 << 16 })
	tc := connect(t, ts.addr, "vol0")
	cases := []struct {
		name       string
		typ, flags uint16
		off        uint64
		length     uint32
		payload    []byte
		want       uint32
	}{
		{"read past the end", CmdRead, 0, testSize - 512, 1024, nil, EINVAL},
		{"read at a huge offset", CmdRead, 0, 1 << 63, 512, nil, EINVAL},
		{"read above the maximum", CmdRead, 0, 0, 1 << 17, nil, EINVAL},
		{"write past the end", CmdWrite, 0, testSize, 512, make([]byte, 512), ENOSPC},
		{"write zeroes past the end", CmdWriteZeroes, 0, testSize - 4096, 8192, nil, ENOSPC},
		{"trim past the end", CmdTrim, 0, testSize, 4096, nil, EINVAL},
		{"unknown command", 99, 0, 0, 0, nil, EINVAL},
		{"CACHE with a flag", CmdCache, CmdFlagFUA, 0, 4096, nil, EINVAL},
		{"CACHE past the end", CmdCache, 0, testSize - 512, 1024, nil, EINVAL},
		{"BLOCK_STATUS without a metadata context", CmdBlockStatus, 0, 0, 4096, nil, EINVAL},
		{"unknown flag", CmdRead, 1 << 9, 0, 512, nil, EINVAL},
		{"DF without structured replies", CmdRead, CmdFlagDF, 0, 512, nil, EINVAL},
		{"NO_HOLE on a write", CmdWrite, CmdFlagNoHole, 0, 512, make([]byte, 512), EINVAL},
		{"FAST_ZERO not offered", CmdWriteZeroes, CmdFlagFastZero, 0, 4096, nil, EINVAL},
	}
	for _, c := range cases {
		if errno, _ := tc.do(c.typ, c.flags, c.off, c.length, c.payload); errno != c.want {
			t.Errorf("%s: errno %d, want %d", c.name, errno, c.want)
		}
	}
	// Backend errors: EIO by default, or the errno attached.
	var mode atomic.Int32
	mem.Fail = func(op string, off, n int64) error {
		switch mode.Load() {
		case 1:
			return errors.New("disk on fire")
		case 2:
			return WithErrno(errors.New("full"), ENOSPC)
		}
		return nil
	}
	mode.Store(1)
	if errno, _ := tc.do(CmdRead, 0, 0, 512, nil); errno != EIO {
		t.Errorf("failing read: errno %d, want EIO", errno)
	}
	mode.Store(2)
	if errno, _ := tc.do(CmdWrite, 0, 0, 512, make([]byte, 512)); errno != ENOSPC {
		t.Errorf("failing write: errno %d, want ENOSPC", errno)
	}
	mode.Store(0)
	// The connection is still in step after all that.
	if errno, _ := tc.do(CmdRead, 0, 0, 512, nil); errno != 0 {
		t.Errorf("read after errors: errno %d", errno)
	}
	waitLog(t, ts, "disk on fire")
}

func TestTrimAndZeroes(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem)
	tc := connect(t, ts.addr, "vol0")
	fill := func() {
		for i := range mem.Bytes()[:8*testBS] {
			mem.Bytes()[i] = 0xff
		}
	}
	zeroed := func(from, to int) bool {
		for i, b := range mem.Bytes()[:8*testBS] {
			if (i >= from && i < to) != (b == 0) {
				t.Logf("byte %d is %#x", i, b)
				return false
			}
		}
		return true
	}
	lastCalls := func(n int) []Call {
		c := mem.Calls()
		return c[len(c)-n:]
	}

	// Unaligned TRIM: only the whole blocks inside are trimmed.
	fill()
	if errno, _ := tc.do(CmdTrim, 0, 100, 3*testBS, nil); errno != 0 {
		t.Fatalf("trim: errno %d", errno)
	}
	if !zeroed(testBS, 3*testBS) {
		t.Error("unaligned trim touched the edges or missed the middle")
	}
	if c := lastCalls(1)[0]; c.Op != "trim" || c.Off != testBS || c.N != 2*testBS {
		t.Errorf("trim reached the backend as %+v", c)
	}
	// A trim inside one block does nothing (and succeeds).
	n := len(mem.Calls())
	if errno, _ := tc.do(CmdTrim, 0, 10, 100, nil); errno != 0 || len(mem.Calls()) != n {
		t.Errorf("sub-block trim: errno %d, calls %v", errno, mem.Calls()[n:])
	}
	// TRIM with FUA flushes.
	if errno, _ := tc.do(CmdTrim, CmdFlagFUA, 0, testBS, nil); errno != 0 {
		t.Fatalf("trim FUA: errno %d", errno)
	}
	if c := lastCalls(2); c[0].Op != "trim" || c[1].Op != "flush" {
		t.Errorf("trim with FUA: %v", c)
	}

	// Unaligned WRITE_ZEROES: zeros written at the edges, the middle zeroed.
	fill()
	if errno, _ := tc.do(CmdWriteZeroes, 0, 100, 3*testBS, nil); errno != 0 {
		t.Fatalf("write zeroes: errno %d", errno)
	}
	if !zeroed(100, 100+3*testBS) {
		t.Error("unaligned write zeroes")
	}
	c := lastCalls(3)
	if c[0] != (Call{"write", 100, testBS - 100, false}) || c[1] != (Call{"zero", testBS, 2 * testBS, false}) || c[2] != (Call{"write", 3 * testBS, 100, false}) {
		t.Errorf("unaligned write zeroes reached the backend as %v", c)
	}
	// NO_HOLE: zeros are written, nothing is deallocated.
	fill()
	if errno, _ := tc.do(CmdWriteZeroes, CmdFlagNoHole|CmdFlagFUA, 0, 2*testBS, nil); errno != 0 {
		t.Fatalf("write zeroes NO_HOLE: errno %d", errno)
	}
	if !zeroed(0, 2*testBS) {
		t.Error("NO_HOLE write zeroes")
	}
	if c := lastCalls(2); c[0] != (Call{"write", 0, 2 * testBS, false}) || c[1].Op != "flush" {
		t.Errorf("NO_HOLE|FUA write zeroes reached the backend as %v", c)
	}
}

// gate is a backend hook that holds chosen operations until released.
type gate struct {
	mu      sync.Mutex
	hold    map[int64]chan struct{}
	arrived chan int64
}

func newGate() *gate { return &gate{hold: map[int64]chan struct{}{}, arrived: make(chan int64, 100)} }

func (g *gate) block(off int64) {
	g.mu.Lock()
	g.hold[off] = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) release(off int64) {
	g.mu.Lock()
	close(g.hold[off])
	g.mu.Unlock()
}

func (g *gate) fail(op string, off, n int64) error {
	g.mu.Lock()
	ch := g.hold[off]
	g.mu.Unlock()
	if ch != nil && op == "read" {
		g.arrived <- off
		<-ch
	}
	return nil
}

// Memory serializes operations under one lock; for the concurrency tests
// the hook must run outside it.
type gatedMemory struct {
	*Memory
	g *gate
}

func (m gatedMemory) ReadAt(ctx context.Context, p []byte, off int64) error {
	m.g.fail("read", off, int64(len(p)))
	return m.Memory.ReadAt(ctx, p, off)
}

func TestConcurrentOutOfOrder(t *testing.T) {
	g := newGate()
	mem := NewMemory(testSize, testBS, false)
	for i := range mem.Bytes() {
		mem.Bytes()[i] = byte(i / testBS)
	}
	ts := startServer(t, mem, func(s *Server) { s.Export.Backend = gatedMemory{mem, g} })
	tc := connect(t, ts.addr, "vol0")
	g.block(0)
	// Request 0 is held; 1..63 must be answered while it waits.
	for i := range 64 {
		tc.send(CmdRead, 0, uint64(i), uint64(i*testBS), testBS, nil)
	}
	<-g.arrived
	seen := map[uint64]bool{}
	for range 63 {
		r := tc.reply()
		if r.errno != 0 || r.cookie == 0 || seen[r.cookie] {
			t.Fatalf("reply %+v (seen %v)", r, seen)
		}
		seen[r.cookie] = true
		if d := tc.read(testBS); d[0] != byte(r.cookie) || d[testBS-1] != byte(r.cookie) {
			t.Fatalf("reply %d carries block %d", r.cookie, d[0])
		}
	}
	g.release(0)
	if r := tc.reply(); r.cookie != 0 || r.errno != 0 {
		t.Fatalf("held reply %+v", r)
	}
	tc.read(testBS)
}

func TestDiscWaitsForInFlight(t *testing.T) {
	g := newGate()
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem, func(s *Server) { s.Export.Backend = gatedMemory{mem, g} })
	tc := connect(t, ts.addr, "vol0")
	g.block(testBS)
	tc.send(CmdRead, 0, 7, testBS, testBS, nil)
	<-g.arrived
	tc.send(CmdDisc, 0, 8, 0, 0, nil)
	// The server has read the DISC (the read and it: two requests)
	// before the read it holds is let go.
	for end := time.Now().Add(10 * time.Second); ts.Stats().Requests.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the server never read the DISC")
		}
	}
	g.release(testBS)
	if r := tc.reply(); r.cookie != 7 || r.errno != 0 {
		t.Fatalf("reply %+v", r)
	}
	tc.read(testBS)
	tc.expectClosed()
}

func TestShutdownAnswersInFlight(t *testing.T) {
	g := newGate()
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem, func(s *Server) { s.Export.Backend = gatedMemory{mem, g} })
	tc := connect(t, ts.addr, "vol0")
	idle := connect(t, ts.addr, "vol0")
	negotiating := dialRaw(t, ts.addr)
	negotiating.hello(clientFixed)
	g.block(0)
	tc.send(CmdRead, 0, 1, 0, testBS, nil)
	<-g.arrived
	done := make(chan error)
	go func() { done <- ts.Shutdown(context.Background()) }()
	// Serve returns once Shutdown has closed the listener; Shutdown
	// itself must still wait for the read it holds.
	if err := <-ts.serve; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	default:
	}
	g.release(0)
	if r := tc.reply(); r.cookie != 1 || r.errno != 0 {
		t.Fatalf("reply %+v", r)
	}
	tc.read(testBS)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tc.expectClosed()
	idle.expectClosed()
	negotiating.expectClosed()
	ts.serve <- ErrServerClosed // for the cleanup
}

func TestMultiConn(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	a, b := connect(t, ts.addr, "vol0"), connect(t, ts.addr, "vol0")
	if a.flags&FlagCanMultiConn == 0 {
		t.Fatal("no NBD_FLAG_CAN_MULTI_CONN")
	}
	data := bytes.Repeat([]byte("multi"), 1000)
	if errno, _ := a.do(CmdWrite, 0, 8192, uint32(len(data)), data); errno != 0 {
		t.Fatal(errno)
	}
	if errno, _ := a.do(CmdFlush, 0, 0, 0, nil); errno != 0 {
		t.Fatal(errno)
	}
	if _, got := b.do(CmdRead, 0, 8192, uint32(len(data)), nil); !bytes.Equal(got, data) {
		t.Fatal("second connection does not see the first one's flushed write")
	}
}

// Many clients pipelining mixed I/O through small limits: every request
// is answered once, and budgets and slots never wedge (run it with -race).
func TestStress(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem, func(s *Server) { s.MaxInFlight = 8; s.MaxBuffered = 1 << 16; s.MaxPayload = 1 << 15 })
	var wg sync.WaitGroup
	for cl := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc := connect(t, ts.addr, "vol0")
			region := uint64(cl) * (testSize / 4)
			const n = 300
			var rwg sync.WaitGroup
			rwg.Add(1)
			errs := make(chan string, n)
			go func() { // reply reader
				defer rwg.Done()
				for range n {
					r := tc.reply()
					if r.errno != 0 {
						errs <- "errno"
					}
					if r.cookie&1 == 1 { // reads carry data
						tc.read(int(r.cookie >> 32))
					}
				}
			}()
			for i := range n {
				off := uint64(i*977) % (testSize/4 - 1<<15)
				l := uint32(1 + i*131%(1<<15))
				if i%3 == 0 {
					tc.send(CmdRead, 0, uint64(l)<<32|1, region+off, l, nil)
				} else {
					p := make([]byte, l)
					rand.Read(p)
					tc.send(CmdWrite, 0, uint64(i)<<1, region+off, l, p)
				}
			}
			rwg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
				return
			}
		}()
	}
	wg.Wait()
}

// asyncMemory is a Memory that starts aligned I/O of at most one block
// asynchronously, completing it from its own goroutine in reverse order of
// arrival once `batch` have started, and declines everything else (the
// server must then take the blocking path).
type asyncMemory struct {
	*Memory
	mu      sync.Mutex
	batch   int
	pending []func()
	started atomic.Int64
	failAt  int64
}

func (m *asyncMemory) StartIO(p []byte, off int64, write, fua bool, done Completion) bool {
	if len(p) > testBS || off%testBS != 0 {
		return false
	}
	m.started.Add(1)
	m.mu.Lock()
	fail := off == m.failAt
	m.mu.Unlock()
	io := func() {
		var err error
		switch {
		case fail:
			err = WithErrno(errors.New("injected"), EIO)
		case write:
			err = m.Memory.WriteAt(context.Background(), p, off, fua)
		default:
			err = m.Memory.ReadAt(context.Background(), p, off)
		}
		done.Complete(err)
	}
	m.mu.Lock()
	m.pending = append(m.pending, io)
	var run []func()
	if len(m.pending) == m.batch {
		run, m.pending = m.pending, nil
	}
	m.mu.Unlock()
	if run != nil {
		go func() {
			for i := len(run) - 1; i >= 0; i-- {
				run[i]()
			}
		}()
	}
	return true
}

// TestAsyncBackend checks the AsyncBackend path: completions from another
// goroutine in any order reach the right replies with the right data, an
// error completion becomes its errno, and I/O the backend declines is
// served by the blocking path.
func TestAsyncBackend(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	am := &asyncMemory{Memory: mem, batch: 8, failAt: -1}
	ts := startServer(t, mem, func(s *Server) { s.Export.Backend = am })
	tc := connect(t, ts.addr, "vol0")
	want := map[uint64][]byte{}
	for i := range 8 {
		b := bytes.Repeat([]byte{byte(i + 1)}, testBS)
		want[uint64(i)] = b
		tc.send(CmdWrite, 0, uint64(100+i), uint64(i*testBS), testBS, b)
	}
	for range 8 {
		if r := tc.reply(); r.errno != 0 {
			t.Fatalf("write reply %+v", r)
		}
	}
	for i := range 8 {
		tc.send(CmdRead, 0, uint64(i), uint64(i*testBS), testBS, nil)
	}
	for range 8 {
		r := tc.reply()
		if r.errno != 0 {
			t.Fatalf("read reply %+v", r)
		}
		if d := tc.read(testBS); !bytes.Equal(d, want[r.cookie]) {
			t.Fatalf("reply %d carries block %d", r.cookie, d[0])
		}
	}
	if n := am.started.Load(); n != 16 {
		t.Fatalf("%d I/Os went the asynchronous way, want 16", n)
	}
	// Two blocks at once: declined, served by ReadAt.
	_, got := tc.do(CmdRead, 0, 0, 2*testBS, nil)
	if !bytes.Equal(got, append(append([]byte{}, want[0]...), want[1]...)) {
		t.Fatal("declined read returned the wrong data")
	}
	am.mu.Lock()
	am.batch, am.failAt = 1, 3*testBS
	am.mu.Unlock()
	if errno, _ := tc.do(CmdRead, 0, 3*testBS, testBS, nil); errno != EIO {
		t.Fatalf("failed read: errno %d, want EIO", errno)
	}
}
