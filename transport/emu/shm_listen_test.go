package emu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
)

// TestShmListenAfterKill: a target process killed with SIGKILL leaves its
// listening socket behind. A new listener on the same path must replace
// it, while a listener whose owner is alive must be left alone, with an
// error that says so.
func TestShmListenAfterKill(t *testing.T) {
	sock, cmd := startChild(t, "hang") // listens on sock, waits in Accept
	p := newNIC(t, Config{Wire: WireShm})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if l, err := p.Listen(ctx, sock); err == nil || !errors.Is(err, transport.ErrBusy) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("listen on a live listener's socket: %v, want ErrBusy", err)
	}
	if c, err := net.Dial("unixpacket", sock); err != nil {
		t.Fatalf("the live listener's socket no longer answers: %v", err)
	} else {
		c.Close()
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("no socket left behind by the killed process: %v", err)
	}
	l, err := p.Listen(ctx, sock)
	if err != nil {
		t.Fatalf("listen after the previous owner was killed: %v", err)
	}
	defer l.Close()
	c, s, err := connectVia(t, ctx, p, l)
	if err != nil {
		t.Fatalf("connect to the new listener: %v", err)
	}
	c.Disconnect()
	s.Disconnect()
}

// TestShmListenNotASocket: a path that exists and is not a socket is
// never removed to make room for one.
func TestShmListenNotASocket(t *testing.T) {
	p := newNIC(t, Config{Wire: WireShm})
	defer p.Close()
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := p.Listen(context.Background(), path); err == nil || !errors.Is(err, transport.ErrBusy) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("listen on a regular file: %v, want ErrBusy", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Fatalf("the file was touched: %q, %v", b, err)
	}
}

// staleSocket leaves at path what a SIGKILLed listener leaves: a socket
// file nobody listens on.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
}

// TestShmListenRace: targets started at once on a path a killed one left
// behind (a supervisor's restart and an operator's, say). Exactly one may
// get the path, and the path must lead to it: before the path had an owner
// (its lock), each found the stale socket, removed whatever was at the
// path and bound its own, so a later one removed an earlier one's live
// socket, and a loser closing removed the winner's.
func TestShmListenRace(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for round := range 40 {
		path := filepath.Join(dir, fmt.Sprintf("srpd-%d.shm", round))
		staleSocket(t, path)
		const n = 6
		provs := make([]*Provider, n)
		for i := range provs {
			p := newNIC(t, Config{Wire: WireShm})
			defer p.Close()
			provs[i] = p
		}
		lns := make([]transport.Listener, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				lns[i], errs[i] = provs[i].Listen(ctx, path)
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			switch {
			case errs[i] == nil && winner >= 0:
				t.Fatalf("round %d: listeners %d and %d both got %s", round, winner, i, path)
			case errs[i] == nil:
				winner = i
			case !errors.Is(errs[i], transport.ErrBusy):
				t.Fatalf("round %d: listener %d: %v, want ErrBusy", round, i, errs[i])
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no listener got %s: %v", round, path, errs)
		}
		c, s, err := connectVia(t, ctx, provs[winner], lns[winner])
		if err != nil {
			t.Fatalf("round %d: connect to the winner: %v", round, err)
		}
		c.Disconnect()
		s.Disconnect()
		lns[winner].Close()
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: the winner's socket outlived its Close: %v", round, err)
		}
	}
}

// TestShmCloseSparesReplacement: a listener whose path now names another
// socket (removed and bound again by a program that takes no lock) leaves
// that socket alone when it closes.
func TestShmCloseSparesReplacement(t *testing.T) {
	path := filepath.Join(t.TempDir(), "srpd.shm")
	p := newNIC(t, Config{Wire: WireShm})
	defer p.Close()
	l, err := p.Listen(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l.Close()
	c, err := net.Dial("unixpacket", path)
	if err != nil {
		t.Fatalf("the replacement's socket is gone after the first listener closed: %v", err)
	}
	c.Close()
}

// TestShmListenLockHeld: whoever holds a path's lock owns the path, even
// with nothing listening there (a hostile local user, or a target still
// starting): Listen refuses with ErrBusy and a message naming the lock,
// and the socket at the path is left alone.
func TestShmListenLockHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "srpd.shm")
	staleSocket(t, path)
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	p := newNIC(t, Config{Wire: WireShm})
	defer p.Close()
	l, err := p.Listen(context.Background(), path)
	if err == nil {
		l.Close()
		t.Fatal("listened on a path whose lock another holds")
	}
	if !errors.Is(err, transport.ErrBusy) || !strings.Contains(err.Error(), path+".lock") {
		t.Fatalf("listen with the lock held elsewhere: %v, want ErrBusy naming %s.lock", err, path)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the socket at the path was touched: %v", err)
	}
	// Once the holder lets go, the stale socket is replaced.
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	l, err = p.Listen(context.Background(), path)
	if err != nil {
		t.Fatalf("listen once the lock is free: %v", err)
	}
	l.Close()
}

// TestShmLockFileRemoved: a listener that closes leaves neither its
// socket nor its lock file behind, and one that opened the old lock file
// before the removal gains nothing by locking it: the next Listen locks
// the file at the path.
func TestShmLockFileRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "srpd.shm")
	p := newNIC(t, Config{Wire: WireShm})
	defer p.Close()
	l, err := p.Listen(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	late, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	l.Close()
	for _, name := range []string{path, path + ".lock"} {
		if _, err := os.Lstat(name); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s outlived the listener's Close: %v", name, err)
		}
	}
	if err := unix.Flock(int(late.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("lock the removed file: %v", err)
	}
	l, err = p.Listen(context.Background(), path)
	if err != nil {
		t.Fatalf("listen beside a lock on a removed file: %v", err)
	}
	defer l.Close()
	if _, err := p.Listen(context.Background(), path); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("second listen: %v, want ErrBusy", err)
	}
}

// TestShmListenCloseChurn: listeners that come and go on one path, four
// at a time, are never two at once. Each Close removes the lock file, so a
// contender may lock a file that is no longer the path's; counting that
// lock would let a third, locking the new file, listen beside it.
func TestShmListenCloseChurn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "srpd.shm")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var owners, wins atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		p := newNIC(t, Config{Wire: WireShm})
		defer p.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				l, err := p.Listen(ctx, path)
				if errors.Is(err, transport.ErrBusy) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				wins.Add(1)
				if n := owners.Add(1); n != 1 {
					errs <- fmt.Errorf("%d listeners own %s at once", n, path)
				}
				owners.Add(-1)
				l.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if wins.Load() == 0 {
		t.Fatal("no listener ever got the path")
	}
	t.Logf("%d listens won", wins.Load())
}
