package emu

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestShmListenAfterKill: a target process killed with SIGKILL leaves its
// listening socket behind. A new listener on the same path must replace
// it, while a listener whose owner is alive must be left alone, with an
// error that says so.
func TestShmListenAfterKill(t *testing.T) {
	sock, cmd := startChild(t, "hang") // listens on sock, waits in Accept
	p, err := New(Config{Wire: WireShm})
	if err != nil {
		t.Fatal(err)
	}
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
	p, err := New(Config{Wire: WireShm})
	if err != nil {
		t.Fatal(err)
	}
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
