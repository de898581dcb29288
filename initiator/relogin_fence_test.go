package initiator_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
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
//
// In T10 SRP the write goes over the second of two channels, whose
// login (MULTI) names no connection it replaces: it waits for the first
// channel to log in again with SINGLE, which srpd answers once the
// nexus's older channels are done (srpFence). Without that wait the
// second channel logged in again at once and the run failed as above.
func TestReloginWaitsForOldWrites(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     initiator.Config
		tcfg    target.Config
		vol     string
		channel int // the channel the write goes over
		lost    int // connections lost: the one cut, and in SRP the first channel's
	}{
		{"gosrp", initiator.Config{}, target.Config{}, "vol0", 0, 1},
		{"srp", initiator.Config{Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Channels: 2}, target.Config{SRPTargetPortID: srpPort}, "lun0", 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { reloginWaitsForOldWrites(t, tc.cfg, tc.tcfg, tc.vol, tc.channel, tc.lost) })
	}
}

func reloginWaitsForOldWrites(t *testing.T, cfg initiator.Config, tcfg target.Config, vol string, channel, lost int) {
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
		tcfg.Name, tcfg.Catalog = "test-target", holdCatalog{storecatalog.Catalog{Store: st}, hold}
		tgt, err := target.New(tcfg)
		if err != nil {
			t.Fatal(err)
		}
		addr := serve(t, tgt, p.Listen, p.Close, st.Close)
		cfg.Provider, cfg.Addr, cfg.Name = p, addr, "test-initiator"
		s := dial(t, cfg)
		v := openNamed(t, context.Background(), s, vol)

		old, newer := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
		done := make(chan error, 2)
		qp := initiator.PinChannel(s, channel)
		go func() {
			_, err := v.WriteAt(old, 0)
			done <- err
			if err == nil {
				_, err = v.WriteAt(newer, 0)
			}
			done <- err
		}()
		<-hold.entered
		if err := p.CutLink(qp); err != nil {
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
		if st := s.Stats(); st.ConnectionsLost != uint64(lost) {
			t.Errorf("%d connections lost, want %d", st.ConnectionsLost, lost)
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

// TestSRPFenceAcrossCrash: in an SRP session of two channels the second
// loses its connection while the target refuses every SINGLE login, so
// the second waits at the fence with a write queued and the first
// cannot log the nexus in again. The target then dies (kill -9: its
// connections and cache gone) and a new process comes up at the
// address. Its first SINGLE login has no older channel to end; the
// fence must open on it, and the queued write complete on the new
// process within moments, not at the loss deadline, read back, and be
// durable after a flush with what was flushed before the crash.
func TestSRPFenceAcrossCrash(t *testing.T) {
	const size = 8 << 20
	var refuse atomic.Bool
	var refused atomic.Int32
	r := newCrashRig(t, size)
	script := refuseSINGLE(&refuse, &refused)
	r.script = &script
	r.crash()
	r.start() // the process the script serves
	s, v, model := r.flushedSRP(t, initiator.Config{Channels: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	refuse.Store(true)
	if err := r.p.CutLink(initiator.PinChannel(s, 1)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	pattern(buf, 100, 2, 5)
	done := make(chan error, 1)
	go func() {
		_, err := v.WriteAtContext(ctx, buf, 100*4096) // on channel 1 (PinChannel)
		done <- err
	}()
	waitUntil(t, "a SINGLE login refused", func() bool { return refused.Load() > 0 })
	select {
	case err := <-done:
		t.Fatalf("the write on the channel waiting at the fence returned (%v) while no SINGLE login could be made", err)
	default:
	}

	r.crash()
	refuse.Store(false)
	start := time.Now()
	r.start()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the write queued at the fence, after the target's restart: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the write queued at the fence has not completed %v after the target's restart (loss deadline 20 s)", time.Since(start).Round(time.Millisecond))
	}
	t.Logf("the write completed %v after the restart; %d SINGLE logins refused before it", time.Since(start).Round(time.Millisecond), refused.Load())
	copy(model[100*4096:], buf)
	got := make([]byte, 4096)
	if _, err := v.ReadAtContext(ctx, got, 100*4096); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("block 100 after the restart: %v, equal %t", err, bytes.Equal(got, buf))
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush after the restart: %v", err)
	}
	r.checkFlushed(t, v, model) // what was flushed before the crash, and the write after it
}
