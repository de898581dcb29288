package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/target"
)

// streamingImport is an srpc import from a pipe: it keeps a session
// with the volume open for as long as the test feeds it.
type streamingImport struct {
	*e2etest.Proc
	stdin io.WriteCloser
}

func startImport(t *testing.T, srpc string, args ...string) *streamingImport {
	t.Helper()
	p, stdin := e2etest.StartPiped(t, srpc, append([]string{"import"}, args...)...)
	return &streamingImport{p, stdin}
}

// feedUntilExit writes to the import until srpc exits (an I/O error, say)
// or the deadline passes, and returns its exit code.
func (si *streamingImport) feedUntilExit(t *testing.T, d time.Duration) int {
	t.Helper()
	chunk := make([]byte, 64<<10)
	deadline := time.After(d)
	for {
		select {
		case <-si.Exited():
			return si.ExitCode()
		case <-deadline:
			t.Fatalf("srpc import still running %v later; output:\n%s", d, si.Output())
		default:
		}
		if _, err := si.stdin.Write(chunk); err != nil {
			si.Wait(t, time.Minute, "srpc import after its input pipe broke")
			return si.ExitCode()
		}
	}
}

// waitSession polls srpd status until initiator has a connection with an
// open volume.
func waitSession(t *testing.T, srpd, data, initiator string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r := e2etest.MustRun(t, srpd, "status", "--data", data, "--json")
		var st admin.Status
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
			t.Fatalf("status --json: %v", err)
		}
		for _, c := range st.Conns {
			if c.Initiator == initiator && c.OpenVolumes > 0 {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no session of %s with an open volume", initiator)
}

// TestAccessControl runs the access-control gaps of issue 21 against the
// real binaries: a deny on a volume covers its snapshots in srpc list and
// open; revoking a host's access ends its open session's I/O, and
// changing its secret ends its session, each within a second of the
// admin command returning.
func TestAccessControl(t *testing.T) {
	srpd, srpc := e2etest.Binaries(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := e2etest.FreeAddr(t)
	d := e2etest.StartDaemon(t, srpd, data, addr, "", "--no-default-volume")
	e2etest.MustRun(t, srpd, "volume", "create", "--data", data, "--size", "64MiB", "A")
	e2etest.MustRun(t, srpd, "snapshot", "create", "--data", data, "A", "s1")

	// A deny on A covers A@s1.
	e2etest.MustRun(t, srpd, "acl", "set", "--data", data, "host-b", "A", "none")
	if r := e2etest.MustRun(t, srpc, "list", "--target", addr, "--name", "host-b"); strings.Contains(r.Stdout, "\nA") {
		t.Errorf("host-b lists a volume it may not open, or its snapshot:\n%s", r.Stdout)
	}
	r := e2etest.Run(t, nil, srpc, "export", "--target", addr, "--name", "host-b", "--length", "4KiB", "A@s1", "-")
	if r.Code != 1 || !strings.Contains(r.Stderr, "access denied") || r.Stdout != "" {
		t.Errorf("host-b exported A@s1: exit %d, %d bytes, stderr %q", r.Code, len(r.Stdout), r.Stderr)
	}
	if r := e2etest.MustRun(t, srpc, "list", "--target", addr, "--name", "host-c"); !strings.Contains(r.Stdout, "A@s1") {
		t.Errorf("host-c, under the default, does not list A@s1:\n%s", r.Stdout)
	}

	// Revoking host-c's access ends the I/O of its open session.
	imp := startImport(t, srpc, "--target", addr, "--name", "host-c", "--qd", "4", "A", "-")
	if _, err := imp.stdin.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	waitSession(t, srpd, data, "host-c")
	e2etest.MustRun(t, srpd, "acl", "set", "--data", data, "host-c", "A", "none")
	d.WaitOutput(t, "access revoked: volume closed", time.Second)
	if code := imp.feedUntilExit(t, 30*time.Second); code != 1 || !strings.Contains(imp.Output(), "access denied") {
		t.Errorf("srpc import after the revocation: exit %d, stderr:\n%s", code, imp.Output())
	}

	// Changing host-d's secret ends its session; only the new one logs in.
	old, cur := filepath.Join(dir, "old.key"), filepath.Join(dir, "new.key")
	os.WriteFile(old, []byte("old secret\n"), 0o600)
	os.WriteFile(cur, []byte("new secret\n"), 0o600)
	e2etest.MustRun(t, srpd, "secret", "set", "--data", data, "--secret-file", old, "host-d")
	imp = startImport(t, srpc, "--target", addr, "--name", "host-d", "--secret-file", old, "--timeout", "2s", "A", "-")
	if _, err := imp.stdin.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	waitSession(t, srpd, data, "host-d")
	e2etest.MustRun(t, srpd, "secret", "set", "--data", data, "--secret-file", cur, "host-d")
	d.WaitOutput(t, "session ended by a policy change", time.Second)
	if code := imp.feedUntilExit(t, 30*time.Second); code != 1 {
		t.Errorf("srpc import with the old secret: exit %d, stderr:\n%s", code, imp.Output())
	}
	if r := e2etest.Run(t, nil, srpc, "list", "--target", addr, "--name", "host-d", "--secret-file", old); r.Code != 1 {
		t.Errorf("login with the old secret: exit %d, stderr %q", r.Code, r.Stderr)
	}
	e2etest.MustRun(t, srpc, "list", "--target", addr, "--name", "host-d", "--secret-file", cur)
}

// TestSourceRule: an ACL rule may name an SRP host's source address
// (target.SourcePrefix), which the target's ACL then matches for SRP
// sessions from that host; the prefix alone is refused.
func TestSourceRule(t *testing.T) {
	acc, err := loadAccess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := acc.SetRule(admin.ACLRule{Initiator: target.SourcePrefix, Volume: "A", Access: "rw"}); err == nil {
		t.Error("a source rule with no host was saved")
	}
	if err := acc.SetRule(admin.ACLRule{Initiator: "addr:10.0.2.15", Volume: "A", Access: "none"}); err != nil {
		t.Fatal(err)
	}
	acl := acc.ACLPointer()
	if got := acl.AllowFrom("fe00", "10.0.2.15", "A"); got != target.AccessNone {
		t.Errorf("SRP session from 10.0.2.15: %s, want none", got)
	}
	if got := acl.AllowFrom("fe00", "10.0.2.16", "A"); got != target.AccessReadWrite {
		t.Errorf("SRP session from 10.0.2.16: %s, want read-write", got)
	}
}

// TestCloneAccess pins what a clone's access starts as: no rules of its
// own and none of its source's, so the default policy and the "*" rules
// decide, under deny and under allow by default.
func TestCloneAccess(t *testing.T) {
	acc, err := loadAccess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := block.NewMemStore()
	defer store.Close()
	svc := &service{store: store, access: acc}
	if _, err := svc.CreateVolume(admin.CreateVolume{Name: "A", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []admin.ACLRule{{Initiator: "host-a", Volume: "A", Access: "rw"}, {Initiator: "host-b", Volume: "A", Access: "none"},
		{Initiator: "reader", Volume: "*", Access: "ro"}} {
		if err := svc.SetACLRule(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.CreateSnapshot("A", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CloneSnapshot("A", "s1", "C"); err != nil {
		t.Fatal(err)
	}
	for _, r := range acc.ACL().Rules {
		if r.Volume == "C" {
			t.Errorf("the clone got a rule of its own: %+v", r)
		}
	}
	check := func(deny bool, want map[string]target.Access) {
		t.Helper()
		if err := svc.SetACLDefault(deny); err != nil {
			t.Fatal(err)
		}
		for ini, w := range want {
			if got := acc.ACLPointer().Allow(ini, "C"); got != w {
				t.Errorf("deny by default %v: %s has %s on the clone, want %s", deny, ini, got, w)
			}
		}
	}
	// host-a's rw on A does not follow the clone, nor host-b's none.
	check(true, map[string]target.Access{"host-a": target.AccessNone, "host-b": target.AccessNone, "reader": target.AccessReadOnly})
	check(false, map[string]target.Access{"host-a": target.AccessReadWrite, "host-b": target.AccessReadWrite, "reader": target.AccessReadOnly})
}
