package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
)

func TestMain(m *testing.M) { e2etest.Main(m) }

// TestBenchCrashSoak is issue 21's SIGKILL soak under 'bench --verify
// --fsync': srpd, on pebble with its data directory kept, is SIGKILLed
// at a random moment of a randrw run and started again on the same
// address after a random pause, over tcp and over shm. Every other run
// has a replay buffer (--replay-buffer) and must ride the restart out
// (exit 0); the others may fail (their next FLUSH reports the loss).
// Whatever bench's exit status, the region it leaves (read back with
// 'srpc export') is held to the verify state it saved (--verify-state): a
// run that exited 0 must have left exactly the generation it last wrote
// to every block (it ends with a FLUSH); any other must have left every
// block intact (no torn block) and no older than what a successful FLUSH
// covered (no flushed write lost). GOSRP_BENCH_CRASH_SOAK=N runs N
// iterations per wire (2 by default, the short form CI runs; the issue's
// long form is 200), GOSRP_BENCH_CRASH_SOAK_SEED=S replays a run.
func TestBenchCrashSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	iters := int(testenv.Int(t, "GOSRP_BENCH_CRASH_SOAK", 2, 0))
	seed := uint64(testenv.Seed(t, "GOSRP_BENCH_CRASH_SOAK_SEED"))
	t.Logf("seed %d (rerun with GOSRP_BENCH_CRASH_SOAK_SEED=%d)", seed, seed)
	srpd, srpc := e2etest.Binaries(t)
	bench := e2etest.Bench(t)
	const (
		bs      = 4096
		region  = 16 << 20
		runtime = 3 * time.Second
	)
	for _, wire := range []string{"tcp", "shm"} {
		t.Run(wire, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(len(wire))))
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			srv := e2etest.NewCrashTarget(t, srpd, dir, wire, "64MiB")
			var exact, refused, lossReported, hit, missed, flushedBlocks int
			for it := 0; it < iters; it++ {
				replay := it%2 == 0
				srv.Start(t)
				os.Remove(state)
				args := []string{"--target", srv.Addr, "--wire", wire, "--volume", "vol0",
					"--rw", "randrw", "--bs", strconv.Itoa(bs), "--iodepth", "8", "--size", strconv.Itoa(region),
					"--runtime", runtime.String(), "--verify", "--fsync", "16",
					"--seed", strconv.FormatUint(rng.Uint64()|1, 10), "--verify-state", state}
				if replay {
					args = append(args, "--replay-buffer", "8m")
				}
				p := e2etest.StartProc(t, bench, args...)
				// The kill falls inside the measured run: the clock starts
				// at srpd's first write, so a slow connect (a loaded
				// machine) does not move it before bench's I/O.
				at := time.Duration(rng.Int64N(int64(runtime - 500*time.Millisecond)))
				pause := time.Duration(rng.IntN(400)) * time.Millisecond
				desc := func() string {
					return "iteration " + strconv.Itoa(it) + " (replay " + strconv.FormatBool(replay) + ", kill " + at.String() + " into the I/O, down " + pause.String() + ")"
				}
				if !srv.WaitWritten(t, "vol0", 1, p) {
					t.Fatalf("%s: bench exited before writing: %v\n%s\nsrpd:\n%s", desc(), p.Err(), p.Output(), srv.D.Log())
				}
				// On a loaded machine the run can end before the kill:
				// then it is checked all the same, as a run without one.
				var werr error
				select {
				case <-p.Exited():
					werr = p.Err()
					missed++
				case <-time.After(at):
					srv.Restart(t, pause)
					werr = p.Wait(t, 120*time.Second, desc())
				}
				out := p.Output()
				if werr != nil && replay {
					t.Fatalf("%s: bench, with a replay buffer, exited %v: it must ride a restart out\n%s\nsrpd after the restart:\n%s", desc(), werr, out, srv.D.Log())
				}
				if werr != nil {
					refused++
					if strings.Contains(out, "lost writes it had acknowledged") {
						lossReported++
					}
					t.Logf("%s: bench exited non-zero, as it may: %v: %s", desc(), werr, e2etest.LastLine(out))
				} else {
					exact++
				}
				if strings.Contains(out, "target restarted") {
					hit++
				}
				rec, err := loadVerifyState(state)
				if err != nil {
					t.Fatalf("%s: %v (bench: %v)\n%s", desc(), err, werr, out)
				}
				r := e2etest.MustRun(t, srpc, "export", "--wire", wire, "--target", srv.Addr, "--length", strconv.Itoa(region), "vol0", "-")
				img := []byte(r.Stdout)
				if len(img) != region || len(rec.Blocks) != region/bs {
					t.Fatalf("%s: exported %d bytes, state of %d blocks", desc(), len(img), len(rec.Blocks))
				}
				var bad []string
				for i := range rec.Blocks {
					if err := rec.check(img[i*bs:(i+1)*bs], i, werr == nil); err != nil {
						bad = append(bad, err.Error())
					}
					if rec.Blocks[i].Flushed > 0 {
						flushedBlocks++
					}
				}
				if len(bad) > 0 {
					t.Fatalf("%s: bench exited %v; %d of %d blocks wrong (seed %d), first: %s\n%s", desc(), werr, len(bad), len(rec.Blocks), seed, strings.Join(bad[:min(4, len(bad))], "; "), out)
				}
				srv.Stop(t)
			}
			t.Logf("%d iterations over %s: %d runs exact, %d exited non-zero (%d reporting the lost writes), %d saw the kill, %d ended before it; 0 silent losses, 0 flushed writes lost, 0 torn blocks over %d flushed block generations",
				iters, wire, exact, refused, lossReported, hit, missed, flushedBlocks)
		})
	}
}
