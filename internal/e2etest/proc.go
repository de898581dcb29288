package e2etest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/logsink"
)

// Proc is a program running in the background, its stdout and stderr
// collected together.
type Proc struct {
	Cmd     *exec.Cmd
	fuseDir string // the FUSE mount the program serves, if any (ServesFUSE)
	out     logsink.Buffer
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
	// Its own process group, so that Kill ends what it started too; and
	// Wait returns once it has exited even if something it started
	// still holds its output pipe.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.Cmd.WaitDelay = 5 * time.Second
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	live.Store(p, t.Name())
	go func() {
		p.waitErr = p.Cmd.Wait()
		live.Delete(p)
		close(p.exited)
	}()
	t.Cleanup(func() { p.Kill(t) })
}

// killWait bounds how long a killed program may take to be reaped.
const killWait = 20 * time.Second

// Kill sends SIGKILL and waits for the program to be reaped; on one
// already reaped, Kill does nothing. A FUSE server killed while one of
// its threads waits for an answer from its own mount cannot finish
// dying: once the server has read a request, the kernel waits for the
// answer uninterruptibly (request_wait_answer in fs/fuse/dev.c), and the
// answer can only come from the dying process, whose /dev/fuse stays
// open while the thread lives. After killWait, Kill fails the test with
// the kernel stacks of the program's threads, the evidence the cause
// needs, aborts the FUSE connections of srpc mounts under the temporary
// directory and waits once more, so that the test ends instead of
// waiting for go test's timeout.
func (p *Proc) Kill(t testing.TB) {
	p.kill()
	select {
	case <-p.exited:
		return
	case <-time.After(killWait):
	}
	stacks := KernelStacks(p.Cmd.Process.Pid)
	if p.fuseDir != "" {
		AbortFUSE(p.fuseDir)
	}
	select {
	case <-p.exited:
		t.Errorf("%s was not reaped %v after SIGKILL until its FUSE connection (%q) was aborted; its threads' kernel stacks:\n%s",
			filepath.Base(p.Cmd.Path), killWait, p.fuseDir, stacks)
	case <-time.After(killWait):
		t.Errorf("%s was not reaped %v after SIGKILL (FUSE mount: %q); its threads' kernel stacks:\n%s",
			filepath.Base(p.Cmd.Path), killWait, p.fuseDir, stacks)
	}
}

// kill sends SIGKILL to the program's process group.
func (p *Proc) kill() {
	syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	p.Cmd.Process.Kill()
}

// ServesFUSE records that the program serves the FUSE mount at dir, which
// Kill and the watchdog abort if the program cannot finish dying.
func (p *Proc) ServesFUSE(dir string) { p.fuseDir = dir }

// KernelStacks is what each thread of process pid is doing in the kernel
// (/proc/PID/task/TID/stack, readable by root), for a test that gives up
// waiting for it.
func KernelStacks(pid int) string {
	var b strings.Builder
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		comm, _ := os.ReadFile(filepath.Join(task, "comm"))
		st, _ := os.ReadFile(filepath.Join(task, "stat"))
		stack, err := os.ReadFile(filepath.Join(task, "stack"))
		if err != nil {
			stack = []byte(err.Error() + "\n")
		}
		fmt.Fprintf(&b, "%s (%s) %s\n%s", filepath.Base(task), strings.TrimSpace(string(comm)), threadState(string(st)), stack)
	}
	return b.String()
}

// threadState is the state letter of a /proc/PID/task/TID/stat line
// (the field after the command name in parentheses, proc(5)).
func threadState(stat string) string {
	if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return "state " + stat[i+2:i+3]
	}
	return ""
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
		p.Kill(t)
		t.Fatalf("%s: %s still running %v later:\n%s", what, filepath.Base(p.Cmd.Path), timeout, p.Output())
		return nil
	}
}
