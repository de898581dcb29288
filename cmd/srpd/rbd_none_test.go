//go:build !(ceph && pacific)

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestRBDWithoutCeph: srpd built without the ceph and pacific tags
// refuses --backend rbd (flag or config file key) with one line naming
// the build it needs, before it creates anything.
func TestRBDWithoutCeph(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "srpd.toml")
	if err := os.WriteFile(conf, []byte("backend = \"rbd\"\nrbd_pool = \"rbd\"\nrbd_namespace = \"ns\"\nceph_conf = \"/nonexistent/ceph.conf\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const want = "srpd: --backend rbd: srpd was built without Ceph support; build with -tags ceph,pacific\n"
	for _, args := range [][]string{
		{"--backend", "rbd", "--rbd-pool", "rbd", "--ceph-conf", "/nonexistent/ceph.conf"},
		{"--config", conf},
	} {
		data := filepath.Join(dir, "data")
		r := e2etest.Run(t, nil, srpd, append([]string{"--data", data, "--listen", e2etest.FreeAddr(t)}, args...)...)
		if r.Code != 1 || r.Stderr != want {
			t.Errorf("srpd %q: exit %d, stderr %q; want 1 and %q", args, r.Code, r.Stderr, want)
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Errorf("the refused start left %s behind (stat: %v)", data, err)
		}
	}
}
