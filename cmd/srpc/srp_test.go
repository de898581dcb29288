package main

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestSRPProtocol: srpc --protocol srp against srpd's SRP personality,
// real processes: list and info show LUN 0 (srpd's vol0) with its size,
// an image imported into lun0 and exported back has the same checksum,
// and a malformed target port is a usage error.
func TestSRPProtocol(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	srpc, dir, addr := startTarget(t, "4MiB")
	conn := []string{"--target", addr, "--name", "srp-h", "--protocol", "srp"}
	r := e2etest.MustRun(t, srpc, append([]string{"list"}, conn...)...)
	if !strings.Contains(r.Stdout, "lun0") || !strings.Contains(r.Stdout, "4 MiB") {
		t.Fatalf("srpc list --protocol srp:\n%s", r.Stdout)
	}
	r = e2etest.MustRun(t, srpc, append([]string{"info", "lun0"}, conn...)...)
	if !strings.Contains(r.Stdout, "4 MiB") || !strings.Contains(r.Stdout, "id:           naa.3") {
		t.Fatalf("srpc info lun0 --protocol srp:\n%s", r.Stdout)
	}
	img := make([]byte, 3<<20+8192)
	rng := rand.New(rand.NewPCG(25, 1))
	for i := range img {
		img[i] = byte(rng.Uint32())
	}
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, img, 0o644); err != nil {
		t.Fatal(err)
	}
	e2etest.MustRun(t, srpc, append([]string{"import", "lun0", in}, conn...)...)
	e2etest.MustRun(t, srpc, append([]string{"export", "--length", "3153920", "lun0", out}, conn...)...)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(img) || !bytes.Equal(got, img) {
		t.Fatalf("exported %d bytes differ from the %d imported", len(got), len(img))
	}
	r = e2etest.Run(t, nil, srpc, append([]string{"list", "--srp-target-port", "xyz"}, conn...)...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "--srp-target-port") {
		t.Fatalf("bad --srp-target-port: exit %d, %q", r.Code, r.Stderr)
	}
}

// TestSRPReserve: srpc reserve --protocol srp (PERSISTENT RESERVE OUT and
// IN) against srpd's SRP personality, real processes, with a gosrp host
// beside it on the same volume: the SRP host registers and reserves,
// show prints its key and the reservation (SCSI names no host), a
// RESERVE with an unregistered key is refused as a conflict, the
// gosrp host's show names it by its initiator port and its import is
// refused, as is another SRP host's, pointed at srpc reserve show
// --protocol srp, and once the SRP host releases and unregisters the
// import goes through. Between the reserve and the rest, srpd is SIGKILLed and
// restarted on its data directory: what it acknowledged to the SRP host
// (the key, the reservation, their generation) is still there, as
// sd_pr_register's APTPL asks.
func TestSRPReserve(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	srpd, srpc := e2etest.Binaries(t)
	dir, addr := t.TempDir(), e2etest.FreeAddr(t)
	data := filepath.Join(dir, "data")
	d := e2etest.StartDaemon(t, srpd, data, addr, "", "--default-volume-size", "4MiB")
	srpConn := []string{"--target", addr, "--name", "srp-h", "--protocol", "srp"}
	gosrpConn := []string{"--target", addr, "--name", "gosrp-h"}
	run := func(args ...string) e2etest.Result {
		t.Helper()
		return e2etest.MustRun(t, srpc, args...)
	}
	run(append([]string{"reserve", "register", "lun0", "0xabc"}, srpConn...)...)
	run(append([]string{"reserve", "reserve", "--key", "0xabc", "lun0"}, srpConn...)...)
	before := run(append([]string{"reserve", "show", "lun0"}, srpConn...)...).Stdout
	d.Kill(t)
	e2etest.StartDaemon(t, srpd, data, addr, "")
	if r := run(append([]string{"reserve", "show", "lun0"}, srpConn...)...); !strings.Contains(r.Stdout, "write-exclusive by the host of key 0xabc") ||
		!strings.Contains(r.Stdout, "key 0xabc") || r.Stdout != before {
		t.Fatalf("srpc reserve show --protocol srp after srpd's SIGKILL:\n%s\nbefore it:\n%s", r.Stdout, before)
	}
	if r := e2etest.Run(t, nil, srpc, append([]string{"reserve", "reserve", "--key", "0x999", "lun0"}, srpConn...)...); r.Code != 1 ||
		!strings.Contains(r.Stderr, "refused: reservation conflict") {
		t.Fatalf("a RESERVE with an unregistered key: exit %d, %q", r.Code, r.Stderr)
	}
	if r := run(append([]string{"reserve", "show", "vol0"}, gosrpConn...)...); !strings.Contains(r.Stdout, "write-exclusive by \"") {
		t.Fatalf("the gosrp host's srpc reserve show:\n%s", r.Stdout)
	}
	in := filepath.Join(dir, "in.img")
	if err := os.WriteFile(in, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e2etest.Run(t, nil, srpc, append([]string{"import", "vol0", in}, gosrpConn...)...); r.Code == 0 || !strings.Contains(r.Stderr, "reserved") {
		t.Fatalf("the gosrp host's import under the SRP host's reservation: exit %d, %q", r.Code, r.Stderr)
	}
	// Another SRP host is pointed at the SRP command (the hint once named
	// the gosrp one, which knows no LUN names).
	if r := e2etest.Run(t, nil, srpc, "import", "--target", addr, "--name", "srp-o", "--protocol", "srp", "lun0", in); r.Code != 1 ||
		!strings.Contains(r.Stderr, "(srpc reserve show --protocol srp lun0)") {
		t.Fatalf("another SRP host's import under the reservation: exit %d, %q", r.Code, r.Stderr)
	}
	run(append([]string{"reserve", "release", "--key", "0xabc", "lun0"}, srpConn...)...)
	run(append([]string{"reserve", "register", "--key", "0xabc", "lun0", "0"}, srpConn...)...)
	run(append([]string{"import", "vol0", in}, gosrpConn...)...)
}
