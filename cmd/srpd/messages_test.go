package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestTakenPortLeavesDiskAlone: a start refused by the host (the listen
// or metrics port taken) fails before the data directory or vol0 exist,
// in one line that names the flag. srpd used to create both, then fail
// "bind: address already in use".
func TestTakenPortLeavesDiskAlone(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().String()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// Each layer between (provider, wire, net) once repeated the
		// address: "listen on A: emu: listen on A: listen tcp A: bind: …".
		{"listen", []string{"--listen", busy},
			"srpd: --listen " + busy + ": address in use: another srpd, or another service, has it; choose another --listen\n"},
		{"metrics", []string{"--listen", e2etest.FreeAddr(t), "--metrics", busy},
			"srpd: --metrics " + busy + ": address in use: another srpd, or another service, has it; choose another --metrics\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			r := e2etest.Run(t, nil, srpd, append([]string{"--data", data}, tc.args...)...)
			if r.Code != 1 || r.Stderr != tc.want {
				t.Errorf("exit %d, stderr %q; want 1, %q", r.Code, r.Stderr, tc.want)
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Errorf("the failed start left %s behind (stat: %v)", data, err)
			}
		})
	}
}

// TestBadStateFileLeavesDiskAlone: a reservations file srpd cannot read
// fails the start in one line naming it, before vol0 is created (srpd
// used to create vol0, then fail when the target loaded the file): once
// the file is gone, the next start is the one that creates vol0.
func TestBadStateFileLeavesDiskAlone(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(data, reservationsFile)
	if err := os.WriteFile(bad, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e2etest.Run(t, nil, srpd, "--data", data, "--listen", e2etest.FreeAddr(t), "--default-volume-size", "16MiB")
	if r.Code != 1 || !strings.HasPrefix(r.Stderr, "srpd: reservations: "+bad+": ") || strings.Count(r.Stderr, "\n") != 1 {
		t.Errorf("exit %d, stderr %q; want 1 and one line naming %s", r.Code, r.Stderr, bad)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	d := e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), "", "--default-volume-size", "16MiB")
	if !strings.Contains(d.Log(), "created default volume") {
		t.Errorf("the start after the failed one found vol0 already there:\n%s", d.Log())
	}
}

// TestAdminMessages: what a user meets in 'srpd' administration names
// the real cause, on one line, and quotes a name at most once.
func TestAdminMessages(t *testing.T) {
	srpd, srpc, data, addr := startSrpd(t, "--default-volume-size", "16MiB")
	long := strings.Repeat("x", 10<<10)
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"snapshot", "create", "nosuch", "s"}, 1, "srpd: volume \"nosuch\" does not exist\n"},
		{[]string{"snapshot", "clone", "vol0", "nosnap", "newv"}, 1, "srpd: snapshot vol0@nosnap does not exist\n"},
		{[]string{"snapshot", "clone", "nosuch", "nosnap", "newv"}, 1, "srpd: volume \"nosuch\" does not exist\n"},
		{[]string{"snapshot", "delete", "vol0", "nosnap"}, 1, "srpd: snapshot vol0@nosnap does not exist\n"},
		{[]string{"volume", "create", "--size", "0", "v"}, 2,
			"srpd volume create: --size 0: a volume needs a size above 0 (e.g. --size 256MiB)\nRun 'srpd volume create --help' for usage.\n"},
		// Both once went to srpd, whose answer blamed the size.
		{[]string{"volume", "create", "--size", "1000", "v"}, 2,
			"srpd volume create: --size 1000: want whole 4096-byte blocks (e.g. --size 4096)\nRun 'srpd volume create --help' for usage.\n"},
		{[]string{"volume", "create", "--size", "1MiB", "--block-size", "1000", "v"}, 2,
			"srpd volume create: --block-size 1000: want 512 or 4096\nRun 'srpd volume create --help' for usage.\n"},
		// It once ended in ": block: invalid argument".
		{[]string{"volume", "create", "--size", "1MiB", "a/b"}, 1,
			"srpd: volume \"a/b\": volume name \"a/b\": byte 0x2f not allowed (no '/', '@', '\\' or control characters)\n"},
		{[]string{"volume", "create", "v"}, 2,
			"srpd volume create: --size is required (e.g. --size 256MiB)\nRun 'srpd volume create --help' for usage.\n"},
		{[]string{"volume", "create", "--size", "1MiB", long}, 1, "srpd: a volume name of 10240 bytes is too long: the limit is 200\n"},
		{[]string{"snapshot", "create", "vol0", long}, 1, "srpd: a snapshot name of 10240 bytes is too long: the limit is 200\n"},
		{[]string{"acl", "set", "h", "nosuchvol", "rw"}, 0, "srpd: saved, but there is no volume \"nosuchvol\" yet: the rule applies once it exists\n"},
		{[]string{"acl", "set", "h", "vol0@nosnap", "ro"}, 0, "srpd: saved, but there is no volume \"vol0@nosnap\" yet: the rule applies once it exists\n"},
		{[]string{"acl", "set", "h", "vol0", "rw"}, 0, ""},
		// Both were once saved: rules no volume can ever match.
		{[]string{"acl", "set", "h", "a/b", "rw"}, 1,
			"srpd: an ACL rule names a volume, a snapshot as VOLUME@SNAPSHOT, or \"*\": volume name \"a/b\": byte 0x2f not allowed (no '/', '@', '\\' or control characters)\n"},
		{[]string{"acl", "set", "h", "vol0@", "ro"}, 1,
			"srpd: an ACL rule names a volume, a snapshot as VOLUME@SNAPSHOT, or \"*\": snapshot name \"\": want 1..200 bytes, not . or ..\n"},
		// Names the admin API would put in a URL path and get back
		// as an HTTP status ("404 Not Found").
		{[]string{"volume", "delete", ""}, 2, "srpd volume delete: \"\": want a name\nRun 'srpd volume delete --help' for usage.\n"},
		{[]string{"volume", "delete", ".."}, 2, "srpd volume delete: \"..\": want a name\nRun 'srpd volume delete --help' for usage.\n"},
		{[]string{"volume", "create", "--size", "1MiB", " "}, 2, "srpd volume create: \" \": want a name\nRun 'srpd volume create --help' for usage.\n"},
		// A volume's snapshots once went with it, unasked.
		{[]string{"volume", "create", "--size", "1MiB", "kept"}, 0, ""},
		{[]string{"snapshot", "create", "kept", "before"}, 0, ""},
		{[]string{"volume", "delete", "kept"}, 1, "srpd: volume \"kept\" has snapshots (kept@before): " +
			"give --snapshots to delete them with it, or delete them first with 'srpd snapshot delete'\n"},
		{[]string{"snapshot", "list", "kept"}, 0, ""},
		{[]string{"volume", "delete", "--snapshots", "kept"}, 0, ""},
		{[]string{"volume", "delete", "kept"}, 1, "srpd: volume \"kept\" does not exist\n"},
	} {
		r := e2etest.Run(t, nil, srpd, append(tc.args, "--data", data)...)
		if r.Code != tc.code || r.Stderr != tc.stderr {
			t.Errorf("srpd %.80s: exit %d, stderr %.300q; want %d, %q", strings.Join(tc.args, " "), r.Code, r.Stderr, tc.code, tc.stderr)
		}
	}

	// A snapshot read through the target, then deleted, leaves status.
	e2etest.MustRun(t, srpd, "snapshot", "create", "--data", data, "vol0", "gone")
	e2etest.MustRun(t, srpc, "export", "--target", addr, "vol0@gone", os.DevNull)
	e2etest.MustRun(t, srpd, "snapshot", "delete", "--data", data, "vol0", "gone")
	var st admin.Status
	if err := json.Unmarshal([]byte(e2etest.MustRun(t, srpd, "status", "--json", "--data", data).Stdout), &st); err != nil {
		t.Fatal(err)
	}
	for _, v := range st.VolumeStats {
		if v.Name == "vol0@gone" {
			t.Errorf("status lists the deleted snapshot vol0@gone: %+v", st.VolumeStats)
		}
	}
}

// TestServeFlagMessages: flags that cannot work together, or values that
// cannot work (a shutdown with no time to close the store, which once
// made every stop exit 1), are refused, and a metrics endpoint open to
// every interface is said so.
func TestServeFlagMessages(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	r := e2etest.Run(t, nil, srpd, "--data", data, "--listen", e2etest.FreeAddr(t), "--pprof")
	if want := "srpd: --pprof serves on the --metrics address: give --metrics HOST:PORT too\nRun 'srpd --help' for usage.\n"; r.Code != 2 || r.Stderr != want {
		t.Errorf("--pprof alone: exit %d, stderr %q; want 2, %q", r.Code, r.Stderr, want)
	}
	for _, args := range [][]string{
		{"--shutdown-timeout", "0"}, {"--shutdown-timeout", "-1s"}, {"--open-wait", "-1s"},
		// Refused before the store is made (it was made, and left).
		{"--default-volume-size", "5000"}, {"--backend", "bogus"},
	} {
		r := e2etest.Run(t, nil, srpd, append([]string{"--data", data, "--listen", e2etest.FreeAddr(t)}, args...)...)
		if r.Code != 2 || !strings.HasPrefix(r.Stderr, "srpd: "+args[0]+" ") || !strings.Contains(r.Stderr, ": want ") {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a usage error", args, r.Code, r.Stderr)
		}
		if _, err := os.Stat(data); err == nil {
			t.Fatalf("%q: a refused start made the data directory", args)
		}
	}
	// An address the host cannot listen on is named once, with why.
	for _, tc := range []struct{ flag, addr, why string }{
		{"--listen", "127.0.0.1:99999", "invalid port (want HOST:PORT, e.g. 127.0.0.1:4420)"},
		{"--listen", "127.0.0.1", "missing port in address (want HOST:PORT, e.g. 127.0.0.1:4420)"},
	} {
		args := []string{"--data", data, "--listen", e2etest.FreeAddr(t), tc.flag, tc.addr}
		r := e2etest.Run(t, nil, srpd, args...)
		if want := "srpd: " + tc.flag + " " + tc.addr + ": " + tc.why + "\n"; r.Code != 1 || r.Stderr != want {
			t.Errorf("%s %s: exit %d, stderr %q; want 1, %q", tc.flag, tc.addr, r.Code, r.Stderr, want)
		}
	}
	d := e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), ":0", "--no-default-volume")
	if !strings.Contains(d.Log(), "the metrics endpoint listens on every interface") {
		t.Errorf("no warning for --metrics :0; log:\n%s", d.Log())
	}
}

// TestStatusAsOtherUser: a user who may not use the admin socket is told
// so, not that srpd is not running.
func TestStatusAsOtherUser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run srpd status as another user")
	}
	srpd, _ := e2etest.Binaries(t)
	data := filepath.Join(t.TempDir(), "data")
	e2etest.StartDaemon(t, srpd, data, e2etest.FreeAddr(t), "", "--no-default-volume")
	// The built binary lives in a 0700 directory; nobody needs a copy.
	binDir, err := os.MkdirTemp("", "gosrp-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(binDir)
	os.Chmod(binDir, 0o755)
	bin := filepath.Join(binDir, "srpd")
	copyFile(t, srpd, bin)
	cmd := exec.Command(bin, "status", "--data", data)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	sock := filepath.Join(data, admin.SocketName)
	want := "srpd: permission denied: the admin socket " + sock + " is the daemon's user's alone; run as root or as that user\n"
	if code := cmd.ProcessState.ExitCode(); code != 1 || string(out) != want {
		t.Errorf("srpd status as nobody: exit %d (%v), output %q; want 1, %q", code, err, out, want)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
