// Package e2etest runs srpd, srpc and bench as a user would, for the
// black-box tests of cmd/srpd, cmd/srpc and bench: it builds the
// binaries (without -race, whatever the test binary was built with),
// picks free ports, starts the daemon and waits until it answers.
package e2etest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/wire"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Cleanup removes the built binaries; Main calls it after the tests.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// Main runs the tests of a package that uses Binaries, removes the
// binaries and exits with the tests' code: the whole TestMain of such a
// package is
//
//	func TestMain(m *testing.M) { e2etest.Main(m) }
//
// A test that waits for a program that never finishes is reported by a
// watchdog a minute before go test's -timeout (startWatchdog).
func Main(m *testing.M) {
	flag.Parse()
	stop := startWatchdog()
	code := m.Run()
	stop()
	Cleanup()
	os.Exit(code)
}

// Binaries builds srpd and srpc once per test process and returns their
// paths. Under -short it skips the test instead: a test that builds and
// runs the programs is a long one.
func Binaries(t testing.TB) (srpd, srpc string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gosrp-e2e-")
		if buildErr != nil {
			return
		}
		// go test puts its own GOROOT/bin first on the PATH of the test
		// binary (Go 1.19 release notes), so "go" is the toolchain that
		// built this test.
		cmd := exec.Command("go", "build", "-o", binDir+"/",
			"github.com/gosrp/gosrp/cmd/srpd", "github.com/gosrp/gosrp/cmd/srpc", "github.com/gosrp/gosrp/bench")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "srpd"), filepath.Join(binDir, "srpc")
}

// Bench returns the path of the bench binary, built with srpd and srpc.
func Bench(t testing.TB) string {
	t.Helper()
	Binaries(t)
	return filepath.Join(binDir, "bench")
}

// ConnectRequest is the connect request a gosrp initiator sends first
// on emu's tcp wire: a 36-byte frame header of kind CM_REQ (magic "gS",
// version 1, READ credit 16 each way; transport/emu/frame.go) and a hello. Flood tests send it and
// never log in. The answer's byte 3 is 0x41 (CM_REP) or 0x42 (CM_REJ).
func ConnectRequest() []byte {
	hello := wire.Hello{Version: wire.Version}.Encode()
	f := make([]byte, 36+len(hello))
	binary.LittleEndian.PutUint16(f[0:], 0x5367)
	f[2] = 1
	f[3] = 0x40
	binary.LittleEndian.PutUint16(f[12:], 16|16<<8) // READ credit: 16 each way
	binary.LittleEndian.PutUint32(f[32:], uint32(len(hello)))
	copy(f[36:], hello)
	return f
}

// VolumeStats is what 'srpd status' says of volume vol of the srpd on
// data (zero counters when it names no such volume).
func VolumeStats(t testing.TB, srpd, data, vol string) admin.VolumeStats {
	t.Helper()
	r := MustRun(t, srpd, "status", "--data", data, "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	for _, v := range st.VolumeStats {
		if v.Name == vol {
			return v
		}
	}
	return admin.VolumeStats{Name: vol}
}

// LastLine is the last line of a program's output: a failing command's
// error.
func LastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// FreeAddr returns a loopback address with a port nobody listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Result is a finished command.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Run runs a binary to completion (bounded by two minutes).
func Run(t testing.TB, env []string, bin string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", filepath.Base(bin), args, err)
	}
	return r
}

// MustRun runs a binary and fails the test unless it exits 0.
func MustRun(t testing.TB, bin string, args ...string) Result {
	t.Helper()
	r := Run(t, nil, bin, args...)
	if r.Code != 0 {
		t.Fatalf("%s %s: exit %d\nstdout: %s\nstderr: %s", filepath.Base(bin), strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// Daemon is a running srpd.
type Daemon struct {
	*Proc
	Data    string
	Addr    string
	Metrics string
}

// Log is what the daemon has written to stdout and stderr so far.
func (d *Daemon) Log() string { return d.Output() }

// StartDaemon starts srpd on data and addr (plus extra flags) and waits
// until its admin socket answers.
func StartDaemon(t testing.TB, srpd, data, addr, metrics string, extra ...string) *Daemon {
	t.Helper()
	args := []string{"--data", data, "--listen", addr}
	if metrics != "" {
		args = append(args, "--metrics", metrics)
	}
	args = append(args, extra...)
	d := &Daemon{Proc: StartProc(t, srpd, args...), Data: data, Addr: addr, Metrics: metrics}
	c := admin.NewClient(filepath.Join(data, admin.SocketName))
	answers := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx) == nil
	}
	if !d.WaitFor(t, 60*time.Second, "answer on its admin socket", answers) {
		t.Fatalf("srpd exited before it was ready: %v\n%s", d.waitErr, d.Log())
	}
	return d
}

// FileSum is the SHA-256 of the file at path, for comparing what a program
// wrote with what went in.
func FileSum(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}
