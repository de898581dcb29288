package e2etest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWatchdogReport: the report names the waiting test's goroutine, each
// program a test started with the test's name, and every process below
// the test binary, a grandchild too, with its threads' states.
func TestWatchdogReport(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("needs sh")
	}
	p := StartProc(t, "sh", "-c", "sleep 60 & wait")
	// The grandchild is there from the fork, but reads as sleep only
	// once its exec is done, which on a cold page cache takes a while
	// (CI saw it report "sh -c sleep 60 & wait", in state D in execve).
	var grandchild []int
	p.WaitFor(t, 10e9, "sleep", func() bool {
		grandchild = descendants(p.Cmd.Process.Pid)
		if len(grandchild) == 0 {
			return false
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", grandchild[0]))
		return string(cmdline) == "sleep\x0060\x00"
	})
	var b strings.Builder
	watchdogReport(&b, 0)
	report := b.String()
	for _, want := range []string{
		"TestWatchdogReport",
		fmt.Sprintf("--- TestWatchdogReport started sh -c sleep 60 & wait (pid %d), still running", p.Cmd.Process.Pid),
		fmt.Sprintf("--- pid %d: sleep 60\n", grandchild[0]),
		"state S",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}
