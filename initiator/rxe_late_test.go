//go:build ibverbs

package initiator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
)

// rxeLate is TestReopenLate on the device (TestRXEEndToEnd's
// late-volume): the target cuts the connection (targettest, at its next
// answer), and vol1's store then hangs in the re-open. The session
// reconnects on a new QP without vol1: a write to vol0 succeeds while
// vol1's store still hangs, and a write to vol1 waits, then succeeds
// once the store answers. One reconnect in all. On rxe the reconnect
// tears a real QP down with the late volume's request parked, which
// holds no registration: a window bound meanwhile would hold the QP's
// destroy (transport/emu doc, [9]).
func rxeLate(t *testing.T, p transport.Provider) {
	st := block.NewMemStore()
	defer st.Close()
	for _, name := range []string{"vol0", "vol1"} {
		if _, err := st.Create(name, 4<<20, 4096); err != nil {
			t.Fatal(err)
		}
	}
	cat := &gatedCatalog{Catalog: storecatalog.Catalog{Store: st}, gates: map[string]chan struct{}{},
		opens: map[string]int{}, live: map[string]int{}}
	var cutMu sync.Mutex
	cut := false
	h := targettest.Wrap(p, targettest.Script{Respond: func(*targettest.Response) targettest.Action {
		cutMu.Lock()
		defer cutMu.Unlock()
		if cut {
			cut = false
			return targettest.Disconnect
		}
		return targettest.Pass
	}})
	tgt, err := target.New(target.Config{Name: "rxe-late", Catalog: cat, OpenWait: 300 * time.Millisecond, Logger: rxeLog})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tgt, h.Listen)
	s := dial(t, initiator.Config{Provider: p, Addr: addr, Name: "rxe-late", LossTimeout: 30 * time.Second, Logger: rxeLog})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v0, v1 := openNamed(t, ctx, s, "vol0"), openNamed(t, ctx, s, "vol1")
	release := cat.gate("vol1")
	t.Cleanup(release) // before the target's shutdown: the store must answer
	cutMu.Lock()
	cut = true
	cutMu.Unlock()
	if err := write(v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 across the cut, vol1's store hung: %v", err)
	}
	v1done := make(chan error, 1)
	go func() { v1done <- write(v1, 0, 30*time.Second) }()
	select {
	case err := <-v1done:
		t.Fatalf("write to vol1 ended while its store still hangs: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	release()
	if err := <-v1done; err != nil {
		t.Fatalf("write to vol1 once its store answered: %v", err)
	}
	if err := write(v0, 4096, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 after vol1 came back: %v", err)
	}
	if st := s.Stats(); st.Reconnects != 1 {
		t.Errorf("reconnects %d, want 1", st.Reconnects)
	}
}

// rxeReopenNotReady is TestHostileReopenNotReady on the device
// (TestRXEEndToEnd's late-not-ready): each re-OPEN answered NOT READY
// and the connection cut, so every reconnect tears a real QP down with
// the late volume's write parked, paced by the channel's backoff; the
// write fails at the volume's deadline, and the volume is served again
// once the target behaves.
func rxeReopenNotReady(t *testing.T, p transport.Provider) {
	reopenNotReady(t, func(t *testing.T, script targettest.Script, cfg initiator.Config) (*initiator.Session, *initiator.Volume) {
		st := block.NewMemStore()
		if _, err := st.Create("vol0", 8<<20, 4096); err != nil {
			t.Fatal(err)
		}
		tgt, err := target.New(target.Config{Name: "rxe-not-ready", Catalog: storecatalog.Catalog{Store: st}, Logger: rxeLog})
		if err != nil {
			t.Fatal(err)
		}
		addr := serve(t, tgt, targettest.Wrap(p, script).Listen, st.Close)
		cfg.Provider, cfg.Addr, cfg.Name, cfg.Logger = p, addr, "rxe-not-ready", rxeLog
		return dialVol0(t, cfg)
	})
}
