package main

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestSignalWhileStarting: a SIGTERM that reaches srpd while it starts,
// its store already open, ends in the drain a SIGTERM after the start
// gets: exit 0 and the store closed. A supervisor stopping srpd as soon
// as it looks up, or a test on a loaded host (TestOfflineAdminBackend's
// SIGTERM once came 'exit -1'), met srpd before it caught signals, and
// killed it with its store open. The signal goes the moment srpd logs
// its default volume made, before its listener and admin socket.
func TestSignalWhileStarting(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		data := filepath.Join(t.TempDir(), "data")
		cmd := exec.CommandContext(ctx, srpd, "--data", data, "--listen", e2etest.FreeAddr(t), "--default-volume-size", "8MiB")
		errOut, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder // srpd logs to stderr, writes nothing to stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "created default volume") {
				cmd.Process.Signal(syscall.SIGTERM)
				break
			}
		}
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
		}
		err = cmd.Wait()
		if err != nil || !strings.Contains(out.String(), "the store is flushed") {
			t.Fatalf("run %d: SIGTERM while starting: %v; want exit 0 and the store flushed:\n%s", i, err, out.String())
		}
	}
}
