package e2etest

import (
	"fmt"
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
	var grandchild []int
	p.WaitFor(t, 10e9, "sleep", func() bool {
		grandchild = descendants(p.Cmd.Process.Pid)
		return len(grandchild) > 0
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
