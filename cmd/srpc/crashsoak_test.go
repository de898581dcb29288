package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
)

// TestImportCrashSoak is issue 21's silent loss as a soak: srpd, on
// pebble with its data directory kept, is SIGKILLed at a random moment of
// an 'srpc import' and started again on the same address after a random
// pause, over tcp and over shm. Every import must either exit 0 with
// every byte on the volume (each iteration imports fresh random bytes,
// so an old image or a torn block shows) or exit non-zero: never 0 with
// data missing. GOSRP_CRASH_SOAK=N runs N iterations per wire (2 by
// default, the short form CI runs; the long form is 200),
// GOSRP_CRASH_SOAK_SEED=S replays a run, GOSRP_CRASH_SOAK_MIB sets the
// image size (24; above the 64 MiB replay buffer the import must also
// flush on its own).
func TestImportCrashSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	iters := int(testenv.Int(t, "GOSRP_CRASH_SOAK", 2, 0))
	mib := int(testenv.Int(t, "GOSRP_CRASH_SOAK_MIB", 24, 1))
	seed := uint64(testenv.Seed(t, "GOSRP_CRASH_SOAK_SEED"))
	srpd, srpc := e2etest.Binaries(t)
	for _, wire := range []string{"tcp", "shm"} {
		t.Run(wire, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(len(wire))))
			dir := t.TempDir()
			data := filepath.Join(dir, "data")
			addr := e2etest.FreeAddr(t)
			if wire == "shm" {
				addr = filepath.Join(dir, "srpd.shm")
			}
			start := func() *e2etest.Daemon {
				return e2etest.StartDaemon(t, srpd, data, addr, "", "--wire", wire, "--default-volume-size", "128MiB")
			}
			img := make([]byte, mib<<20)
			src := filepath.Join(dir, "img")
			var exact, refused, hit int
			for it := 0; it < iters; it++ {
				for i := range img {
					img[i] = byte(rng.Uint32())
				}
				if err := os.WriteFile(src, img, 0o600); err != nil {
					t.Fatal(err)
				}
				d := start()
				cmd := exec.Command(srpc, "import", "--wire", wire, "--target", addr, "--timeout", "30s", "vol0", src)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				// The kill comes once srpd has taken a random share of the
				// image, so that it falls inside the import, not before
				// or after it.
				at := rng.Int64N(int64(len(img)))
				pause := time.Duration(rng.IntN(400)) * time.Millisecond
				began := time.Now()
				for e2etest.VolumeStats(t, srpd, data, "vol0").Write.Bytes < uint64(at) && len(exited) == 0 {
					if time.Since(began) > 60*time.Second {
						t.Fatalf("iteration %d: srpd has not written %d bytes after 60s: %s", it, at, out.String())
					}
					time.Sleep(5 * time.Millisecond)
				}
				kill := fmt.Sprintf("%d MiB", at>>20)
				d.Kill(t)
				time.Sleep(pause)
				d = start()
				var werr error
				select {
				case werr = <-exited:
				case <-time.After(90 * time.Second):
					cmd.Process.Kill()
					t.Fatalf("iteration %d (kill after %s, down %v): srpc import still running 90s later: %s", it, kill, pause, out.String())
				}
				if werr != nil {
					refused++
					t.Logf("iteration %d (kill after %s, down %v): import exited non-zero, as it may: %v: %s", it, kill, pause, werr, e2etest.LastLine(out.String()))
				} else {
					r := e2etest.MustRun(t, srpc, "export", "--wire", wire, "--target", addr, "--length", strconv.Itoa(len(img)), "vol0", "-")
					if got := []byte(r.Stdout); !bytes.Equal(got, img) {
						i := 0
						for i < len(got) && i < len(img) && got[i] == img[i] {
							i++
						}
						t.Fatalf("iteration %d (kill after %s, down %v): srpc import exited 0 but the volume differs from byte %d on (seed %d): %s", it, kill, pause, i, seed, out.String())
					}
					exact++
				}
				if bytes.Contains(out.Bytes(), []byte("reconnect")) {
					hit++
				}
				if code := d.Stop(t); code != 0 {
					t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, d.Log())
				}
			}
			t.Logf("%d iterations over %s: %d imports exact, %d exited non-zero, 0 silent losses; %d saw the kill", iters, wire, exact, refused, hit)
		})
	}
}
