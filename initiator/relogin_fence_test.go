package initiator_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestReloginWaitsForOldWrites: a write the target has handed to its
// store when the connection dies may still land. The channel's next
// login is answered only once it has (target.reinstate), so the
// initiator's re-issue of that write, and any newer write over the same
// blocks, come after it. The store holds the first write until the test
// lets it go, and the link is cut meanwhile. Five seconds later on
// synctest's clock, with everything waiting, neither the write nor a
// newer one has returned; let go, both return, and the block holds the
// newer data. Without reinstate's wait both returned at once, and the
// dead connection's write then landed over the newer data.
func TestReloginWaitsForOldWrites(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		p, err := emu.New(emu.Config{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		st := block.NewMemStore()
		if _, err := st.Create("vol0", 1<<20, 4096); err != nil {
			t.Fatal(err)
		}
		hold := &firstWriteHold{entered: make(chan struct{}), release: make(chan struct{})}
		tgt, err := target.New(target.Config{Name: "test-target", Catalog: holdCatalog{storecatalog.Catalog{Store: st}, hold}})
		if err != nil {
			t.Fatal(err)
		}
		addr := serve(t, tgt, p.Listen, p.Close, st.Close)
		s := dial(t, initiator.Config{Provider: p, Addr: addr, Name: "test-initiator"})
		v := openVol0(t, context.Background(), s)

		old, newer := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
		done := make(chan error, 2)
		go func() {
			_, err := v.WriteAt(old, 0)
			done <- err
			if err == nil {
				_, err = v.WriteAt(newer, 0)
			}
			done <- err
		}()
		<-hold.entered
		if err := p.CutLink(p.QPs()[0]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("a write returned (err %v) while the dead connection's copy of it was still in the store", err)
		default:
		}
		close(hold.release)
		for range 2 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		got := make([]byte, 4096)
		if _, err := v.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, newer) {
			t.Fatalf("block 0 holds %#x..., want the newer write's %#x...", got[0], newer[0])
		}
		if st := s.Stats(); st.ConnectionsLost != 1 {
			t.Errorf("%d connections lost, want the one cut", st.ConnectionsLost)
		}
	})
}

// firstWriteHold holds the first write a volume is given until release
// is closed, and says when it has it.
type firstWriteHold struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *firstWriteHold) wait() {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		<-h.release
	}
}

// holdCatalog serves its catalog's volumes through hold.
type holdCatalog struct {
	target.Catalog
	hold *firstWriteHold
}

func (c holdCatalog) OpenVolume(name string) (target.Volume, error) {
	v, err := c.Catalog.OpenVolume(name)
	if err != nil {
		return nil, err
	}
	return holdVolume{v, c.hold}, nil
}

type holdVolume struct {
	target.Volume
	hold *firstWriteHold
}

func (v holdVolume) WriteAt(p []byte, off int64) (int, error) {
	v.hold.wait()
	return v.Volume.WriteAt(p, off)
}

func (v holdVolume) WriteAtFUA(p []byte, off int64) (int, error) {
	v.hold.wait()
	return v.Volume.WriteAtFUA(p, off)
}
