package emu_test

import (
	"flag"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/transporttest"
)

var conformanceSeed = flag.Int64("emu.seed", 0, "seed of the emulated NICs and of the randomized conformance tests (0: from the clock)")

// TestConformance runs the transport conformance suite against the software
// NIC for every quirk profile and every wire:
// TestConformance/profile=ib/wire=tcp/FastReg/FRMR/KeyWrap.
func TestConformance(t *testing.T) {
	seed := *conformanceSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -emu.seed=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d (rerun with -emu.seed=%d)", seed, seed)
		}
	})
	transporttest.RandomSeed = seed

	var p any = (*emu.Provider)(nil)
	if _, ok := p.(transporttest.Injector); !ok {
		t.Errorf("*emu.Provider does not implement transporttest.Injector: the fault-injection tests will skip")
	}
	if _, ok := p.(transporttest.Seeder); !ok {
		t.Errorf("*emu.Provider does not implement transporttest.Seeder")
	}

	for _, profile := range emu.Profiles() {
		t.Run("profile="+profile, func(t *testing.T) {
			for _, wire := range emu.Wires() {
				t.Run("wire="+wire, func(t *testing.T) {
					transporttest.Run(t, func(t *testing.T) transport.Provider {
						p, err := emu.New(emu.Config{Profile: profile, Wire: wire, Seed: seed, Logger: testLogger(t)})
						if err != nil {
							t.Fatalf("emu.New(profile %s, wire %s): %v", profile, wire, err)
						}
						return p
					})
				})
			}
		})
	}
}

// TestConformanceKnobs runs the suite on the strict profile with one of the
// knobs added for rxe set on its own (Config.Quirks), so that each is
// implemented independently of the others and of the rxe profile:
// TestConformanceKnobs/RecvLenErrStatus/Send/RecvTooSmall.
func TestConformanceKnobs(t *testing.T) {
	strict, err := emu.LookupProfile("strict")
	if err != nil {
		t.Fatal(err)
	}
	knobs := []struct {
		name string
		set  func(q *transport.Quirks)
	}{
		{"NoQPErrorEvents", func(q *transport.Quirks) { q.NoQPErrorEvents = true }},
		{"LocalKeyErrStatus", func(q *transport.Quirks) { q.LocalKeyErrStatus = transport.StatusLocQPOpErr }},
		{"RecvLenErrStatus", func(q *transport.Quirks) { q.RecvLenErrStatus = transport.StatusLocQPOpErr }},
		{"WindowBoundsUnchecked", func(q *transport.Quirks) { q.WindowBoundsUnchecked = true }},
		{"DestroyQPInvalidatesWindows", func(q *transport.Quirks) { q.DestroyQPInvalidatesWindows = true }},
		{"CyclicIndices", func(q *transport.Quirks) { q.CyclicIndices = true }},
		{"LocalErrFlushed", func(q *transport.Quirks) { q.LocalErrFlushed = true }},
		{"ReplayOnErr", func(q *transport.Quirks) { q.ReplayOnErr = true }},
		{"RetryRepeatsLocalOps", func(q *transport.Quirks) { q.RetryRepeatsLocalOps = true }},
	}
	seed := *conformanceSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -emu.seed=%d)", seed, seed)
	transporttest.RandomSeed = seed
	for _, k := range knobs {
		t.Run(k.name, func(t *testing.T) {
			q := strict.Quirks
			k.set(&q)
			transporttest.Run(t, func(t *testing.T) transport.Provider {
				p, err := emu.New(emu.Config{Profile: "strict", Quirks: &q, Seed: seed, Logger: testLogger(t)})
				if err != nil {
					t.Fatalf("emu.New(strict + %s): %v", k.name, err)
				}
				if got := deviceQuirks(t, p); got != q {
					t.Fatalf("device quirks %+v, want %+v", got, q)
				}
				return p
			})
		})
	}
}

func deviceQuirks(t *testing.T, p transport.Provider) transport.Quirks {
	t.Helper()
	d, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	return d.Attr().Quirks
}

// testLogger sends the NIC's log to the test's output (shown on failure or
// with -v), and drops it once the test is over.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop) // registered before Run's provider Close, so it runs after it
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(b), nil
	}
	w.t.Helper()
	w.t.Logf("emu: %s", trimNL(b))
	return len(b), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return b
}

var _ io.Writer = (*testWriter)(nil)
