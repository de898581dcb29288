package main

import (
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestMultipathCopy: import and export with two --target paths, one of
// them dead (first for the import, last for the export, which a single
// --target, the last one given, would fail on): both go through the
// live one (srpd with a memory store, a gateway that is always active),
// and the bytes come back. Commands that do not take several paths say
// so.
func TestMultipathCopy(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	dead, addr := e2etest.FreeAddr(t), e2etest.FreeAddr(t)
	e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data"), addr, "", "--backend", "memory", "--default-volume-size", "16MiB")
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	paths := []string{"--target", dead, "--target", addr, "--timeout", "5s"}
	e2etest.MustRun(t, srpc, append([]string{"import"}, append(paths, "vol0", in)...)...)
	e2etest.MustRun(t, srpc, "export", "--length", "4MiB", "--target", addr, "--target", dead, "--timeout", "5s", "vol0", out)
	if e2etest.FileSum(t, out) != sha256.Sum256(buf) {
		t.Fatal("the export through two paths differs from the import")
	}
	r := e2etest.Run(t, nil, srpc, append([]string{"list"}, paths...)...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "import and export only") {
		t.Errorf("srpc list with two --target: exit %d, stderr %q; want a usage error", r.Code, r.Stderr)
	}
}
