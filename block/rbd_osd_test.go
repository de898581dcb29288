//go:build ceph && pacific

package block

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/stretchr/testify/require"
)

// The OSD under requests in flight: what an rbd volume's asynchronous
// requests (rbd_aio.go) do when the OSD that holds them stops, or dies
// and comes back. librados keeps a request until an OSD answers it, so
// neither may fail a request, lose its completion or complete it early,
// and nothing acknowledged may be missing afterwards. These tests
// signal the micro cluster's OSD (test/ceph/cluster.sh, whose directory
// holds ceph.conf); they are not parallel, so no other test of the
// package runs meanwhile.

// stampedWriters writes 4 KiB blocks at qd concurrent writers, each its
// own blocks in turn, every block stamped with its number and a
// generation, with a flush every 16 writes, until stop is closed; it
// records the generation of each block whose write was acknowledged.
type stampedWriters struct {
	v    Volume
	gens []uint32 // by block; writer w owns blocks w, w+qd, ...
	acks atomic.Int64
	wg   sync.WaitGroup
	errs chan error
	stop chan struct{}
	once sync.Once
}

func startWriters(v Volume, qd, perWriter int) *stampedWriters {
	s := &stampedWriters{v: v, gens: make([]uint32, qd*perWriter), errs: make(chan error, qd), stop: make(chan struct{})}
	for w := range qd {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 4096)
			for n := 0; ; n++ {
				select {
				case <-s.stop:
					return
				default:
				}
				b := w + qd*(n%perWriter)
				binary.LittleEndian.PutUint64(buf, uint64(b))
				binary.LittleEndian.PutUint32(buf[8:], s.gens[b]+1)
				if _, err := v.WriteAt(buf, int64(b)*4096); err != nil {
					s.errs <- fmt.Errorf("write of block %d: %w", b, err)
					return
				}
				if n%16 == 15 {
					if err := v.Flush(); err != nil {
						s.errs <- fmt.Errorf("flush: %w", err)
						return
					}
				}
				s.gens[b]++
				s.acks.Add(1)
			}
		}()
	}
	return s
}

// finish stops the writers, waits for them (each finishes the request
// it has in flight) and fails the test on any error.
func (s *stampedWriters) finish(t *testing.T) {
	t.Helper()
	s.halt()
	close(s.errs)
	for err := range s.errs {
		t.Error(err)
	}
}

// halt stops the writers and waits for them; deferred right after
// startWriters, it keeps a failing test from closing the volume under
// their requests.
func (s *stampedWriters) halt() {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// verify reads every block back and checks its stamp: each block holds
// the last generation acknowledged for it (or nothing, never written).
func (s *stampedWriters) verify(t *testing.T) {
	t.Helper()
	got := make([]byte, 4096)
	bad := 0
	for b, gen := range s.gens {
		_, err := s.v.ReadAt(got, int64(b)*4096)
		require.NoError(t, err, "read of block %d", b)
		want := make([]byte, 12)
		if gen != 0 {
			binary.LittleEndian.PutUint64(want, uint64(b))
			binary.LittleEndian.PutUint32(want[8:], gen)
		}
		if !bytes.Equal(got[:12], want) && bad < 5 {
			bad++
			t.Errorf("block %d: stamp % x, want generation %d (% x)", b, got[:12], gen, want)
		}
	}
}

// waitAcks waits until n more writes than now were acknowledged.
func (s *stampedWriters) waitAcks(t *testing.T, n int64) {
	t.Helper()
	want := s.acks.Load() + n
	deadline := time.Now().Add(60 * time.Second)
	for s.acks.Load() < want {
		select {
		case err := <-s.errs:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes acknowledged in 60 s, want %d", s.acks.Load()-want+n, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writingToOSD starts 32 writers on a new volume of an exclusive store
// and waits for their first 200 writes; it returns the OSD's PID. The
// writers are halted, then the volume and store closed, when the test
// ends.
func writingToOSD(t *testing.T) (int, *stampedWriters) {
	pid := testenv.CephOSD(t)
	s := openTestRBDExclusive(t, t.TempDir())
	t.Cleanup(func() { s.Close() })
	v, err := s.Create("v", 4<<20, 4096)
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	w := startWriters(v, 32, 16)
	t.Cleanup(w.halt)
	w.waitAcks(t, 200)
	return pid, w
}

// TestRBDOSDPaused: the OSD stops (SIGSTOP) with 32 writes in flight
// and resumes 2 s later. While it is stopped no write is acknowledged
// (none completes early) and none fails; once it resumes every writer
// goes on, and every acknowledged write reads back.
func TestRBDOSDPaused(t *testing.T) {
	pid, w := writingToOSD(t)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	// Requests that reached the OSD's socket before the stop may still
	// be answered: let them drain, then count.
	time.Sleep(300 * time.Millisecond)
	before := w.acks.Load()
	time.Sleep(2 * time.Second)
	during := w.acks.Load() - before
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	resumed = true
	if during != 0 {
		t.Errorf("%d writes acknowledged while the OSD was stopped", during)
	}
	select {
	case err := <-w.errs:
		t.Fatalf("while the OSD was stopped: %v", err)
	default:
	}
	w.waitAcks(t, 200)
	w.finish(t)
	w.verify(t)
	t.Logf("%d writes acknowledged", w.acks.Load())
}

// TestRBDOSDRestarted: the OSD dies (SIGKILL) with 32 writes in flight
// and is started again (test/ceph/cluster.sh osd-start). librados
// resends the requests to the new OSD, which may or may not have
// committed each before it died, and the writers go on: no write fails,
// and every acknowledged write, before the kill or after, reads back.
func TestRBDOSDRestarted(t *testing.T) {
	pid, w := writingToOSD(t)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	start := time.Now()
	// Whatever happens below, the package's later tests need the OSD.
	defer testenv.StartCephOSD(t)
	testenv.StartCephOSD(t)
	w.waitAcks(t, 200)
	t.Logf("the writers went on %v after the kill (the OSD's restart included)", time.Since(start).Round(time.Millisecond))
	w.finish(t)
	w.verify(t)
}
