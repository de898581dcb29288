package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testcerts"
)

// TestNBDTLS serves a volume over TCP with TLS required and client
// certificates checked, and has libnbd's tools use it: nbdinfo over
// nbds:// with tls-certificates=DIR (ca-cert.pem, client-cert.pem,
// client-key.pem) reports TLS, nbdcopy moves data in and out intact, and
// a client without TLS or without a certificate gets nothing.
func TestNBDTLS(t *testing.T) {
	needNBDTools(t)
	srpc, dir, addr := startTarget(t, "16MiB", "--backend", "memory")
	certs := filepath.Join(dir, "certs")
	os.Mkdir(certs, 0o700)
	testcerts.Write(t, certs)
	nbdAddr := e2etest.FreeAddr(t)
	p := startNBDWith(t, srpc, "nbd", "--target", addr, "--listen", nbdAddr,
		"--tls-cert", filepath.Join(certs, testcerts.ServerCert), "--tls-key", filepath.Join(certs, testcerts.ServerKey),
		"--tls-client-ca", filepath.Join(certs, testcerts.CACert), "vol0")
	if !strings.Contains(p.Output(), "nbds://"+nbdAddr+"/vol0") {
		t.Errorf("srpc nbd does not announce an nbds:// URI: %s", p.Output())
	}
	uri := "nbds://" + nbdAddr + "/vol0?tls-certificates=" + certs
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s\nsrpc nbd log:\n%s", name, strings.Join(args, " "), err, out, p.Output())
		}
		return string(out)
	}
	info := run("nbdinfo", uri)
	for _, want := range []string{"with TLS", "export-size: 16777216", "base:allocation"} {
		if !strings.Contains(info, want) {
			t.Errorf("nbdinfo lacks %q:\n%s", want, info)
		}
	}

	img := make([]byte, 16<<20)
	rand.Read(img)
	in, out := filepath.Join(dir, "in.raw"), filepath.Join(dir, "out.raw")
	if err := os.WriteFile(in, img, 0o644); err != nil {
		t.Fatal(err)
	}
	run("nbdcopy", in, uri)
	run("nbdcopy", uri, out)
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, img) {
		t.Fatalf("nbdcopy through TLS: the volume's bytes differ from what went in (%v)", err)
	}

	// Without TLS, or without a client certificate: refused.
	noCert := filepath.Join(dir, "nocert")
	os.Mkdir(noCert, 0o700)
	ca, _ := os.ReadFile(filepath.Join(certs, testcerts.CACert))
	os.WriteFile(filepath.Join(noCert, testcerts.CACert), ca, 0o600)
	for _, bad := range []string{"nbd://" + nbdAddr + "/vol0", "nbds://" + nbdAddr + "/vol0?tls-certificates=" + noCert} {
		if o, err := exec.Command("nbdinfo", bad).CombinedOutput(); err == nil {
			t.Errorf("nbdinfo %s succeeded:\n%s", bad, o)
		} else {
			t.Logf("nbdinfo %s: %v: %s", bad, err, strings.TrimSpace(string(o)))
		}
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("srpc nbd exit %d after SIGTERM: %s", code, p.Output())
	}
}
