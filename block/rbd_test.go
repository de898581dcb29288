//go:build ceph && pacific

package block

import (
	"fmt"
	"hash/fnv"
	"os"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/stretchr/testify/require"
)

func init() {
	extraAPIBackends = append(extraAPIBackends, backend{name: "rbd", persistent: true, open: openTestRBDStore})
}

// testRBDPool is the pool test/ceph/cluster.sh creates.
const testRBDPool = "rbd"

// openTestRBDStore opens an rbd store in a namespace of its own, named
// for dir, so that each test sees an empty store and a reopen of the
// same dir sees the same volumes. It skips when no cluster is given.
func openTestRBDStore(t testing.TB, dir string) Store {
	t.Helper()
	conf := os.Getenv("CEPH_CONF")
	if conf == "" {
		t.Skip("CEPH_CONF not set: no Ceph cluster to test the rbd backend against (start one: test/ceph/cluster.sh start DIR; eval \"$(test/ceph/cluster.sh env DIR)\")")
	}
	h := fnv.New64a()
	h.Write([]byte(dir))
	ns := fmt.Sprintf("t%016x", h.Sum64())
	ensureRBDNamespace(t, conf, ns)
	s, err := OpenRBDStore(RBDOptions{ConfFile: conf, Pool: testRBDPool, Namespace: ns})
	require.NoError(t, err)
	return s
}

// ensureRBDNamespace creates an RBD namespace unless it exists.
func ensureRBDNamespace(t testing.TB, conf, ns string) {
	t.Helper()
	conn, err := rados.NewConn()
	require.NoError(t, err)
	defer conn.Shutdown()
	require.NoError(t, conn.ReadConfigFile(conf))
	require.NoError(t, conn.Connect())
	ioctx, err := conn.OpenIOContext(testRBDPool)
	require.NoError(t, err)
	defer ioctx.Destroy()
	ok, err := rbd.NamespaceExists(ioctx, ns)
	require.NoError(t, err)
	if !ok {
		require.NoError(t, rbd.NamespaceCreate(ioctx, ns))
	}
}
