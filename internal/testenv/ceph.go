package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The tests of several packages run at once (go test runs packages in
// parallel), and a test that stops or kills the OSD would fail another
// package's tests that use the cluster meanwhile. So every test that
// uses the cluster holds a shared flock on DIR/tests.lock (CephConf),
// and one that signals the OSD an exclusive one (CephOSD), each until
// it ends. Within one process the tests that signal the OSD are not
// parallel, so they run alone anyway: a test holding the exclusive
// lock takes no shared one.
var cephLocks struct {
	mu        sync.Mutex
	exclusive bool
	shared    int
}

// CephConf returns the ceph.conf of the test cluster (CEPH_CONF) and
// holds a shared lock on it until the test ends; it skips the test when
// CEPH_CONF is not set.
func CephConf(tb testing.TB) string {
	tb.Helper()
	conf := cephConf(tb)
	cephLocks.mu.Lock()
	if cephLocks.exclusive {
		cephLocks.mu.Unlock()
		return conf
	}
	cephLocks.shared++
	cephLocks.mu.Unlock()
	f := lockCluster(tb, conf, syscall.LOCK_SH)
	tb.Cleanup(func() {
		f.Close()
		cephLocks.mu.Lock()
		cephLocks.shared--
		cephLocks.mu.Unlock()
	})
	return conf
}

// cephConf returns CEPH_CONF, skipping the test without it.
func cephConf(tb testing.TB) string {
	tb.Helper()
	conf := os.Getenv("CEPH_CONF")
	if conf == "" {
		tb.Skip("CEPH_CONF not set: no Ceph cluster to test against (start one: test/ceph/cluster.sh start DIR; eval \"$(test/ceph/cluster.sh env DIR)\")")
	}
	return conf
}

// lockCluster opens the cluster's tests.lock and flocks it (how).
func lockCluster(tb testing.TB, conf string, how int) *os.File {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(filepath.Dir(conf), "tests.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		tb.Fatalf("the test cluster's lock: %v", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		tb.Fatalf("the test cluster's lock: %v", err)
	}
	return f
}

// CephOSD returns the PID of the OSD of the micro cluster that
// test/ceph/cluster.sh started and CEPH_CONF names, for a test that
// stops or kills it; it skips the test when there is no such cluster,
// and fails it when the PID is not that cluster's OSD (the process's
// command line must name CEPH_CONF, so a reused PID is never signalled).
//
// It holds the cluster's exclusive lock until the test ends, so that no
// test of another package uses the cluster meanwhile; call it before
// anything of the test uses the cluster (CephConf).
func CephOSD(tb testing.TB) int {
	tb.Helper()
	conf := cephConf(tb)
	cephLocks.mu.Lock()
	shared := cephLocks.shared
	cephLocks.mu.Unlock()
	if shared > 0 {
		tb.Fatal("testenv.CephOSD after the cluster's first use in this process's running tests: call it first")
	}
	f := lockCluster(tb, conf, syscall.LOCK_EX)
	cephLocks.mu.Lock()
	cephLocks.exclusive = true
	cephLocks.mu.Unlock()
	tb.Cleanup(func() {
		cephLocks.mu.Lock()
		cephLocks.exclusive = false
		cephLocks.mu.Unlock()
		f.Close()
	})
	b, err := os.ReadFile(filepath.Join(filepath.Dir(conf), "run", "osd.0.pid"))
	if err != nil {
		tb.Skipf("no OSD PID beside %s (a cluster test/ceph/cluster.sh did not start): %v", conf, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		tb.Fatalf("the OSD's PID file: %v", err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), conf) {
		tb.Fatalf("PID %d is not the OSD of %s (is it running?)", pid, conf)
	}
	return pid
}

// StartCephOSD starts the micro cluster's OSD again unless it runs
// (test/ceph/cluster.sh osd-start) and returns once a write reaches it.
func StartCephOSD(tb testing.TB) {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(dir)
		if up == dir {
			tb.Fatal("no go.mod above the test's directory: cannot find test/ceph/cluster.sh")
		}
		dir = up
	}
	script := filepath.Join(dir, "test", "ceph", "cluster.sh")
	if out, err := exec.Command(script, "osd-start", filepath.Dir(os.Getenv("CEPH_CONF"))).CombinedOutput(); err != nil {
		tb.Fatalf("cluster.sh osd-start: %v: %s", err, out)
	}
}
