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
