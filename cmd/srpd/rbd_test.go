//go:build ceph && pacific

package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
)

// TestRBDBackendCLI runs srpd built with -tags ceph,pacific over the
// cluster CEPH_CONF names (test/ceph/cluster.sh): srpd serves the images
// of an RBD namespace, srpc imports and exports 16 MiB that come back with
// the same checksum, the rbd tool reads the same bytes from the image, and
// a second srpd on the same namespace is a standby gateway for the image
// the first holds the lock of: it refuses its I/O.
func TestRBDBackendCLI(t *testing.T) {
	conf, srpd, args := rbdGatewaySetup(t)
	_, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	ns := args[5]
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data"), addr, "", args...)

	want := sha256.Sum256(importExport(t, srpc, addr, dir, 16<<20))
	// The bytes are in the RBD image itself.
	raw := filepath.Join(dir, "raw.img")
	rbdTool(t, conf, "export", "rbd/"+ns+"/vol0", raw)
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 64<<20 || sha256.Sum256(b[:16<<20]) != want {
		t.Fatalf("rbd export: %d bytes, first 16 MiB differ from the import", len(b))
	}

	// A second gateway cannot take the image the first serves. srpd
	// opens an image while a session uses it: srpc nbd keeps one open.
	sock := filepath.Join(dir, "nbd.sock")
	nbd := e2etest.StartProc(t, srpc, "nbd", "--target", addr, "--socket", sock, "vol0")
	if !nbd.WaitFor(t, 30*time.Second, "listen on its NBD socket", func() bool { _, err := os.Stat(sock); return err == nil }) {
		t.Fatalf("srpc nbd exited:\n%s", nbd.Output())
	}
	addr2 := e2etest.FreeAddr(t)
	d2 := e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data2"), addr2, "", args...)
	r := e2etest.Run(t, nil, srpc, "export", "--target", addr2, "--length", "4KiB", "vol0", filepath.Join(dir, "out2.img"))
	if r.Code == 0 {
		t.Fatalf("export through a second srpd while the first holds the image's lock succeeded")
	}
	if !strings.Contains(r.Stderr, "path not active") {
		t.Errorf("srpc does not say why the second srpd refused: stderr %q", r.Stderr)
	}
	t.Logf("second srpd: srpc exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	// srpd status names each gateway's state of the volume: the first
	// serves it, the second has it closed again (the refused export's
	// handle went with it); the table has its PATH column.
	for _, c := range []struct{ data, want string }{{d.Data, "active"}, {d2.Data, "closed"}} {
		var st admin.Status
		if err := json.Unmarshal([]byte(e2etest.MustRun(t, srpd, "status", "--data", c.data, "--json").Stdout), &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Volumes) == 0 || st.Volumes[0].PathState != c.want {
			t.Errorf("srpd status of %s: volumes %+v, want vol0 %s", c.data, st.Volumes, c.want)
		}
	}
	if out := e2etest.MustRun(t, srpd, "status", "--data", d.Data).Stdout; !strings.Contains(out, "PATH") || !strings.Contains(out, "active") {
		t.Errorf("srpd status prints no path state:\n%s", out)
	}
	d2.Stop(t)
	nbd.Stop(t)
	d.Stop(t)
}

// rbdGatewaySetup skips without a cluster (CEPH_CONF) or with -short,
// builds srpd with -tags ceph,pacific, creates an RBD namespace of its
// own and returns the ceph.conf, the binary and srpd's flags for the
// namespace (its 64 MiB vol0 included); args[5] is the namespace.
func rbdGatewaySetup(t *testing.T) (conf, srpd string, args []string) {
	t.Helper()
	conf = testenv.CephConf(t)
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	srpd = filepath.Join(t.TempDir(), "srpd-ceph")
	if out, err := exec.Command("go", "build", "-tags", "ceph,pacific", "-o", srpd, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags ceph,pacific: %v\n%s", err, out)
	}
	ns := fmt.Sprintf("srpd%d", time.Now().UnixNano())
	rbdTool(t, conf, "namespace", "create", "rbd/"+ns)
	return conf, srpd, []string{"--backend", "rbd", "--rbd-pool", "rbd", "--rbd-namespace", ns, "--ceph-conf", conf, "--default-volume-size", "64MiB"}
}

// rbdTool runs the rbd command against the cluster.
func rbdTool(t *testing.T, conf string, args ...string) {
	t.Helper()
	rbdToolOutput(t, conf, args...)
}

// rbdToolOutput runs the rbd command against the cluster and returns
// its standard output.
func rbdToolOutput(t *testing.T, conf string, args ...string) []byte {
	t.Helper()
	return cephCLI(t, "rbd", conf, args...)
}

// cephCLI runs one of Ceph's tools (rbd, ceph) against the cluster and
// returns its standard output; it fails the test if the tool fails.
func cephCLI(t testing.TB, tool, conf string, args ...string) []byte {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(tool, append([]string{"-c", conf}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", tool, strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}
