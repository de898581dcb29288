package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestImportGracefulRestart: srpd is stopped with SIGTERM and started
// again, up to five times (three at least), while srpc import streams
// into it, in gosrp's
// protocol and in T10 SRP. A stopping srpd drains: it finishes what it
// has, answers what arrives meanwhile BUSY (the command never runs),
// and ends its connections. srpc must take BUSY for "not now", as the
// wire says and as Linux's midlayer does, and ask again after the
// restart; the import exits 0 and the volume reads back the image.
// Before the initiator retried BUSY, an SRP import failed at its first
// restart with "SCSI status BUSY", a gosrp one at about one restart in
// three with "target: none" (the testdata/core traces srp and timeouts
// pin the retry down without the timing). With a replay buffer (4 MiB)
// far smaller than the import, writes wait for room in it at every
// restart: they once counted as lost, and the import failed at its
// flush ("lost writes it had acknowledged") in 2 of 2 runs; they are
// replayed after the ring's entries now.
func TestImportGracefulRestart(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	const size, chunk, restarts, minRestarts = 192 << 20, 1 << 20, 5, 3
	img := make([]byte, size)
	rand.Read(img)
	for _, tc := range []struct {
		name, protocol, vol string
		args                []string
	}{
		{"gosrp", "gosrp", "vol0", nil},
		{"srp", "srp", "lun0", nil},
		// A replay buffer far smaller than the import is full at every
		// restart, with writes waiting for room in it.
		{"gosrp-small-ring", "gosrp", "vol0", []string{"--replay-buffer", "4MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			data := filepath.Join(dir, "data")
			addr := e2etest.FreeAddr(t)
			start := func() *e2etest.Daemon {
				return e2etest.StartDaemon(t, srpd, data, addr, "", "--default-volume-size", "256MiB")
			}
			d := start()
			args := append([]string{"import", "--protocol", tc.protocol, "--target", addr, "--timeout", "30s"}, tc.args...)
			p, stdin := e2etest.StartPiped(t, srpc, append(args, tc.vol, "-")...)
			fed := make(chan error, 1)
			go func() { // srpc has more to send across each stop: at full speed, commands meet the drain
				for off := 0; off < size; off += chunk {
					if _, err := stdin.Write(img[off : off+chunk]); err != nil {
						fed <- err
						return
					}
				}
				fed <- stdin.Close()
			}()
			done := 0
			for ; done < restarts; done++ {
				written := func() bool { return e2etest.VolumeStats(t, srpd, data, "vol0").Write.Bytes >= 8<<20 }
				if !p.WaitFor(t, 30*time.Second, "8 MiB written by this srpd", written) {
					break // the import ended: judged below
				}
				if code := d.Stop(t); code != 0 {
					t.Fatalf("srpd exit %d after SIGTERM:\n%s", code, d.Log())
				}
				d = start()
			}
			if err := p.Wait(t, 60*time.Second, "after the restarts"); err != nil {
				t.Fatalf("srpc import through %d graceful restarts: %v:\n%s", done, err, p.Output())
			}
			if done < minRestarts {
				t.Fatalf("the import ended after %d restarts; the test wants %d: import more", done, minRestarts)
			}
			t.Logf("%d graceful restarts during the import", done)
			if err := <-fed; err != nil {
				t.Fatalf("feeding srpc: %v", err)
			}
			r := e2etest.MustRun(t, srpc, "export", "--protocol", tc.protocol, "--target", addr, "--length", fmt.Sprint(size), tc.vol, "-")
			if got := []byte(r.Stdout); !bytes.Equal(got, img) {
				t.Fatal("srpc import exited 0 but the volume differs from the image")
			}
		})
	}
}
