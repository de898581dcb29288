//go:build ceph && pacific

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDFailover: two srpd gateways over one RBD image, a multipath
// initiator writing at QD16, blocks stamped with their LBA and a
// generation. The active gateway is SIGKILLed mid-write
// (GOSRP_RBD_KILLS times, 5 by default) and restarted; each time the
// initiator fails over to the other (a takeover: the dead one's lock
// broken, its client blocklisted) and the writes go on. The time from
// the kill to the first write completed after it, on the new path, is
// logged (median, max); at the end every acknowledged write reads back.
// GOSRP_RBD_FASTFAIL sets the initiator's FastFail in milliseconds (default: the
// package's, 1 s), which most of the failover time is.
func TestRBDFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fastFail := time.Duration(testenv.Int(t, "GOSRP_RBD_FASTFAIL", 0, 0)) * time.Millisecond
	p := gatewayPair(t, ctx, initiator.MultipathConfig{FastFail: fastFail})
	addrs, gws, start, mv := p.addrs, p.gws, p.start, p.mv

	// killAt: when the last kill was sent (unix nanos; 0: none);
	// firstAfter: when the first write after it completed on the new
	// path, which a failover count above failoversAt tells (a write the
	// dying gateway answered in its last microseconds does not count).
	var killAt, firstAfter atomic.Int64
	var failoversAt atomic.Int64
	w := startStampWriters(ctx, mv, 16, 64, 32, func() {
		now := time.Now().UnixNano()
		if k := killAt.Load(); k != 0 && now > k && int64(mv.Failovers()) > failoversAt.Load() {
			firstAfter.CompareAndSwap(0, now)
		}
	})
	defer w.halt()
	acks := &w.acks

	var times []time.Duration
	kills := int(testenv.Int(t, "GOSRP_RBD_KILLS", 5, 1))
	for k := range kills {
		n := acks.Load()
		w.waitFor(t, "writes before the kill", func() bool { return acks.Load() >= n+200 })
		active := slices.Index(addrs, mv.Path())
		firstAfter.Store(0)
		failoversAt.Store(int64(mv.Failovers()))
		killAt.Store(time.Now().UnixNano())
		gws[active].Kill(t)
		w.waitFor(t, "a write after the kill", func() bool { return firstAfter.Load() != 0 })
		d := time.Duration(firstAfter.Load() - killAt.Load())
		killAt.Store(0)
		times = append(times, d)
		if p := slices.Index(addrs, mv.Path()); p == active {
			t.Fatalf("kill %d: still on the killed gateway %s", k, mv.Path())
		}
		t.Logf("kill %d of gateway %d: first write completed on the other %v later", k, active, d.Round(time.Millisecond))
		gws[active] = start(active)
	}
	n := acks.Load()
	w.waitFor(t, "writes after the last kill", func() bool { return acks.Load() >= n+200 })
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	if mv.Failovers() != kills {
		t.Errorf("%d failovers for %d kills", mv.Failovers(), kills)
	}
	verifyStamps(t, ctx, mv, w.gens)
	slices.Sort(times)
	t.Logf("failover over %d kills (%d writes acknowledged): median %v, max %v", len(times), acks.Load(),
		times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
}

// pair is two srpd gateways over one RBD image (vol0) and a Multipath
// volume through both.
type pair struct {
	conf, srpd, image string // ceph.conf, the srpd binary, "rbd/NS/vol0"
	addrs             []string
	gws               []*e2etest.Daemon
	mv                *initiator.MultipathVolume // nil from startGateways
	// start(i) starts gateway i again after it was killed.
	start func(i int) *e2etest.Daemon
}

// gatewayPair starts two srpd gateways over one RBD image (vol0) and
// opens it through a Multipath of both (cfg with Provider, Name, Addrs
// and, unless set, LossTimeout filled in).
func gatewayPair(t *testing.T, ctx context.Context, cfg initiator.MultipathConfig) *pair {
	t.Helper()
	p := startGateways(t)
	p.mv = openMultipath(t, ctx, cfg, p.addrs)
	return p
}

// startGateways starts two srpd gateways over one RBD image (vol0),
// which no host has opened yet (mv is nil).
func startGateways(t *testing.T) *pair {
	t.Helper()
	conf, srpd, args := rbdGatewaySetup(t)
	dir := t.TempDir()
	p := &pair{conf: conf, srpd: srpd, image: "rbd/" + args[5] + "/vol0", addrs: []string{e2etest.FreeAddr(t), e2etest.FreeAddr(t)}}
	p.start = func(i int) *e2etest.Daemon {
		return e2etest.StartDaemon(t, srpd, filepath.Join(dir, fmt.Sprint("gw", i)), p.addrs[i], "", args...)
	}
	p.gws = []*e2etest.Daemon{p.start(0), p.start(1)}
	return p
}

// openMultipath opens vol0 through a Multipath of addrs over an emu NIC
// (cfg with Provider, Name, Addrs and, unless set, LossTimeout filled
// in), all closed when the test ends.
func openMultipath(t *testing.T, ctx context.Context, cfg initiator.MultipathConfig, addrs []string) *initiator.MultipathVolume {
	t.Helper()
	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	cfg.Provider, cfg.Name, cfg.Addrs = nic, "host", addrs
	if cfg.LossTimeout == 0 {
		cfg.LossTimeout = 30 * time.Second
	}
	m, err := initiator.DialMultipath(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	mv, err := m.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mv.Close() })
	return mv
}

// eachWriter runs f(0) ... f(qd-1) on goroutines of their own and
// returns the first error once all have returned.
func eachWriter(qd int, f func(w int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, qd)
	for w := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = f(w)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stampWriters are qd goroutines writing stamped blocks through a
// Multipath volume, each its own perWriter blocks in turn, with a flush
// every flushEvery writes, until halted; gens holds each block's last
// acknowledged generation (read it once halt returned).
type stampWriters struct {
	gens []uint32
	acks atomic.Int64
	stop chan struct{}
	done chan error
	once sync.Once
	err  error
}

// startStampWriters starts the writers; each (if set) runs after every
// acknowledged write.
func startStampWriters(ctx context.Context, mv *initiator.MultipathVolume, qd, perWriter, flushEvery int, each func()) *stampWriters {
	w := &stampWriters{gens: make([]uint32, qd*perWriter), stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		w.done <- eachWriter(qd, func(i int) error {
			buf := make([]byte, 4096)
			for n := 0; ; n++ {
				select {
				case <-w.stop:
					return nil
				default:
				}
				lba := i*perWriter + n%perWriter
				stamp(buf, uint64(lba), w.gens[lba]+1)
				if _, err := mv.WriteAtContext(ctx, buf, int64(lba)*4096); err != nil {
					return fmt.Errorf("write of block %d: %w", lba, err)
				}
				if n%flushEvery == flushEvery-1 {
					if err := mv.Flush(ctx); err != nil {
						return fmt.Errorf("flush: %w", err)
					}
				}
				w.gens[lba]++
				w.acks.Add(1)
				if each != nil {
					each()
				}
			}
		})
	}()
	return w
}

// halt stops the writers, waits for them and returns their first error;
// it may be called again (deferred, for a test that fails early).
func (w *stampWriters) halt() error {
	w.once.Do(func() {
		close(w.stop)
		w.err = <-w.done
	})
	return w.err
}

// waitFor waits up to 90 s for ok, failing the test if the writers stop
// first.
func (w *stampWriters) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !ok() {
		select {
		case err := <-w.done:
			w.done <- err // for halt
			t.Fatalf("the writers stopped before %s: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 90 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// more waits for n more acknowledged writes than now.
func (w *stampWriters) more(t *testing.T, what string, n int64) {
	t.Helper()
	want := w.acks.Load() + n
	w.waitFor(t, fmt.Sprintf("%d writes %s", n, what), func() bool { return w.acks.Load() >= want })
}

// writeStamps writes generation gen over blocks 0..blocks-1 through mv
// at queue depth qd, calling each (if set) after every write, and
// flushes.
func writeStamps(ctx context.Context, mv *initiator.MultipathVolume, qd, blocks int, gen uint32, each func()) error {
	err := eachWriter(qd, func(w int) error {
		buf := make([]byte, 4096)
		for lba := w; lba < blocks; lba += qd {
			stamp(buf, uint64(lba), gen)
			if _, err := mv.WriteAtContext(ctx, buf, int64(lba)*4096); err != nil {
				return err
			}
			if each != nil {
				each()
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write of generation %d: %w", gen, err)
	}
	if err := mv.Flush(ctx); err != nil {
		return fmt.Errorf("flush of generation %d: %w", gen, err)
	}
	return nil
}

// stamp fills a block with its LBA, a generation and a checksum.
func stamp(b []byte, lba uint64, gen uint32) {
	binary.LittleEndian.PutUint64(b, lba)
	binary.LittleEndian.PutUint32(b[8:], gen)
	for i := 12; i < len(b)-4; i++ {
		b[i] = byte(lba) ^ byte(gen) ^ byte(i)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.ChecksumIEEE(b[:len(b)-4]))
}

// checkStamp verifies a block holds the stamp of generation gen (zeros
// for 0, never written).
// verifyStamps reads every block of gens through mv and checks it holds
// its LBA and the generation gens says was acknowledged last.
func verifyStamps(t *testing.T, ctx context.Context, mv *initiator.MultipathVolume, gens []uint32) {
	t.Helper()
	buf := make([]byte, 4096)
	for lba, gen := range gens {
		if _, err := mv.ReadAtContext(ctx, buf, int64(lba)*4096); err != nil {
			t.Fatal(err)
		}
		if err := checkStamp(buf, uint64(lba), gen); err != nil {
			t.Error(err)
		}
	}
}

func checkStamp(b []byte, lba uint64, gen uint32) error {
	got := binary.LittleEndian.Uint32(b[8:])
	if gen == 0 && got == 0 && binary.LittleEndian.Uint64(b) == 0 {
		return nil
	}
	if crc32.ChecksumIEEE(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("block %d: torn or corrupt (checksum)", lba)
	}
	if binary.LittleEndian.Uint64(b) != lba || got != gen {
		return fmt.Errorf("block %d: holds block %d generation %d, want generation %d", lba, binary.LittleEndian.Uint64(b), got, gen)
	}
	return nil
}

// TestRBDStaleWrites is the fencing proof: QD16 writes of generation
// 2+ in flight through the active gateway when it is SIGSTOPped; the
// paths' keepalive (Keepalive = FastFail, 1 s; IOTimeout stays at its
// 30 s default) finds the stopped gateway and the I/O fails over (the
// other gateway breaks the stopped one's lock, blocklisting it, and
// re-issues what had not completed); newer data is written over every
// block through the new gateway and flushed; then the stopped gateway
// is SIGCONTed, and whatever it still had in flight must fail: every
// block still holds the newer data. GOSRP_RBD_STALE iterations (3 by
// default; the long form is 50); the time from each SIGSTOP to
// the first write completed on the other gateway is logged (median,
// max).
func TestRBDStaleWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// A stopped gateway keeps its connections: the keepalive finds it.
	p := gatewayPair(t, ctx, initiator.MultipathConfig{})
	addrs, gws, mv := p.addrs, p.gws, p.mv
	const qd, blocks = 16, 256
	gens := make([]uint32, blocks)
	// stopAt: when the last SIGSTOP was sent (unix nanos; 0: none);
	// firstAfter: when a write first completed after it on the new
	// path (a failover count above failoversAt).
	var stopAt, firstAfter, failoversAt atomic.Int64
	// writeAll writes generation gen over every block at QD16 and
	// flushes; it may run beside the test's goroutine.
	writeAll := func(gen uint32) error {
		err := writeStamps(ctx, mv, qd, blocks, gen, func() {
			if at := stopAt.Load(); at != 0 && int64(mv.Failovers()) > failoversAt.Load() {
				firstAfter.CompareAndSwap(0, time.Now().UnixNano())
			}
		})
		if err != nil {
			return err
		}
		for i := range gens {
			gens[i] = gen
		}
		return nil
	}
	verify := func() {
		t.Helper()
		verifyStamps(t, ctx, mv, gens)
	}
	gen := uint32(1)
	if err := writeAll(gen); err != nil {
		t.Fatal(err)
	}
	iters := int(testenv.Int(t, "GOSRP_RBD_STALE", 3, 1))
	var times []time.Duration
	for it := range iters {
		active := slices.Index(addrs, mv.Path())
		stale := make(chan error, 1)
		firstAfter.Store(0)
		failoversAt.Store(int64(mv.Failovers()))
		go func() { stale <- writeAll(gen + 1) }() // in flight at the stop, then failed over
		time.Sleep(20 * time.Millisecond)
		stopAt.Store(time.Now().UnixNano())
		if err := gws[active].Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		if err := <-stale; err != nil {
			t.Fatal(err)
		}
		first := time.Duration(firstAfter.Load() - stopAt.Load())
		stopAt.Store(0)
		if firstAfter.Load() == 0 {
			t.Fatalf("iteration %d: no write completed on another path after the stop", it)
		}
		times = append(times, first)
		t.Logf("iteration %d: gateway %d stopped; first write on gateway %d %v later, all in flight done %v later",
			it, active, slices.Index(addrs, mv.Path()), first.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
		if slices.Index(addrs, mv.Path()) == active {
			t.Fatalf("iteration %d: still on the stopped gateway", it)
		}
		gen += 2
		if err := writeAll(gen); err != nil { // the newer data, flushed through the new gateway
			t.Fatal(err)
		}
		if err := gws[active].Cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Whatever the old gateway still held now reaches the cluster,
		// or would: give it time to try.
		time.Sleep(2 * time.Second)
		verify()
		if t.Failed() {
			t.Fatalf("iteration %d: stale data over the newer generation %d", it, gen)
		}
		// The old gateway's client for the image was blocklisted; it
		// reconnected and, the same process, is the standby the next
		// iteration fails over to.
	}
	slices.Sort(times)
	t.Logf("stale-write scenario: %d iterations, 0 with stale data; SIGSTOP to the first write on the other gateway: median %v, max %v",
		iters, times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
}

// TestRBDFailoverSrpc: srpc import with two --target paths, two srpd
// gateways over one image, the first (active) SIGKILLed while the
// import runs: srpc fails over to the second, exits 0, and the image
// holds every byte (exported through the second, the first still named
// and dead).
func TestRBDFailoverSrpc(t *testing.T) {
	_, srpd, args := rbdGatewaySetup(t)
	_, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	a, b := e2etest.FreeAddr(t), e2etest.FreeAddr(t)
	ga := e2etest.StartDaemon(t, srpd, filepath.Join(dir, "a"), a, "", args...)
	e2etest.StartDaemon(t, srpd, filepath.Join(dir, "b"), b, "", args...)
	data := make([]byte, 64<<20)
	rand.Read(data)
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	imp := e2etest.StartProc(t, srpc, "import", "--quiet", "--qd", "8", "--target", a, "--target", b, "vol0", in)
	time.Sleep(250 * time.Millisecond) // srpc started and importing: 64 MiB take it about 0.5 s
	select {
	case <-imp.Exited():
		t.Skipf("the import ended before the kill (%v): nothing to fail over", imp.Err())
	default:
	}
	killed := time.Now()
	ga.Kill(t)
	select {
	case <-imp.Exited():
	case <-time.After(2 * time.Minute):
		t.Fatalf("srpc import still running 2 min after the kill:\n%s", imp.Output())
	}
	if code := imp.ExitCode(); code != 0 {
		t.Fatalf("srpc import exit %d after the kill:\n%s", code, imp.Output())
	}
	t.Logf("srpc import finished %v after the kill of the active gateway", time.Since(killed).Round(time.Millisecond))
	// Both paths, the dead one too: an import whose last write was
	// answered just before the kill took effect never failed over, and
	// the second gateway is still standby; the export's Multipath then
	// has it take the volume over (a lone --target would not).
	e2etest.MustRun(t, srpc, "export", "--quiet", "--target", b, "--target", a, "--length", "64MiB", "vol0", out)
	if e2etest.FileSum(t, out) != sha256.Sum256(data) {
		t.Fatal("the image differs from the import")
	}
}
