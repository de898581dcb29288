package initiator_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// gatedCatalog is a store whose OpenVolume of a gated volume hangs until
// its gate closes, as an RBD image's open does while its OSDs are out
// of reach. It counts the volumes open at the store.
type gatedCatalog struct {
	storecatalog.Catalog
	mu    sync.Mutex
	gates map[string]chan struct{}
	opens map[string]int // OpenVolume calls
	live  map[string]int // volumes opened and not closed
}

func (c *gatedCatalog) gate(name string) (release func()) {
	g := make(chan struct{})
	c.mu.Lock()
	c.gates[name] = g
	c.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

func (c *gatedCatalog) OpenVolume(name string) (target.Volume, error) {
	c.mu.Lock()
	c.opens[name]++
	g := c.gates[name]
	c.mu.Unlock()
	if g != nil {
		<-g
	}
	v, err := c.Catalog.OpenVolume(name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.live[name]++
	c.mu.Unlock()
	return &countedVolume{Volume: v, c: c, name: name}, nil
}

func (c *gatedCatalog) counts(name string) (opens, live int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens[name], c.live[name]
}

// countedVolume is a gatedCatalog's volume; its Close counts.
type countedVolume struct {
	target.Volume
	c      *gatedCatalog
	name   string
	closed atomic.Bool
}

func (v *countedVolume) Close() error {
	if v.closed.CompareAndSwap(false, true) {
		v.c.mu.Lock()
		v.c.live[v.name]--
		v.c.mu.Unlock()
	}
	return v.Volume.(interface{ Close() error }).Close()
}

// newGatedRig serves vol0, vol1 and the other volumes named more
// through a gatedCatalog with the target's OpenWait.
func newGatedRig(t *testing.T, openWait time.Duration, more ...string) (*gatedCatalog, *emu.Provider, string, *target.Target) {
	t.Helper()
	p, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st := block.NewMemStore()
	names := []string{"vol0", "vol1"}
	for _, name := range more {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	for _, name := range names {
		v, err := st.Create(name, 4<<20, 4096)
		if err != nil {
			t.Fatal(err)
		}
		v.Close()
	}
	cat := &gatedCatalog{Catalog: storecatalog.Catalog{Store: st}, gates: map[string]chan struct{}{},
		opens: map[string]int{}, live: map[string]int{}}
	tgt, err := target.New(target.Config{Name: "gated", Catalog: cat, OpenWait: openWait})
	if err != nil {
		t.Fatal(err)
	}
	return cat, p, serve(t, tgt, p.Listen, p.Close, st.Close), tgt
}

// newHungVol1 is a newGatedRig (with OpenWait openWait) whose store
// hangs in vol1's open until release, and a session on it with the
// I/O timeout ioTimeout (0: the default).
func newHungVol1(t *testing.T, openWait, ioTimeout time.Duration) (*gatedCatalog, *initiator.Session, func(), *target.Target) {
	t.Helper()
	cat, p, addr, tgt := newGatedRig(t, openWait)
	release := cat.gate("vol1")
	t.Cleanup(release)
	return cat, dial(t, initiator.Config{Provider: p, Addr: addr, Name: "hung-open", IOTimeout: ioTimeout}), release, tgt
}

// within returns what ch gives within 10 s, and fails the test if it
// gives nothing by then (what still waits).
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waits 10 s on", what)
		panic("unreachable")
	}
}

// writeLoop writes vol's first block until stop is closed, and returns
// how many writes failed.
func writeLoop(v *initiator.Volume, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		failed := 0
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				out <- failed
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if _, err := v.WriteAtContext(ctx, buf, 0); err != nil {
				failed++
			}
			cancel()
		}
	}()
	return out
}

// TestOpenHungStore: the store hangs in the open of vol1 while vol0
// takes writes on the same session. An Open of vol1 whose context ends
// fails with that context's error; one with time enough succeeds once
// the store answers, the target having opened vol1 once for all the
// tries. Meanwhile vol0's writes all succeed and the connection is
// never lost. Before, the target answered the OPEN only when the store
// did: past the initiator's IOTimeout the connection was ended, and
// the login that should have replaced it waited for the old
// connection's hung OPEN, so every volume of the session stopped until
// the store answered.
func TestOpenHungStore(t *testing.T) {
	cat, s, release, _ := newHungVol1(t, 500*time.Millisecond, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v0, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	failed := writeLoop(v0, stop)

	// Past the target's OpenWait: it has answered NOT READY once.
	short, cancelShort := context.WithTimeout(ctx, 800*time.Millisecond)
	_, err = s.Open(short, "vol1", initiator.OpenOptions{})
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("Open of a hung volume whose context ended: %v, want ErrNotReady and context.DeadlineExceeded", err)
	}
	t.Logf("Open of a hung volume: %v", err)
	opened := make(chan error, 1)
	var v1 *initiator.Volume
	go func() {
		var err error
		v1, err = s.Open(ctx, "vol1", initiator.OpenOptions{})
		opened <- err
	}()
	// Past the initiator's IOTimeout, and several of the target's waits.
	time.Sleep(3 * time.Second)
	release()
	if err := <-opened; err != nil {
		t.Fatalf("Open of vol1 once its store answered: %v", err)
	}
	close(stop)
	if n := <-failed; n != 0 {
		t.Errorf("%d writes to vol0 failed while vol1's open hung", n)
	}
	if st := s.Stats(); st.ConnectionsLost != 0 || st.Reconnects != 0 {
		t.Errorf("connections lost %d, reconnects %d while vol1's open hung; want none", st.ConnectionsLost, st.Reconnects)
	}
	if opens, live := cat.counts("vol1"); opens != 1 || live != 1 {
		t.Errorf("the store opened vol1 %d times and holds %d open; want 1 and 1 (one open for every try)", opens, live)
	}
	buf := make([]byte, 4096)
	if _, err := v1.WriteAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("write to vol1: %v", err)
	}
}

// TestOpenHungStoreReconnect: with an OpenWait longer than the
// initiator's IOTimeout (a misconfigured target), a hung OPEN does end
// the connection, but the login that replaces it no longer waits for
// the store: vol0's writes go on after one reconnect. Once the store
// answers, the volume the abandoned open got is closed, not leaked.
func TestOpenHungStoreReconnect(t *testing.T) {
	cat, s, release, _ := newHungVol1(t, time.Minute, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v0, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := s.Open(short, "vol1", initiator.OpenOptions{}); err == nil {
		t.Fatal("Open of a hung volume succeeded")
	}
	cancelShort()
	buf := make([]byte, 4096)
	for s.Stats().Reconnects == 0 {
		// Each write must succeed, the one the lost connection held too.
		wctx, c := context.WithTimeout(ctx, 10*time.Second)
		_, err := v0.WriteAtContext(wctx, buf, 0)
		c()
		if err != nil {
			t.Fatalf("write to vol0 with vol1's open hung: %v", err)
		}
	}
	if _, err := v0.WriteAtContext(ctx, buf, 4096); err != nil {
		t.Fatalf("write to vol0 after the reconnect: %v", err)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		opens, live := cat.counts("vol1")
		if opens == 1 && live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store opened vol1 %d times and holds %d open; want the abandoned open closed", opens, live)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOpenHungStoreShutdown: a target shut down while a volume's open
// hangs in its store waits for that open while Shutdown's context
// lasts, since its caller closes the store next, and says it did not
// finish; once the store answers, Shutdown completes and the volume
// the open got is closed.
func TestOpenHungStoreShutdown(t *testing.T) {
	cat, s, release, tgt := newHungVol1(t, 200*time.Millisecond, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, err := s.Open(short, "vol1", initiator.OpenOptions{}); !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("Open of a hung volume: %v, want ErrNotReady", err)
	}
	cancelShort()
	s.Close()
	sctx, cancelS := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelS()
	if err := tgt.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with an open hung in the store: %v, want its context's end", err)
	}
	release()
	if err := tgt.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown once the store answered: %v", err)
	}
	if opens, live := cat.counts("vol1"); opens != 1 || live != 0 {
		t.Errorf("the store opened vol1 %d times and holds %d open after Shutdown; want 1 and 0", opens, live)
	}
}

// TestOpenHungStoreReopen: the connection is lost while both volumes are
// open, and the store then hangs in vol1's open for 2 s. One reconnect,
// the write that was in flight on vol0 succeeds, and vol1 was opened
// twice in all, the first open and one re-open: the connection asks
// again for it on the same connection (late_open.go). Before, every NOT
// READY ended the attempt, and each new connection started another
// open in the store.
func TestOpenHungStoreReopen(t *testing.T) {
	r := newLateRig(t, 300*time.Millisecond, 30*time.Second)
	r.lose(t)
	go func() {
		time.Sleep(2 * time.Second) // several of the target's waits
		r.release()
	}()
	if err := write(r.v0, 0, time.Minute); err != nil {
		t.Fatalf("write to vol0 across the reconnect: %v", err)
	}
	if err := write(r.v1, 0, time.Minute); err != nil {
		t.Fatalf("write to vol1 once its store answered: %v", err)
	}
	if st := r.s.Stats(); st.Reconnects != 1 {
		t.Errorf("reconnects %d, want 1", st.Reconnects)
	}
	if opens, _ := r.cat.counts("vol1"); opens != 2 {
		t.Errorf("the store was asked to open vol1 %d times; want 2 (the open, one re-open)", opens)
	}
}

// TestOpenHungStoreClose: an Open whose context ends before the target
// answers at all (its OpenWait is an hour here) fails with the
// context's error, and Session.Close then returns without waiting for
// the answer nobody reads: the store is still hung when it does. Before,
// Close waited for the abandoned OPEN as for I/O in flight, until the
// target answered or the IOTimeout ran out; srpc export --timeout 3s
// against a gateway whose OSD was stopped exited after 5 s, when srpd
// answered NOT READY.
func TestOpenHungStoreClose(t *testing.T) {
	cat, s, _, _ := newHungVol1(t, time.Hour, time.Minute)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Open(short, "vol1", initiator.OpenOptions{}); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("Open of a volume the target has not answered for: %v, want context.DeadlineExceeded alone", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := within(t, closed, "Close, with an OPEN its caller abandoned (the store hangs, and the IOTimeout is a minute),"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if opens, _ := cat.counts("vol1"); opens != 1 {
		t.Errorf("the store was asked to open vol1 %d times, want 1", opens)
	}
}
