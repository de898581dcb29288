package initiator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
)

// lyingVolume is a cacheVolume whose identity (target.Identifier) is
// whatever next says, asked at every open: a hostile or broken target's.
type lyingVolume struct {
	*cacheVolume
	next func() uint64
}

func (v lyingVolume) Identity() uint64 { return v.next() }

// lyingCatalog serves one lyingVolume as vol0.
type lyingCatalog struct {
	cacheCatalog
	v lyingVolume
}

func (c lyingCatalog) OpenVolume(name string) (target.Volume, error) {
	if name != "vol0" {
		return nil, errors.New("no such volume")
	}
	return c.v, nil
}

// TestHostileIdentity: a target whose volume tells another identity at
// every open (changing), or none after the first (zeroed), across a cut
// connection and no restart. The initiator cannot tell such a target from
// a volume replaced under its name, and takes the reading that cannot
// lose data: at the first re-open the Volume fails with ErrVolumeReplaced,
// once, with nothing replayed, no reconnect loop (the re-open is asked for
// once), and the session up; the name opened again is usable. A lie cannot
// make the initiator write to what it believes is another volume.
func TestHostileIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   func(open int64) uint64
	}{
		{"changing", func(open int64) uint64 { return uint64(100 + open) }},
		{"zeroed", func(open int64) uint64 {
			if open == 1 {
				return 7
			}
			return 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 4 << 20
			var opens atomic.Int64
			r := newCrashRigWith(t, size, func(r *crashRig) target.Config {
				r.vol = &cacheVolume{d: r.disk, dirty: map[int64][]byte{}}
				lv := lyingVolume{r.vol, func() uint64 { return tc.id(opens.Add(1)) }}
				return target.Config{Name: "liar", Catalog: lyingCatalog{cacheCatalog{r.vol}, lv}}
			})
			s, v := r.dial(t, initiator.Config{ReplayBuffer: 1 << 20})
			model := make([]byte, size)
			writeModel(t, v, model, 0, 16, 4, 1) // acknowledged, not flushed: in the ring
			asked, before := opens.Load(), s.Stats()
			for _, q := range r.p.QPs() {
				if err := r.p.InjectQPError(q, 0); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := v.WriteAtContext(ctx, make([]byte, 4096), 0); !errors.Is(err, initiator.ErrVolumeReplaced) {
				t.Fatalf("write after the re-open: %v, want ErrVolumeReplaced", err)
			}
			if err := v.Flush(ctx); !errors.Is(err, initiator.ErrVolumeReplaced) {
				t.Fatalf("flush after the re-open: %v, want ErrVolumeReplaced", err)
			}
			st := s.Stats()
			if n := opens.Load() - asked; n != 1 || st.Reconnects-before.Reconnects != 1 || st.ReplayedWrites != 0 {
				t.Fatalf("after the cut: %d opens asked, %d reconnects, %d writes replayed; want 1, 1, 0",
					n, st.Reconnects-before.Reconnects, st.ReplayedWrites)
			}
			if err := v.Close(); err != nil {
				t.Fatalf("close of the failed volume: %v", err)
			}
			nv := openVol0(t, ctx, s)
			if _, err := nv.WriteAt(model[:4096], 0); err != nil {
				t.Fatalf("write to vol0 opened again: %v", err)
			}
			if err := nv.Flush(ctx); err != nil {
				t.Fatalf("flush of vol0 opened again: %v", err)
			}
		})
	}
}
