package e2etest

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// CrashTarget is the srpd of a SIGKILL soak (issue 21): pebble with its
// data directory kept, on one wire, at an address that stays the same
// across restarts so that an initiator can reconnect to it. Start it
// before each iteration, Restart it to crash it, Stop it after.
type CrashTarget struct {
	Srpd, Data, Addr, Wire string
	// D is the running daemon (nil before Start).
	D *Daemon

	volSize string
}

// NewCrashTarget prepares a crash target in dir over wire ("tcp" or
// "shm"), whose default volume vol0 has volSize bytes (e.g. "64MiB").
func NewCrashTarget(t testing.TB, srpd, dir, wire, volSize string) *CrashTarget {
	t.Helper()
	addr := FreeAddr(t)
	if wire == "shm" {
		addr = filepath.Join(dir, "srpd.shm")
	}
	return &CrashTarget{Srpd: srpd, Data: filepath.Join(dir, "data"), Addr: addr, Wire: wire, volSize: volSize}
}

// Start starts srpd and waits until it answers.
func (c *CrashTarget) Start(t testing.TB) {
	t.Helper()
	c.D = StartDaemon(t, c.Srpd, c.Data, c.Addr, "", "--wire", c.Wire, "--default-volume-size", c.volSize)
}

// Restart SIGKILLs srpd, leaves it down for pause and starts it again.
func (c *CrashTarget) Restart(t testing.TB, pause time.Duration) {
	t.Helper()
	c.D.Kill(t)
	time.Sleep(pause)
	c.Start(t)
}

// Stop sends SIGTERM and fails the test unless srpd exits 0.
func (c *CrashTarget) Stop(t testing.TB) {
	t.Helper()
	if code := c.D.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, c.D.Log())
	}
}

// WaitWritten waits until srpd has written at least n bytes to vol, and
// reports false if p exited first; it fails the test after 60 s.
func (c *CrashTarget) WaitWritten(t testing.TB, vol string, n uint64, p *Proc) bool {
	t.Helper()
	return p.WaitFor(t, 60*time.Second, fmt.Sprintf("%d bytes written to %s", n, vol), func() bool {
		return VolumeStats(t, c.Srpd, c.Data, vol).Write.Bytes >= n
	})
}
