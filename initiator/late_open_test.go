package initiator_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// lateRig is a session on a newGatedRig (its OpenWait openWait) with
// vol0 and the volumes named hung open (vol1 if none), its LossTimeout
// loss, and the means to lose its connection. From then on the store
// hangs in each hung volume's opens until its release; v1 and release
// are the first's.
type lateRig struct {
	cat      *gatedCatalog
	p        *emu.Provider
	s        *initiator.Session
	v0, v1   *initiator.Volume
	release  func()
	hung     []*initiator.Volume
	releases []func()
}

func newLateRig(t *testing.T, openWait, loss time.Duration, hung ...string) *lateRig {
	t.Helper()
	if len(hung) == 0 {
		hung = []string{"vol1"}
	}
	cat, p, addr, _ := newGatedRig(t, openWait, hung...)
	r := &lateRig{cat: cat, p: p, s: dial(t, initiator.Config{Provider: p, Addr: addr, Name: "late", LossTimeout: loss})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if r.v0, err = r.s.Open(ctx, "vol0", initiator.OpenOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range hung {
		v, err := r.s.Open(ctx, name, initiator.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		release := cat.gate(name)
		t.Cleanup(release)
		r.hung, r.releases = append(r.hung, v), append(r.releases, release)
	}
	r.v1, r.release = r.hung[0], r.releases[0]
	return r
}

// lose forces every QP to error: the session reconnects.
func (r *lateRig) lose(t *testing.T) {
	t.Helper()
	for _, q := range r.p.QPs() {
		if err := r.p.InjectQPError(q, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// write writes one block of v at off within d.
func write(v *initiator.Volume, off int64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := v.WriteAtContext(ctx, make([]byte, 4096), off)
	return err
}

// TestReopenLate: the connection is lost, and the store then hangs in
// vol1's re-open. The session reconnects without vol1: a write to vol0
// across the loss succeeds while vol1's store still hangs, and a write
// to vol1 waits, taking no credit, until the store answers, then
// succeeds. One reconnect, and vol1 opened twice in all (the target's
// late open serves every re-try). Before, the reconnect waited for
// vol1, and the write to vol0 with it, until the store answered.
func TestReopenLate(t *testing.T) {
	r := newLateRig(t, 300*time.Millisecond, 30*time.Second)
	r.lose(t)
	v1done := make(chan error, 1)
	go func() { v1done <- write(r.v1, 0, 30*time.Second) }()
	if err := write(r.v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 across the loss, vol1's store hung: %v", err)
	}
	select {
	case err := <-v1done:
		t.Fatalf("write to vol1 ended while its store still hangs: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	r.release()
	if err := <-v1done; err != nil {
		t.Fatalf("write to vol1 once its store answered: %v", err)
	}
	if st := r.s.Stats(); st.Reconnects != 1 {
		t.Errorf("reconnects %d, want 1", st.Reconnects)
	}
	if opens, live := r.cat.counts("vol1"); opens != 2 || live != 1 {
		t.Errorf("the store opened vol1 %d times and holds %d open; want 2 and 1", opens, live)
	}
}

// TestReopenLateExpired: vol1's store hangs past the loss deadline
// (LossTimeout 3 s). vol1's waiting write then fails with
// ErrConnectionLost and ErrNotReady, as it would have had the
// connection not come back, and its next write fails at once; vol0 is
// served throughout. Once the store answers, vol1 is served again on
// the same connection. Before, the session's every volume failed at
// the deadline.
func TestReopenLateExpired(t *testing.T) {
	r := newLateRig(t, 300*time.Millisecond, 3*time.Second)
	r.lose(t)
	err := write(r.v1, 0, 30*time.Second)
	if !errors.Is(err, initiator.ErrConnectionLost) || !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("write to vol1 past the loss deadline, its store hung: %v, want ErrConnectionLost and ErrNotReady", err)
	}
	t.Logf("vol1: %v", err)
	if err := write(r.v1, 0, 30*time.Second); !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("the next write to vol1: %v, want ErrNotReady", err)
	}
	if err := write(r.v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 past the deadline: %v", err)
	}
	r.release()
	waitUntil(t, "vol1 served again", func() bool { return write(r.v1, 0, 10*time.Second) == nil })
	if st := r.s.Stats(); st.Reconnects != 1 {
		t.Errorf("reconnects %d, want 1", st.Reconnects)
	}
}

// TestReopenDeleted: vol1 is deleted while the connection is down. The
// session reconnects without it and serves vol0; vol1's writes fail
// with ErrNotReady once the loss deadline has passed. Before, every
// reconnect failed on vol1's refused re-open, so the session never
// came back and vol0 failed too.
func TestReopenDeleted(t *testing.T) {
	r := newLateRig(t, 300*time.Millisecond, 3*time.Second)
	r.lose(t)
	v0done := make(chan error, 1)
	go func() { v0done <- write(r.v0, 0, 10*time.Second) }() // finds the loss
	waitUntil(t, "vol1's re-open in the store", func() bool { opens, _ := r.cat.counts("vol1"); return opens == 2 })
	waitUntil(t, "vol1 deleted", func() bool { return r.cat.Store.Delete("vol1") == nil })
	r.release()
	if err := <-v0done; err != nil {
		t.Fatalf("write to vol0 across the loss, vol1 deleted: %v", err)
	}
	if err := write(r.v1, 0, 30*time.Second); !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("write to the deleted vol1: %v, want ErrNotReady", err)
	}
	if err := write(r.v0, 4096, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 past the deadline: %v", err)
	}
}

// waitUntil polls cond every 10 ms for up to 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestReopenLateClose: Session.Close while vol1 is late, a write to it
// parked. The write fails with ErrClosed and Close returns while the
// store still hangs: it does not wait, as for I/O in flight, for a
// re-open nobody will use.
func TestReopenLateClose(t *testing.T) {
	r := newLateRig(t, 300*time.Millisecond, time.Minute)
	r.lose(t)
	v1done := make(chan error, 1)
	go func() { v1done <- write(r.v1, 0, time.Minute) }()
	if err := write(r.v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 across the loss: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.s.Close() }()
	if err := within(t, v1done, "vol1's parked write, after Close,"); !errors.Is(err, initiator.ErrClosed) {
		t.Fatalf("vol1's parked write at Close: %v, want ErrClosed", err)
	}
	if err := within(t, closed, "Close, with a late volume's re-open (the store hangs),"); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestReopenLateMany: three volumes' stores hang across a reconnect
// whose loss deadline (5 s) is shorter than three of the target's
// OpenWaits (2 s). The connection comes up after the first NOT READY,
// the others asked for all at once: vol0's write across the loss
// succeeds while they hang, and each hung volume's write succeeds once
// its store answers. Before, the re-opens ran one after another, three
// OpenWaits, and the connect failed at the deadline, taking vol0 with
// it.
func TestReopenLateMany(t *testing.T) {
	r := newLateRig(t, 2*time.Second, 5*time.Second, "vol1", "vol2", "vol3")
	r.lose(t)
	if err := write(r.v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to vol0 across the loss, three stores hung: %v", err)
	}
	for i, v := range r.hung {
		done := make(chan error, 1)
		go func() { done <- write(v, 0, 30*time.Second) }()
		r.releases[i]()
		if err := within(t, done, v.Name()+"'s write once its store answered"); err != nil {
			t.Fatalf("write to %s once its store answered: %v", v.Name(), err)
		}
	}
}

// twoDiskCatalog is one crash-rig target process's catalog: vol0 over
// disk0 and vol1 over disk1, each through a cache of the process's own
// (cacheVolume); vol1's opens wait for gate when it is set.
type twoDiskCatalog struct {
	vols map[string]*cacheVolume
	gate <-chan struct{}
}

func (c *twoDiskCatalog) List() ([]target.VolumeInfo, error) {
	var l []target.VolumeInfo
	for _, name := range []string{"vol0", "vol1"} {
		v := c.vols[name]
		l = append(l, target.VolumeInfo{Name: name, Size: v.Size(), BlockSize: v.BlockSize()})
	}
	return l, nil
}

func (c *twoDiskCatalog) OpenVolume(name string) (target.Volume, error) {
	v, ok := c.vols[name]
	if !ok {
		return nil, errors.New("no such volume")
	}
	if name == "vol1" && c.gate != nil {
		<-c.gate
	}
	return v, nil
}

// TestReopenLateReplay: the target crashes holding acknowledged,
// unflushed writes to vol1 and then vol0, and its next process's store
// hangs in vol1's open. The replay round re-issues vol1's writes first
// and waits for vol1 (they must land before anything newer), so:
//   - if the store answers within the loss deadline, vol1 re-opens late
//     on the connection, its writes are replayed, and both volumes'
//     flushes make every acknowledged write durable, with no loss;
//   - if it does not, vol1's replay fails at the deadline, which reports
//     vol1's loss (its next flush fails with ErrWriteCacheLost) and lets
//     the round go on: vol0's writes are replayed and made durable.
func TestReopenLateReplay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		loss    time.Duration
		answers bool
	}{
		{"the store answers within the deadline", 20 * time.Second, true},
		{"the store answers past the deadline", 3 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 1 << 20
			disk1 := &durableDisk{data: make([]byte, size), bs: 4096}
			var gate chan struct{}
			r := newCrashRigWith(t, size, func(r *crashRig) target.Config {
				cache := func(d *durableDisk) *cacheVolume { return &cacheVolume{d: d, dirty: map[int64][]byte{}} }
				return target.Config{Name: "crashy", OpenWait: 300 * time.Millisecond,
					Catalog: &twoDiskCatalog{vols: map[string]*cacheVolume{"vol0": cache(r.disk), "vol1": cache(disk1)}, gate: gate}}
			})
			s, v0 := dialVol0(t, initiator.Config{Provider: r.p, Addr: r.addr, Name: "late-replay", ReplayBuffer: 4 << 20,
				IOTimeout: 2 * time.Second, ConnectTimeout: 2 * time.Second, LossTimeout: tc.loss})
			ctx := context.Background()
			v1, err := s.Open(ctx, "vol1", initiator.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			model0, model1 := make([]byte, size), make([]byte, size)
			writeModel(t, v1, model1, 0, 32, 4, 1)
			writeModel(t, v0, model0, 0, 32, 4, 1)

			gate = make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(release)
			r.crash()
			r.start()
			if tc.answers {
				time.AfterFunc(time.Second, release)
			}

			if err := v0.Flush(ctx); err != nil {
				t.Fatalf("flush of vol0 after the restart: %v", err)
			}
			durable := func(d *durableDisk) []byte {
				d.mu.Lock()
				defer d.mu.Unlock()
				return append([]byte(nil), d.data...)
			}
			checkModel(t, "vol0's durable contents", durable(r.disk), model0)
			if tc.answers {
				if err := v1.Flush(ctx); err != nil {
					t.Fatalf("flush of vol1 once its store answered: %v", err)
				}
				checkModel(t, "vol1's durable contents", durable(disk1), model1)
				if st := s.Stats(); st.WriteCacheLost != 0 || st.ReplayedWrites == 0 {
					t.Fatalf("%d losses, %d writes replayed; want none lost and some replayed", st.WriteCacheLost, st.ReplayedWrites)
				}
				return
			}
			release()
			var ferr error
			waitUntil(t, "vol1's flush to report its loss", func() bool {
				ferr = v1.Flush(ctx)
				return errors.Is(ferr, initiator.ErrWriteCacheLost)
			})
			if st := s.Stats(); st.WriteCacheLost != 1 {
				t.Fatalf("%d losses, want 1 (vol1's)", st.WriteCacheLost)
			}
		})
	}
}

// TestReopenLateLostAgain: vol1's store hangs in its re-open, and the
// connection is lost again and again, each time before the loss
// deadline (LossTimeout 3 s). vol1's waiting write must still fail at
// that deadline, counted from the first loss: each new connection once
// gave it a fresh one, and a link that flapped faster than LossTimeout
// held it for as long as it flapped.
func TestReopenLateLostAgain(t *testing.T) {
	const loss = 3 * time.Second
	r := newLateRig(t, 300*time.Millisecond, loss)
	r.lose(t)
	done := make(chan error, 1)
	go func() { done <- write(r.v1, 0, time.Minute) }()
	flaps := 0
	tick := time.NewTicker(700 * time.Millisecond)
	defer tick.Stop()
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-tick.C:
			r.lose(t)
			flaps++
		}
	}
	if !errors.Is(err, initiator.ErrNotReady) {
		t.Fatalf("write to vol1, its store hung and the link flapping: %v, want ErrNotReady", err)
	}
	if most := int(2 * loss / (700 * time.Millisecond)); flaps > most {
		t.Fatalf("the write waited through %d losses, more than %d: the deadline was renewed", flaps, most)
	}
	t.Logf("vol1: %v, after %d more losses", err, flaps)
}
