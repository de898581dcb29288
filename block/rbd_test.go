//go:build ceph && pacific

package block

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/gosrp/gosrp/internal/testenv"
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
	conf := testenv.CephConf(t)
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

// openTestRBDExclusive opens a second (third, ...) client of the same
// namespace as openTestRBDStore(dir), with Exclusive set: what a gateway
// serving the images opens.
func openTestRBDExclusive(t testing.TB, dir string) Store {
	t.Helper()
	s := openTestRBDStore(t, dir).(*RBDStore)
	o := s.o
	require.NoError(t, s.Close())
	o.Exclusive = true
	x, err := OpenRBDStore(o)
	require.NoError(t, err)
	return x
}

// ownedFlushed creates volume "v" (1 MiB) through an exclusive store in
// dir, which holds its lock, and writes blk(1) at 0, flushed.
func ownedFlushed(t *testing.T, dir string) (Store, Volume) {
	owner := openTestRBDExclusive(t, dir)
	v, err := owner.Create("v", 1<<20, 4096)
	require.NoError(t, err)
	_, err = v.WriteAt(blk(1), 0)
	require.NoError(t, err)
	require.NoError(t, v.Flush())
	return owner, v
}

// blk is a block of 4 KiB of b.
func blk(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }

// TestRBDFencing: a second client cannot open an image another holds
// (ErrBusy), breaks the holder's lock and takes the image; from then on
// the old holder's writes and flushes fail with ErrFenced (ESHUTDOWN, it
// is blocklisted) and the data is the new holder's. Takeovers in a row
// (5; GOSRP_RBD_TAKEOVERS=20 for the figures), each by a fresh client,
// are timed (BreakLock + Open): nearly all
// of it is the monitor committing the blocklist, which waits for its
// paxos_propose_interval (1 s by default: median ≈ 0.94 s here; 0.1 s:
// median ≈ 0.19 s).
func TestRBDFencing(t *testing.T) {
	dir := t.TempDir()
	owner, v := ownedFlushed(t, dir)

	var times []time.Duration
	n := int(testenv.Int(t, "GOSRP_RBD_TAKEOVERS", 5, 1))
	for i := 0; i < n; i++ {
		next := openTestRBDExclusive(t, dir)
		_, err := next.Open("v")
		require.ErrorIs(t, err, ErrBusy, "the lock is held: open must fail")
		start := time.Now()
		require.NoError(t, next.(LockBreaker).BreakLock("v"))
		nv, err := next.Open("v")
		require.NoError(t, err)
		times = append(times, time.Since(start))
		_, err = nv.WriteAtFUA(blk(byte(i+2)), 0)
		require.NoError(t, err)

		// The old owner is fenced: nothing it writes lands.
		_, err = v.WriteAt(blk(0xee), 0)
		require.ErrorIs(t, err, ErrFenced, "iteration %d: the old owner's write", i)
		require.ErrorIs(t, err, syscall.ESHUTDOWN)
		require.ErrorIs(t, v.Flush(), ErrFenced)
		got := make([]byte, 4096)
		_, err = nv.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, blk(byte(i+2)), got, "iteration %d: the new owner's data", i)
		_ = owner.Close() // fenced: its close may report the blocklisting
		owner, v = next, nv
	}
	require.NoError(t, owner.Close())
	slices.Sort(times)
	t.Logf("takeover (BreakLock + Open) over %d: median %v, max %v", len(times), times[len(times)/2], times[len(times)-1])
}

// TestRBDBreakerDies: a gateway that broke the owner's lock and died
// before it took the lock itself (SIGKILL between BreakLock and
// AcquireLock) leaves the image with no owner and the old owner fenced.
// Nothing is lost and nothing hangs: the old owner's next write fails
// with ErrFenced; the next gateway's takeover finds nothing to break
// (BreakLock succeeds on an unowned image), opens, and reads what the
// old owner had flushed.
func TestRBDBreakerDies(t *testing.T) {
	dir := t.TempDir()
	owner, v := ownedFlushed(t, dir)

	breaker := openTestRBDExclusive(t, dir)
	require.NoError(t, breaker.(LockBreaker).BreakLock("v"))
	require.NoError(t, breaker.Close(), "the breaker dies without taking the lock")

	_, err := v.WriteAt(blk(0xee), 0)
	require.ErrorIs(t, err, ErrFenced, "the old owner's write after the break")

	next := openTestRBDExclusive(t, dir)
	defer next.Close()
	require.NoError(t, next.(LockBreaker).BreakLock("v"), "a takeover of an image nobody owns")
	nv, err := next.Open("v")
	require.NoError(t, err)
	got := make([]byte, 4096)
	_, err = nv.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, blk(1), got, "what the old owner flushed")
	_, err = nv.WriteAtFUA(blk(2), 0)
	require.NoError(t, err)
	require.NoError(t, nv.Close())
	_ = owner.Close() // fenced: its close may report the blocklisting
}

// TestRBDAllocated: Allocated reports the RBD objects that hold data
// (whole 4 MiB objects, from the object map), nothing else, and a clone
// includes what its parent holds.
func TestRBDAllocated(t *testing.T) {
	s := openTestRBDStore(t, t.TempDir())
	defer s.Close()
	const obj = 4 << 20
	v, err := s.Create("v", 4*obj, 4096)
	require.NoError(t, err)
	defer v.Close()
	runs := func(v Volume) [][2]int64 {
		var out [][2]int64
		end, err := v.(Allocator).Allocated(0, v.Size(), func(off, n int64) bool {
			out = append(out, [2]int64{off, n})
			return true
		})
		require.NoError(t, err)
		require.Equal(t, v.Size(), end)
		return out
	}
	require.Empty(t, runs(v), "a new volume holds nothing")
	_, err = v.WriteAt(bytes.Repeat([]byte{7}, 4096), obj+8192)
	require.NoError(t, err)
	_, err = v.WriteAt(bytes.Repeat([]byte{7}, 4096), 3*obj)
	require.NoError(t, err)
	require.NoError(t, v.Flush())
	require.Equal(t, [][2]int64{{obj, obj}, {3 * obj, obj}}, runs(v))
	// A range inside an object is cut to the range.
	var got [][2]int64
	_, err = v.(Allocator).Allocated(obj+4096, 8192, func(off, n int64) bool { got = append(got, [2]int64{off, n}); return true })
	require.NoError(t, err)
	require.Equal(t, [][2]int64{{obj + 4096, 8192}}, got)

	_, err = s.(Snapshotter).Snapshot("v", "s")
	require.NoError(t, err)
	c, err := s.(Snapshotter).Clone("v", "s", "c")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, [][2]int64{{obj, obj}, {3 * obj, obj}}, runs(c), "a clone holds its parent's data")
}

// TestRBDSharedOpen: what a gateway does (SharedOpener). Two clients open
// one image shared; the first takes its lock, the second's AcquireLock
// is refused (ErrBusy) until it breaks the lock, and then the first's
// writes and flushes fail with ErrFenced, it can never lock the image
// again, and the data is the second's.
func TestRBDSharedOpen(t *testing.T) {
	dir := t.TempDir()
	a := openTestRBDStore(t, dir)
	defer a.Close()
	b := openTestRBDStore(t, dir)
	defer b.Close()
	v, err := a.Create("v", 1<<20, 4096)
	require.NoError(t, err)
	require.NoError(t, v.Close())

	va, err := a.(SharedOpener).OpenShared("v")
	require.NoError(t, err)
	defer va.Close()
	require.NoError(t, a.(SharedOpener).AcquireLock("v"))
	require.NoError(t, a.(SharedOpener).AcquireLock("v"), "a second AcquireLock by the owner")
	_, err = va.WriteAtFUA(blk(1), 0)
	require.NoError(t, err)

	vb, err := b.(SharedOpener).OpenShared("v")
	require.NoError(t, err)
	defer vb.Close()
	start := time.Now()
	require.ErrorIs(t, b.(SharedOpener).AcquireLock("v"), ErrBusy)
	t.Logf("a refused AcquireLock took %v", time.Since(start))
	start = time.Now()
	require.NoError(t, b.(LockBreaker).BreakLock("v"))
	require.NoError(t, b.(SharedOpener).AcquireLock("v"))
	t.Logf("BreakLock + AcquireLock took %v", time.Since(start))
	_, err = vb.WriteAtFUA(blk(2), 0)
	require.NoError(t, err)

	_, err = va.WriteAt(blk(0xee), 0)
	require.ErrorIs(t, err, ErrFenced, "the old owner's write")
	require.ErrorIs(t, va.Flush(), ErrFenced)
	require.ErrorIs(t, a.(SharedOpener).AcquireLock("v"), ErrFenced, "a fenced client locks again")
	got := make([]byte, 4096)
	_, err = vb.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, blk(2), got)
	require.NoError(t, vb.Flush())
}

// TestRBDReconnect: a lock break fences the old owner from that image
// only (each shared open has a client of its own: its other image goes
// on); Reconnect gives the fenced image a new client, which reads but
// refuses writes and flushes until AcquireLock takes the lock back, here
// by breaking the new owner's (a failback), after which the data is the
// new owner's and the other side is fenced.
func TestRBDReconnect(t *testing.T) {
	a, b := twoGateways(t)
	sa, sb := a.(SharedOpener), b.(SharedOpener)
	va, err := sa.OpenShared("v")
	require.NoError(t, err)
	defer va.Close()
	wa, err := sa.OpenShared("w")
	require.NoError(t, err)
	defer wa.Close()
	require.NoError(t, sa.AcquireLock("v"))
	require.NoError(t, sa.AcquireLock("w"))
	_, err = va.WriteAtFUA(blk(1), 0)
	require.NoError(t, err)

	vb, err := sb.OpenShared("v")
	require.NoError(t, err)
	defer vb.Close()
	require.NoError(t, b.(LockBreaker).BreakLock("v"))
	require.NoError(t, sb.AcquireLock("v"))
	_, err = vb.WriteAtFUA(blk(2), 0)
	require.NoError(t, err)

	_, err = va.WriteAt(blk(0xee), 0)
	require.ErrorIs(t, err, ErrFenced, "the old owner's write")
	_, err = wa.WriteAtFUA(blk(3), 0)
	require.NoError(t, err, "the old owner's write to its other image, which nobody took")
	require.NoError(t, wa.Flush())

	start := time.Now()
	require.NoError(t, a.(Reconnector).Reconnect("v"))
	t.Logf("Reconnect took %v", time.Since(start))
	got := make([]byte, 4096)
	_, err = va.ReadAt(got, 0)
	require.NoError(t, err, "a read through the new client")
	require.Equal(t, blk(2), got)
	_, err = va.WriteAt(blk(0xee), 0)
	require.ErrorIs(t, err, ErrFenced, "a write through the new client before it locks")
	require.ErrorIs(t, va.Flush(), ErrFenced)
	require.ErrorIs(t, sa.AcquireLock("v"), ErrBusy, "the lock b holds")

	require.NoError(t, a.(LockBreaker).BreakLock("v"))
	require.NoError(t, sa.AcquireLock("v"))
	_, err = va.WriteAtFUA(blk(4), 4096)
	require.NoError(t, err)
	_, err = vb.WriteAt(blk(0xee), 4096)
	require.ErrorIs(t, err, ErrFenced, "b's write after the failback")
	_, err = va.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, blk(2), got, "b's write, before the failback")
	require.ErrorIs(t, b.(Reconnector).Reconnect("nope"), ErrInvalid)
}

// TestRBDWatchFenced: the store tells WatchFenced's function of a lock
// another client broke, with no request of its own, and the function may
// reconnect the volume there and then (as the gateway catalog does); a
// header change that is not a break (a resize by the owner) tells
// nothing. Close stops the watch.
func TestRBDWatchFenced(t *testing.T) {
	a, b := twoGateways(t)
	told := make(chan string, 4)
	a.(interface{ WatchFenced(func(string)) }).WatchFenced(func(name string) {
		if err := a.(Reconnector).Reconnect(name); err != nil {
			t.Errorf("reconnect %s from the watch: %v", name, err)
		}
		told <- name
	})
	sa := a.(SharedOpener)
	vs := map[string]Volume{}
	for _, n := range []string{"v", "w"} {
		v, err := sa.OpenShared(n)
		require.NoError(t, err)
		defer v.Close()
		require.NoError(t, sa.AcquireLock(n))
		vs[n] = v
	}
	require.NoError(t, vs["w"].Resize(2<<20), "a header change of the owner's own")
	vb, err := b.(SharedOpener).OpenShared("v")
	require.NoError(t, err)
	defer vb.Close()
	start := time.Now()
	require.NoError(t, b.(LockBreaker).BreakLock("v"))
	select {
	case name := <-told:
		require.Equal(t, "v", name, "the first volume told")
		t.Logf("told %v after the break began", time.Since(start))
	case <-time.After(60 * time.Second):
		t.Fatal("no word of the broken lock in 60 s")
	}
	_, err = vs["v"].WriteAt(blk(1), 0)
	require.ErrorIs(t, err, ErrFenced, "a write through the reconnected, unlocked client")
	_, err = vs["w"].WriteAtFUA(blk(1), 0)
	require.NoError(t, err, "w, whose lock nobody broke")
	require.Empty(t, told)
}

// twoGateways returns two stores, as two gateways' clients, over one
// namespace holding 1 MiB volumes v and w that neither has open.
func twoGateways(t *testing.T) (a, b Store) {
	dir := t.TempDir()
	a = openTestRBDStore(t, dir)
	t.Cleanup(func() { a.Close() })
	b = openTestRBDStore(t, dir)
	t.Cleanup(func() { b.Close() })
	for _, n := range []string{"v", "w"} {
		v, err := a.Create(n, 1<<20, 4096)
		require.NoError(t, err)
		require.NoError(t, v.Close())
	}
	return a, b
}

// TestRBDRequestsAllocateNothing: a read, a write and a flush of an rbd
// volume allocate nothing once warm (rbd_aio.go reuses each request's
// completion slot, channel and pinner).
func TestRBDRequestsAllocateNothing(t *testing.T) {
	s := openTestRBDStore(t, t.TempDir())
	defer s.Close()
	v, err := s.Create("v", 1<<20, 4096)
	require.NoError(t, err)
	defer v.Close()
	p := make([]byte, 4096)
	for name, f := range map[string]func() error{
		"write": func() error { _, err := v.WriteAt(p, 8192); return err },
		"read":  func() error { _, err := v.ReadAt(p, 8192); return err },
		"flush": v.Flush,
	} {
		require.NoError(t, f(), name)
		if n := testing.AllocsPerRun(100, func() { _ = f() }); n != 0 {
			t.Errorf("%s: %v allocations each, want 0", name, n)
		}
	}
}

// TestRBDVolumeMetadata: a record written with a volume by the gateway
// that holds its lock is read by another gateway's client; a client
// without the lock cannot write one (librbd would have the owner write
// it), nor can the old owner once its lock was broken (its client is
// blocklisted: it reads nothing either).
func TestRBDVolumeMetadata(t *testing.T) {
	a, b := twoGateways(t)
	ma, mb := a.(VolumeMetadata), b.(VolumeMetadata)
	_, err := ma.Metadata("v", "k")
	require.ErrorIs(t, err, ErrInvalid, "a volume not open here")
	va, err := a.(SharedOpener).OpenShared("v")
	require.NoError(t, err)
	defer va.Close()
	v, err := ma.Metadata("v", "k")
	require.NoError(t, err)
	require.Empty(t, v, "a key never written")
	require.ErrorIs(t, ma.SetMetadata("v", "k", "1"), ErrFenced, "without the lock")
	require.NoError(t, a.(SharedOpener).AcquireLock("v"))
	require.NoError(t, ma.SetMetadata("v", "k", "1"))

	vb, err := b.(SharedOpener).OpenShared("v")
	require.NoError(t, err)
	defer vb.Close()
	v, err = mb.Metadata("v", "k")
	require.NoError(t, err)
	require.Equal(t, "1", v, "another gateway reads the owner's record")
	require.ErrorIs(t, mb.SetMetadata("v", "k", "2"), ErrFenced, "a gateway without the lock")
	require.NoError(t, b.(LockBreaker).BreakLock("v"))
	require.NoError(t, b.(SharedOpener).AcquireLock("v"))
	require.NoError(t, mb.SetMetadata("v", "k", "2"))
	require.ErrorIs(t, ma.SetMetadata("v", "k", "3"), ErrFenced, "the old owner, its lock broken")
	_, err = ma.Metadata("v", "k")
	require.ErrorIs(t, err, ErrFenced, "the old owner's client is blocklisted: it reads nothing either")

	// A gateway's store is Exclusive (srpd's is) and opens its volumes
	// shared: the lock is not its own until AcquireLock.
	x := openTestRBDExclusive(t, t.TempDir())
	defer x.Close()
	w, err := x.Create("w", 1<<20, 4096)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	ws, err := x.(SharedOpener).OpenShared("w")
	require.NoError(t, err)
	defer ws.Close()
	require.ErrorIs(t, x.(VolumeMetadata).SetMetadata("w", "k", "1"), ErrFenced, "an Exclusive store's shared open, not locked")
	require.NoError(t, x.(SharedOpener).AcquireLock("w"))
	require.NoError(t, x.(VolumeMetadata).SetMetadata("w", "k", "1"))
	v, err = mb.Metadata("v", "k")
	require.NoError(t, err)
	require.Equal(t, "2", v)
}
