package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// unitFile is the systemd unit the README tells operators to install.
const unitFile = "../../contrib/srpd.service"

// unitValues returns the values of key in the unit, in order, ignoring
// comments.
func unitValues(t *testing.T, key string) []string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestSystemdUnit: the unit reads the config file its comment names, that
// file puts the data directory where the sandbox lets srpd write, and the
// sandbox scores at most 3 (30 on systemd-analyze's 0..100 scale) in
// 'systemd-analyze security' where that tool exists.
func TestSystemdUnit(t *testing.T) {
	exec0 := unitValues(t, "ExecStart")
	if len(exec0) != 1 || !strings.Contains(exec0[0], " --config /etc/srpd/srpd.toml") {
		t.Errorf("ExecStart %q does not read /etc/srpd/srpd.toml", exec0)
	}
	cfg, err := loadConfig("../../contrib/srpd.toml")
	if err != nil {
		t.Fatal(err)
	}
	if rw := unitValues(t, "ReadWritePaths"); len(rw) != 1 || rw[0] != cfg.Data {
		t.Errorf("ReadWritePaths %q, but contrib/srpd.toml has data = %q", rw, cfg.Data)
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze to score the sandbox")
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold=30", unitFile).CombinedOutput()
	if err != nil && strings.Contains(string(out), "unrecognized option") {
		t.Skip("systemd-analyze predates --offline (systemd 250)")
	}
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Errorf("systemd-analyze security: %v: %s", err, lines[len(lines)-1])
	}
}
