package main

import (
	"bytes"
	"fmt"
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
			srv := e2etest.NewCrashTarget(t, srpd, dir, wire, "128MiB")
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
				srv.Start(t)
				p := e2etest.StartProc(t, srpc, "import", "--wire", wire, "--target", srv.Addr, "--timeout", "30s", "vol0", src)
				// The kill comes once srpd has taken a random share of the
				// image, so that it falls inside the import, not before
				// or after it.
				at := rng.Int64N(int64(len(img)))
				pause := time.Duration(rng.IntN(400)) * time.Millisecond
				srv.WaitWritten(t, "vol0", uint64(at), p)
				desc := fmt.Sprintf("iteration %d (kill after %d MiB, down %v)", it, at>>20, pause)
				srv.Restart(t, pause)
				werr := p.Wait(t, 90*time.Second, desc)
				out := p.Output()
				if werr != nil {
					refused++
					t.Logf("%s: import exited non-zero, as it may: %v: %s", desc, werr, e2etest.LastLine(out))
				} else {
					r := e2etest.MustRun(t, srpc, "export", "--wire", wire, "--target", srv.Addr, "--length", strconv.Itoa(len(img)), "vol0", "-")
					if got := []byte(r.Stdout); !bytes.Equal(got, img) {
						i := 0
						for i < len(got) && i < len(img) && got[i] == img[i] {
							i++
						}
						t.Fatalf("%s: srpc import exited 0 but the volume differs from byte %d on (seed %d): %s", desc, i, seed, out)
					}
					exact++
				}
				if strings.Contains(out, "reconnect") {
					hit++
				}
				srv.Stop(t)
			}
			t.Logf("%d iterations over %s: %d imports exact, %d exited non-zero, 0 silent losses; %d saw the kill", iters, wire, exact, refused, hit)
		})
	}
}
