package block

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDeleteIfNoSnapshotsRace: a snapshot taken while the volume is
// deleted with DeleteIfNoSnapshots is either refused (the volume went
// first) or kept with its volume (the delete is refused); a snapshot
// whose Snapshot call succeeded is never deleted unseen. This is why
// srpd's volume delete asks the store rather than listing snapshots and
// then deleting.
func TestDeleteIfNoSnapshotsRace(t *testing.T) {
	forSnapshotters(t, func(t *testing.T, s Store, sn Snapshotter) {
		deleted, refused := 0, 0
		for i := range 40 {
			name := fmt.Sprintf("race%d", i)
			v, err := s.Create(name, 1<<20, 4096)
			require.NoError(t, err)
			require.NoError(t, v.Close())
			var snapErr, delErr error
			var wg sync.WaitGroup
			start := make(chan struct{})
			// Each side waits a random while first, so that either
			// may reach the store first and, some rounds, both at
			// once. The interleaving is the scheduler's: no seed
			// would replay it, so a failure names its round and
			// both calls' errors instead.
			wait := [2]int{rand.IntN(spins), rand.IntN(spins)}
			wg.Go(func() { <-start; wait[0] = spin(wait[0]); _, snapErr = sn.Snapshot(name, "s") })
			wg.Go(func() { <-start; wait[1] = spin(wait[1]); delErr = sn.DeleteIfNoSnapshots(name) })
			close(start)
			wg.Wait()
			switch {
			case delErr == nil:
				require.ErrorIs(t, snapErr, ErrNotFound, "round %d: the volume was deleted, yet its snapshot was taken", i)
				deleted++
			case errors.Is(delErr, ErrHasSnapshots):
				require.NoError(t, snapErr, "round %d", i)
				snaps, err := sn.Snapshots(name)
				require.NoError(t, err)
				require.Len(t, snaps, 1, "round %d: the refused delete lost the snapshot", i)
				require.NoError(t, s.Delete(name))
				refused++
			default:
				t.Fatalf("round %d: delete: %v (snapshot: %v)", i, delErr, snapErr)
			}
		}
		t.Logf("%d deleted first, %d refused", deleted, refused)
	})
}

// spins bounds the random head start each side of the race takes: about
// as long as a store's Snapshot call on this kind of machine.
const spins = 20000

// spin burns n loop iterations without yielding to the scheduler.
//
//go:noinline
func spin(n int) (sum int) {
	for i := range n {
		sum += i
	}
	return sum
}

// TestDeleteIfNoSnapshots: a volume with a snapshot is refused with
// ErrHasSnapshots and kept, readable, with the snapshot; once the
// snapshot is deleted the volume goes; a missing volume is ErrNotFound.
func TestDeleteIfNoSnapshots(t *testing.T) {
	forSnapshotters(t, func(t *testing.T, s Store, sn Snapshotter) {
		v, err := s.Create("v", 1<<20, 4096)
		require.NoError(t, err)
		want := make([]byte, 4096)
		copy(want, "kept")
		_, err = v.WriteAt(want, 0)
		require.NoError(t, err)
		require.NoError(t, v.Close())
		_, err = sn.Snapshot("v", "s")
		require.NoError(t, err)

		require.ErrorIs(t, sn.DeleteIfNoSnapshots("v"), ErrHasSnapshots)
		for _, open := range []func() (Volume, error){
			func() (Volume, error) { return s.Open("v") },
			func() (Volume, error) { return sn.OpenSnapshot("v", "s") },
		} {
			v, err := open()
			require.NoError(t, err)
			got := make([]byte, 4096)
			_, err = v.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.NoError(t, v.Close())
		}
		require.NoError(t, sn.DeleteSnapshot("v", "s"))
		require.NoError(t, sn.DeleteIfNoSnapshots("v"))
		require.ErrorIs(t, sn.DeleteIfNoSnapshots("v"), ErrNotFound)
	})
}

// forSnapshotters runs f against a fresh store of each backend that takes
// snapshots.
func forSnapshotters(t *testing.T, f func(t *testing.T, s Store, sn Snapshotter)) {
	for _, be := range apiBackends() {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t, t.TempDir())
			defer s.Close()
			sn, ok := s.(Snapshotter)
			if !ok {
				t.Skip("no snapshots")
			}
			f(t, s, sn)
		})
	}
}
