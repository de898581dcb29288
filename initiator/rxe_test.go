//go:build ibverbs

package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/faults"
	_ "github.com/gosrp/gosrp/transport/ibverbs"
)

// TestRXEEndToEnd runs initiator and target in one process over the
// ibverbs provider, connected through the device's own address (rxe0 in
// the test VM): every operation, sizes from 512 B (on a volume of
// 512-byte blocks) to 1 MiB, QD1 and QD32, immediate data on and off,
// then a connection the target cuts (through target/targettest, which
// works on any provider) and the reconnect after it; then the same with
// the target polling adaptively, as srpd does; then a volume whose store
// hangs in its re-open across a cut (rxeLate), and one whose re-OPEN
// the target answers NOT READY and cuts, again and again
// (rxeReopenNotReady); then 50 idle sessions, which must not tick
// (rxeIdle); then the session behind made faults. A clean run loses no
// connection but those it forces.
// test/rxe/run.sh runs it in the VM with GOSRP_RXE_E2E=1, and so does CI.
func TestRXEEndToEnd(t *testing.T) {
	p := rxeDevice(t)
	for _, imm := range []int{0, -1} {
		t.Run(fmt.Sprintf("immediate=%v", imm == 0), func(t *testing.T) {
			before := rxeCounters()
			defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
			rxeRun(t, p, p, imm)
		})
	}
	// srpd's way of waiting (cmd/srpd polls adaptively over real verbs):
	// the target's CQ waiters on a provider of busy_poll=adaptive, the
	// initiator on the default, the forced teardown and reconnect
	// included, so a peer's QP going down while the target polls is met.
	t.Run("target-busy-poll=adaptive", func(t *testing.T) {
		ap, err := transport.Open("ibverbs", transport.Options{"busy_poll": "adaptive"})
		if err != nil {
			t.Fatal(err)
		}
		defer ap.Close()
		before := rxeCounters()
		defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
		rxeRun(t, ap, p, 0)
	})
	// A volume whose store hangs when the connection comes back
	// (initiator/late_open.go), on the device.
	t.Run("late-volume", func(t *testing.T) {
		before := rxeCounters()
		defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
		rxeLate(t, p)
	})
	// A target that answers every re-OPEN NOT READY and cuts: real QPs
	// torn down, paced, with a late volume's write parked.
	t.Run("late-not-ready", func(t *testing.T) {
		before := rxeCounters()
		defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
		rxeReopenNotReady(t, p)
	})
	// Idle sessions sleep on the device too (tickTimer).
	t.Run("idle-sessions", func(t *testing.T) {
		ap, err := transport.Open("ibverbs", transport.Options{"busy_poll": "adaptive"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ap.Close() }) // after the target's, which rxeIdle registers
		rxeIdle(t, ap, p)
	})
	// The same run with faults made in front of the initiator on the real
	// device (transport/faults): refused posts, QP errors, lost
	// completions, completions that report an error for WRs rxe did
	// carry out, and connections cut (rdma_disconnect) under I/O. The
	// session must ride them out with every byte intact.
	t.Run("faults", func(t *testing.T) {
		fp := faults.Wrap(p, faults.Config{Seed: 1, PostFail: 0.002, QPError: 0.001, DropCQE: 0.002, CorruptCQE: 0.002, LinkCut: 0.001})
		before := rxeCounters()
		defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
		rxeRun(t, p, fp, 0)
		c := fp.Counters()
		t.Logf("faults made: %+v", c)
		if c.PostFails+c.QPErrors+c.Drops+c.Corrupts+c.LinkCuts == 0 {
			t.Errorf("no fault was made: the run tested nothing")
		}
	})
}

// TestRXEOrdered runs 32 writers and readers over two channels while
// QPs go to ERR and connections are cut, in both protocols; every block
// must read back its last write (rxeOrdered). On a device that replays
// a receive at ERR (rxe on 6.12.95, transport.Quirks.ReplayOnErr) this
// is TestReplayedCommandsLandInOrder on real verbs, and in SRP each
// channel's loss goes through the nexus's SINGLE login (srpFence). CI
// runs it on that kernel (.ci/run); test/rxe/run.sh runs it anywhere
// with GOSRP_RXE_E2E=1.
func TestRXEOrdered(t *testing.T) {
	p := rxeDevice(t)
	for _, proto := range protocols {
		t.Run(proto.name, func(t *testing.T) {
			before := rxeCounters()
			defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
			rxeOrdered(t, p, proto)
		})
	}
}

// rxeOrdered runs workload over two channels of an initiator on the
// device behind faults (QP errors and cuts) against a target on the
// device, then reads every block back.
func rxeOrdered(t *testing.T, p transport.Provider, proto protocol) {
	const seed, ops = 1, 1500
	st := block.NewMemStore()
	if _, err := st.Create("vol0", 4<<20, 4096); err != nil {
		t.Fatal(err)
	}
	tcfg := proto.tcfg
	tcfg.Name, tcfg.Catalog, tcfg.Logger = "rxe-ordered", storecatalog.Catalog{Store: st}, rxeLog
	tgt, err := target.New(tcfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tgt, p.Listen, st.Close)
	fp := faults.Wrap(p, faults.Config{Seed: seed, QPError: 0.003, LinkCut: 0.001})
	cfg := proto.cfg
	cfg.Provider, cfg.Addr, cfg.Logger, cfg.Channels, cfg.Credits = fp, addr, rxeLog, 2, 16
	if cfg.Name == "" {
		cfg.Name = "rxe-ordered"
	}
	s := dial(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := openNamed(t, ctx, s, proto.vol)
	gens := workload(t, v, seed, 32, ops)
	verifyAll(t, v, gens, seed)
	c, ss := fp.Counters(), s.Stats()
	t.Logf("%d ops: faults made %+v; %d connections lost", ops, c, ss.ConnectionsLost)
	if c.QPErrors+c.LinkCuts == 0 {
		t.Errorf("no QP error or cut was made: the run tested nothing")
	}
}

// TestRXEHostileSRP runs the hostile ALUA gateway's lies
// (TestHostileSRPDataIn, TestHostileSRPTakeover) with target and
// initiator on the device: the lengths the open's parsers are handed
// come out of a real RDMA WRITE, and the answers never sent end real
// connections at each I/O timeout (ten teardowns of a QP with a command
// outstanding). test/rxe/run.sh runs it in the VM with GOSRP_RXE_E2E=1,
// and so does CI.
func TestRXEHostileSRP(t *testing.T) {
	p := rxeDevice(t)
	device := func(*testing.T) (tp, ip transport.Provider) { return p, p }
	before := rxeCounters()
	defer func() { t.Logf("device counters: %s", rxeCounterDelta(before, rxeCounters())) }()
	for _, tc := range dataInLies {
		t.Run("datain/"+tc.name, func(t *testing.T) { testHostileSRPDataIn(t, tc, device) })
	}
	for _, tc := range takeoverLies {
		t.Run("takeover/"+tc.name, func(t *testing.T) { testHostileSRPTakeover(t, tc, device) })
	}
}

// rxeDevice is the ibverbs provider on the VM's device, closed when the
// test ends; it skips the test unless GOSRP_RXE_E2E is set. rxeLog
// keeps warnings: the logs are the point of a failing run in the VM.
func rxeDevice(t *testing.T) transport.Provider {
	if os.Getenv("GOSRP_RXE_E2E") == "" {
		t.Skip("needs an RDMA device: GOSRP_RXE_E2E=1 (test/rxe/run.sh ./initiator sets it)")
	}
	rxeLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: rxeLevel()}))
	p, err := transport.Open("ibverbs", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// rxeCounters reads the device's hardware counters (rxe's retries,
// sequence errors, RNR NAKs, ...) so that a run can say what the device
// saw while it ran.
func rxeCounters() map[string]int64 {
	out := map[string]int64{}
	files, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/hw_counters/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			out[filepath.Base(f)] = v
		}
	}
	return out
}

// rxeCounterDelta names the counters that moved between two reads.
func rxeCounterDelta(a, b map[string]int64) string {
	var parts []string
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, d))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none moved"
	}
	return strings.Join(parts, " ")
}

var rxeLog *slog.Logger

// rxeRun serves two volumes from a target on tp and checks an initiator on
// ip against them: every transfer size at QD1, 512-byte blocks, QD32 of
// mixed sizes with FUA, and a disconnect in the middle.
func rxeRun(t *testing.T, tp, ip transport.Provider, imm int) {
	const volSize = 64 << 20
	st := block.NewMemStore()
	defer st.Close()
	if _, err := st.Create("vol0", volSize, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create("vol512", 1<<20, 512); err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{}, 1)
	h := targettest.Wrap(tp, targettest.Script{Respond: func(r *targettest.Response) targettest.Action {
		select {
		case <-cut:
			return targettest.Disconnect
		default:
			return targettest.Pass
		}
	}})
	tgt, err := target.New(target.Config{Name: "rxe", Catalog: storecatalog.Catalog{Store: st}, Logger: rxeLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := h.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() { served <- tgt.Serve(ctx, l) }()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		tgt.Shutdown(sctx)
		cancel()
		<-served
	}()
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	s, err := initiator.Dial(dctx, initiator.Config{Provider: ip, Addr: l.Addr(), Name: "rxe-e2e", Credits: 32,
		ImmediateData: imm, Mechanism: frmr.Auto, Logger: rxeLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Open(dctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, volSize)
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(what string, off, n int64) {
		t.Helper()
		got := make([]byte, n)
		if _, err := v.ReadAt(got, off); err != nil {
			t.Fatalf("%s: read %d at %d: %v", what, n, off, err)
		}
		if !bytes.Equal(got, model[off:off+n]) {
			t.Fatalf("%s: %d bytes at %d differ from what was written", what, n, off)
		}
	}
	// Every size at QD1.
	for _, n := range []int64{4096, 8192, 12288, 65536, 256 << 10, 1 << 20} {
		off := rng.Int64N((volSize-n)/4096) * 4096
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if _, err := v.WriteAt(buf, off); err != nil {
			t.Fatalf("write %d at %d: %v", n, off, err)
		}
		copy(model[off:], buf)
		check(fmt.Sprintf("QD1 %d", n), off, n)
	}
	// Sub-4 KiB transfers, on a volume of 512-byte blocks.
	v512, err := s.Open(dctx, "vol512", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{512, 1024, 1536, 2048, 3584} {
		off := int64(i) * 8192
		buf := make([]byte, n)
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		if _, err := v512.WriteAt(buf, off); err != nil {
			t.Fatalf("write %d at %d on 512-byte blocks: %v", n, off, err)
		}
		got := make([]byte, n)
		if _, err := v512.ReadAt(got, off); err != nil {
			t.Fatalf("read %d at %d on 512-byte blocks: %v", n, off, err)
		}
		if !bytes.Equal(got, buf) {
			t.Fatalf("%d bytes at %d on 512-byte blocks differ from what was written", n, off)
		}
	}
	// QD32 of mixed sizes, FUA among them.
	done := make(chan *initiator.Request, 32)
	for round := 0; round < 20; round++ {
		var reqs []*initiator.Request
		for k := 0; k < 32; k++ {
			n := int64(4096 << rng.IntN(5))
			off := int64(k)*(1<<20) + int64(round%4)*65536
			r := &initiator.Request{Op: initiator.OpWrite, Buf: make([]byte, n), Offset: off, FUA: k%7 == 0, Done: done}
			for i := range r.Buf {
				r.Buf[i] = byte(round + k + i)
			}
			if err := v.Submit(r); err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, r)
		}
		for range reqs {
			r := <-done
			if r.Err != nil {
				t.Fatalf("QD32 write of %d at %d: %v", len(r.Buf), r.Offset, r.Err)
			}
			copy(model[r.Offset:], r.Buf)
		}
		for k := 0; k < 32; k++ {
			off := int64(k)*(1<<20) + int64(round%4)*65536
			r := &initiator.Request{Op: initiator.OpRead, Buf: make([]byte, 65536), Offset: off, Done: done}
			if err := v.Submit(r); err != nil {
				t.Fatal(err)
			}
		}
		for k := 0; k < 32; k++ {
			r := <-done
			if r.Err != nil {
				t.Fatalf("QD32 read at %d: %v", r.Offset, r.Err)
			}
			if !bytes.Equal(r.Buf, model[r.Offset:r.Offset+65536]) {
				t.Fatalf("QD32 read at %d differs", r.Offset)
			}
		}
	}
	// Flush, discard, write-zeroes.
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(ctx, 1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	clear(model[1<<20 : 2<<20])
	check("write-zeroes", 1<<20, 1<<20)
	if err := v.Discard(ctx, 4<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	clear(model[4<<20 : 5<<20]) // the memory store reads discarded blocks as zeros
	check("discard", 4<<20, 1<<20)
	// With faults in front of the initiator (ip wraps tp) connections are
	// lost on purpose; otherwise none may be.
	faulty := ip != tp
	lostBefore := s.Stats().ConnectionsLost
	if !faulty && lostBefore != 0 {
		t.Fatalf("%d connections lost in a clean run", lostBefore)
	}
	// The target cuts the connection; the I/O in flight is re-issued.
	cut <- struct{}{}
	buf := make([]byte, 65536)
	for i := range buf {
		buf[i] = 0x77
	}
	if _, err := v.WriteAt(buf, 8<<20); err != nil {
		t.Fatalf("write across the cut: %v", err)
	}
	copy(model[8<<20:], buf)
	check("after the reconnect", 8<<20, 65536)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	ss := s.Stats()
	var remote, local uint64
	for _, p := range ss.FRMR {
		remote, local = remote+p.RemoteInvalidations, local+p.LocalInvalidationsOK
	}
	// Remote unless the device replays at ERR (transport.Quirks.ReplayOnErr:
	// rxe on 6.12 before 6.12.111) or repeats registrations on a retry
	// (RetryRepeatsLocalOps: every rxe); counted up to the last tick.
	t.Logf("connections lost %d, reconnects %d; keys invalidated by the target %d, by LOCAL_INV %d", ss.ConnectionsLost, ss.Reconnects, remote, local)
	if !faulty {
		// A clean run's keys all die one way: the device's (the provider
		// owns the device; it is not closed here).
		d, err := ip.OpenDevice("")
		if err != nil {
			t.Fatal(err)
		}
		q := d.Attr().Quirks
		if own := q.ReplayOnErr || q.RetryRepeatsLocalOps; own && remote != 0 || !own && local != 0 || remote+local == 0 {
			t.Errorf("ReplayOnErr %v, RetryRepeatsLocalOps %v, yet the target invalidated %d keys and LOCAL_INV %d", q.ReplayOnErr, q.RetryRepeatsLocalOps, remote, local)
		}
	}
	if !faulty && (ss.ConnectionsLost != 1 || ss.Reconnects != 1) {
		t.Fatalf("%d connections lost and %d reconnects for one cut", ss.ConnectionsLost, ss.Reconnects)
	}
	if faulty && ss.ConnectionsLost <= lostBefore {
		t.Fatalf("the cut lost no connection (%d lost before it, %d after)", lostBefore, ss.ConnectionsLost)
	}
}

// rxeIdle opens 50 sessions from ip to a target on tp (srpd's adaptive
// polling), each writes once and is then left idle: in 2 s of idleness
// the sessions tick at most once each (the tick after their last I/O),
// where a ticker per channel took 20 each. The process's CPU time over
// those 2 s is logged: it is the figure docs/performance.md gives.
func rxeIdle(t *testing.T, tp, ip transport.Provider) {
	const sessions = 50
	st := block.NewMemStore()
	if _, err := st.Create("vol0", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	// Small connections: each registers Credits × MaxTransfer of data
	// buffers, and 50 of srpd's default 32 MiB do not fit the guest.
	tgt, err := target.New(target.Config{Name: "rxe-idle", Catalog: storecatalog.Catalog{Store: st}, Logger: rxeLog,
		Credits: 4, MaxTransfer: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tgt, tp.Listen, st.Close)
	var all []*initiator.Session
	buf := make([]byte, 4096)
	for i := range sessions {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := initiator.Dial(dctx, initiator.Config{Provider: ip, Addr: addr, Name: fmt.Sprintf("rxe-idle-%d", i),
			Credits: 4, MaxTransfer: 64 << 10, Logger: rxeLog})
		if err != nil {
			dcancel()
			t.Fatal(err)
		}
		defer s.Close()
		v, err := s.Open(dctx, "vol0", initiator.OpenOptions{})
		dcancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	ticks := func() (n uint64) {
		for _, s := range all {
			n += initiator.Ticks(s)
		}
		return n
	}
	t0, c0 := ticks(), rxeCPU()
	time.Sleep(2 * time.Second)
	idle, cpu := ticks()-t0, rxeCPU()-c0
	t.Logf("%d idle sessions: %d ticks and %v of CPU in 2 s", sessions, idle, cpu.Round(time.Millisecond))
	if idle > sessions {
		t.Errorf("%d idle sessions took %d ticks in 2 s: at most one each", sessions, idle)
	}
}

// rxeCPU is the CPU time the process has used.
func rxeCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rxeLevel is the log level of the run: warnings, or GOSRP_RXE_LOG=debug.
func rxeLevel() slog.Level {
	if os.Getenv("GOSRP_RXE_LOG") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
