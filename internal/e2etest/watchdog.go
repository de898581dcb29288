package e2etest

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// watchdogMargin is how long before go test's -timeout the watchdog
// reports and ends the test binary.
const watchdogMargin = time.Minute

// live are the programs the tests started and that have not exited, with
// the name of the test that started each.
var live sync.Map // *Proc → string

// startWatchdog arms the watchdog Main runs the tests under. When a test
// waits for a program that never finishes, go test's -timeout ends the
// binary with a dump of its own goroutines: it shows the test waiting,
// never why the program does not finish, and a CI log's tail shows only
// the last goroutines. A minute before that, the watchdog prints the
// stacks of the waiting tests, then each program the tests started
// (and their children) with its threads' kernel stacks, kills them,
// aborts the FUSE connections they serve and exits with status 2.
func startWatchdog() (stop func()) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return func() {}
	}
	d, ok := g.Get().(time.Duration)
	if !ok || d <= 2*watchdogMargin {
		return func() {}
	}
	timer := time.AfterFunc(d-watchdogMargin, func() {
		watchdogReport(os.Stderr, d-watchdogMargin)
		live.Range(func(k, _ any) bool {
			p := k.(*Proc)
			p.kill()
			if p.fuseDir != "" {
				AbortFUSE(p.fuseDir)
			}
			return true
		})
		os.Exit(2)
	})
	return func() { timer.Stop() }
}

func watchdogReport(w io.Writer, after time.Duration) {
	fmt.Fprintf(w, "e2etest watchdog: tests still running after %v, %v before go test's -timeout\n", after, watchdogMargin)
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("_test.go:")) {
			fmt.Fprintf(w, "%s\n\n", g)
		}
	}
	live.Range(func(k, v any) bool {
		p := k.(*Proc)
		fmt.Fprintf(w, "--- %s started %s (pid %d), still running:\n", v, strings.Join(p.Cmd.Args, " "), p.Cmd.Process.Pid)
		return true
	})
	me := os.Getpid()
	for _, pid := range descendants(me) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		fmt.Fprintf(w, "--- pid %d: %s\n%s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "), KernelStacks(pid))
	}
}

// descendants lists the processes below pid (children first, then
// theirs), from the parent field of /proc/PID/stat (proc(5)).
func descendants(pid int) []int {
	parent := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		p, err1 := strconv.Atoi(filepath.Base(filepath.Dir(st)))
		pp, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil {
			parent[p] = pp
		}
	}
	var out []int
	for next := []int{pid}; len(next) > 0; {
		var more []int
		for p, pp := range parent {
			for _, n := range next {
				if pp == n {
					more = append(more, p)
				}
			}
		}
		out = append(out, more...)
		next = more
	}
	return out
}
