package e2etest

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a program running in the background, its stdout and stderr
// collected together.
type Proc struct {
	Cmd     *exec.Cmd
	out     syncBuffer
	exited  chan struct{}
	waitErr error
}

// StartProc starts bin with args; the test's cleanup kills it if it is
// still running.
func StartProc(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.start(t)
	return p
}

// StartPiped is StartProc with the program's stdin a pipe the test
// writes to; the cleanup closes it and gives the program 30 s to finish
// before it kills it.
func StartPiped(t testing.TB, bin string, args ...string) (*Proc, io.WriteCloser) {
	t.Helper()
	p := &Proc{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	stdin, err := p.Cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.start(t)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
		}
	})
	return p, stdin
}

func (p *Proc) start(t testing.TB) {
	t.Helper()
	p.Cmd.Stdout, p.Cmd.Stderr = &p.out, &p.out
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.Cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
}

// kill sends SIGKILL and waits; on a process already reaped, Kill only
// returns os.ErrProcessDone.
func (p *Proc) kill() {
	p.Cmd.Process.Kill()
	<-p.exited
}

// Output is what the program has written so far.
func (p *Proc) Output() string { return p.out.String() }

// Exited is closed when the program has exited; Err then says how.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is what exec.Cmd.Wait returned; call it once Exited is closed.
func (p *Proc) Err() error { return p.waitErr }

// Stop sends SIGTERM and returns the exit code; it fails the test if the
// program is still running 60 s later.
func (p *Proc) Stop(t testing.TB) int {
	t.Helper()
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not exit 60s after SIGTERM\n%s", filepath.Base(p.Cmd.Path), p.Output())
	}
	return p.ExitCode()
}

// ExitCode is the program's exit code, -1 if a signal ended it; call it
// once Exited is closed.
func (p *Proc) ExitCode() int { return p.Cmd.ProcessState.ExitCode() }

// WaitFor polls ready every 20 ms until it holds, and reports false if
// the program exits first; it fails the test, naming what it waited
// for, once within has passed.
func (p *Proc) WaitFor(t testing.TB, within time.Duration, what string, ready func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s after %v:\n%s", filepath.Base(p.Cmd.Path), what, within, p.Output())
		}
		select {
		case <-p.exited:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// WaitOutput waits until the program has written want, and fails the
// test if it exits first or within passes.
func (p *Proc) WaitOutput(t testing.TB, want string, within time.Duration) {
	t.Helper()
	if !p.WaitFor(t, within, fmt.Sprintf("%q in its output", want), func() bool { return strings.Contains(p.Output(), want) }) {
		t.Fatalf("%s exited (%v) before it wrote %q:\n%s", filepath.Base(p.Cmd.Path), p.waitErr, want, p.Output())
	}
}

// Wait waits for the program to exit and returns Err; after timeout it
// kills the program and fails the test, the message starting with what.
func (p *Proc) Wait(t testing.TB, timeout time.Duration, what string) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		p.kill()
		t.Fatalf("%s: %s still running %v later:\n%s", what, filepath.Base(p.Cmd.Path), timeout, p.Output())
		return nil
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
