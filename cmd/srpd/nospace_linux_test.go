package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
)

// fullDiskSize is the tmpfs srpd's data directory is on in the full-disk
// tests: room for pebble (its first WAL and memtable, 4 MiB at this size),
// a 4 MiB volume and its 1 MiB of data, and for the default reserve (a
// quarter of it), so that srpd serves as usual until the disk is filled.
const fullDiskSize = "16m"

// fullDisk is a running srpd whose data directory is alone on a small
// tmpfs, with vol0 (4 MiB) holding 1 MiB of random data written and
// flushed through an initiator session that stays open.
type fullDisk struct {
	srpd, srpc, mnt, data, addr string
	d                           *e2etest.Daemon
	s                           *initiator.Session
	v                           *initiator.Volume
	want                        []byte // vol0's first MiB
}

// startFullDisk mounts the tmpfs (root only: the test is skipped
// otherwise, with the reason) and starts srpd on it. The tmpfs is
// unmounted when the test ends, after srpd and the session are gone.
func startFullDisk(t *testing.T, ctx context.Context) *fullDisk {
	t.Helper()
	srpd, srpc := e2etest.Binaries(t)
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs as srpd's data disk: needs root (CI runs as root)")
	}
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size="+fullDiskSize+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): this test needs root and mount(2)", mnt, err)
	}
	// Registered before srpd starts, so it runs after srpd is killed.
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount the test's tmpfs %s: %v (detaching it)", mnt, err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	f := &fullDisk{srpd: srpd, srpc: srpc, mnt: mnt, data: filepath.Join(mnt, "data"), addr: e2etest.FreeAddr(t)}
	f.d = e2etest.StartDaemon(t, srpd, f.data, f.addr, "", "--no-default-volume")
	e2etest.MustRun(t, srpd, "volume", "create", "--data", f.data, "--size", "4MiB", "vol0")
	f.s, f.v = dialOpen(t, ctx, f.addr, "full-disk-host", initiator.OpenOptions{})
	f.want = make([]byte, 1<<20)
	rand.Read(f.want)
	if _, err := f.v.WriteAtContext(ctx, f.want, 0); err != nil {
		t.Fatalf("write vol0 before the disk fills: %v", err)
	}
	if err := f.v.Flush(ctx); err != nil {
		t.Fatalf("flush vol0 before the disk fills: %v", err)
	}
	return f
}

// fill writes a file on the tmpfs until the file system refuses it with
// ENOSPC, and returns its path.
func (f *fullDisk) fill(t *testing.T) string {
	t.Helper()
	path := filepath.Join(f.mnt, "filler")
	w, err := os.Create(path)
	if err != nil {
		t.Fatalf("fill the disk: %v", err)
	}
	defer w.Close()
	chunk := make([]byte, 64<<10)
	for range 1 << 10 { // 64 MiB, four times the tmpfs
		if _, err := w.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the disk: %v, want ENOSPC at the end", err)
			}
			return path
		}
	}
	t.Fatalf("a %s tmpfs took 64 MiB without filling", fullDiskSize)
	return ""
}

// serving fails the test unless srpd is running and serves vol0's data:
// through the session opened before the disk filled, and through a new
// srpc connection.
func (f *fullDisk) serving(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	select {
	case <-f.d.Exited():
		t.Fatalf("%s: srpd exited (%v):\n%s", when, f.d.Err(), f.d.Log())
	default:
	}
	got := make([]byte, len(f.want))
	if _, err := f.v.ReadAtContext(ctx, got, 0); err != nil {
		t.Fatalf("%s: read vol0 through the open session: %v\nsrpd's log:\n%s", when, err, f.d.Log())
	}
	if !bytes.Equal(got, f.want) {
		t.Fatalf("%s: vol0 read through the open session differs from its data", when)
	}
	r := e2etest.MustRun(t, f.srpc, "export", "--target", f.addr, "--length", strconv.Itoa(len(f.want)), "vol0", "-")
	if !bytes.Equal([]byte(r.Stdout), f.want) {
		t.Fatalf("%s: vol0 exported by srpc differs from its data", when)
	}
}

// refusedForSpace fails the test unless r is a command that failed as a
// full disk must fail it: exit 1, and one line on stderr that says no
// space is left and, if context is given, holds it (what was not done:
// more than the bare errno), with no panic or stack.
func refusedForSpace(t *testing.T, r e2etest.Result, what, context string) {
	t.Helper()
	msg := strings.TrimSpace(r.Stderr)
	switch {
	case r.Code != 1:
		t.Fatalf("%s on a full disk: exit %d, want 1\nstdout: %s\nstderr: %s", what, r.Code, r.Stdout, r.Stderr)
	case strings.Count(r.Stderr, "\n") != 1:
		t.Fatalf("%s on a full disk: stderr is not one line:\n%s", what, r.Stderr)
	case !strings.Contains(msg, "no space left on device"):
		t.Fatalf("%s on a full disk: %q does not say that no space is left", what, msg)
	case !strings.Contains(msg, context):
		t.Fatalf("%s on a full disk: %q does not say %q", what, msg, context)
	case strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine"):
		t.Fatalf("%s on a full disk: %q", what, msg)
	}
}

// aclState is what 'srpd acl list' and 'srpd secret list' show, and the
// file they are kept in.
type aclState struct {
	acl     admin.ACL
	secrets []admin.SecretInfo
	file    []byte
}

func (f *fullDisk) aclState(t *testing.T) aclState {
	t.Helper()
	var s aclState
	for _, q := range []struct {
		cmd  string
		into any
	}{{"acl", &s.acl}, {"secret", &s.secrets}} {
		r := e2etest.MustRun(t, f.srpd, q.cmd, "list", "--data", f.data, "--json")
		if err := json.Unmarshal([]byte(r.Stdout), q.into); err != nil {
			t.Fatalf("srpd %s list --json: %v\n%s", q.cmd, err, r.Stdout)
		}
	}
	var err error
	if s.file, err = os.ReadFile(filepath.Join(f.data, accessFile)); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestACLOnFullDisk: when srpd's data disk is full, 'srpd acl set' and
// 'srpd secret set', which replace access.json through
// internal/durable, fail with exit 1 and one line saying that no space is
// left and that the ACL (or the secrets) is unchanged; srpd keeps
// running and serving vol0's data meanwhile, on the session opened
// before and on a new one; 'acl list', 'secret list' and access.json are
// as before each failed command, and no temporary file is left to hold
// the space; once the space is freed, the same commands succeed and
// show. TestWriteFileDiskFull (internal/durable) checks the library on
// a full disk; this checks the daemon that uses it, end to end.
func TestACLOnFullDisk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := startFullDisk(t, ctx)
	e2etest.MustRun(t, f.srpd, "acl", "set", "--data", f.data, "host-a", "vol0", "rw")
	e2etest.MustRun(t, f.srpd, "secret", "set", "--data", f.data, "--secret", "s1", "host-a")
	before := f.aclState(t)

	filler := f.fill(t)
	cmds := [][]string{
		{"acl", "set", "--data", f.data, "host-b", "vol0", "ro"},
		{"secret", "set", "--data", f.data, "--secret", "s2", "host-b"},
	}
	unchanged := []string{"the ACL is unchanged", "the secrets are unchanged"}
	for i, cmd := range cmds {
		what := "srpd " + strings.Join(cmd[:2], " ")
		r := e2etest.Run(t, nil, f.srpd, cmd...)
		refusedForSpace(t, r, what, unchanged[i])
		t.Logf("%s on a full disk: %s", what, strings.TrimSpace(r.Stderr))
		if msg := strings.TrimSpace(f.d.Log()); strings.Contains(msg, "panic") {
			t.Fatalf("after %s on a full disk, srpd's log shows a panic:\n%s", what, msg)
		}
		f.serving(t, ctx, "after "+what+" on a full disk")
		after := f.aclState(t)
		if !bytes.Equal(after.file, before.file) {
			t.Fatalf("after %s failed on a full disk, %s changed:\n%s\nwas:\n%s", what, accessFile, after.file, before.file)
		}
		if a, b := mustJSON(t, after.acl, after.secrets), mustJSON(t, before.acl, before.secrets); a != b {
			t.Fatalf("after %s failed on a full disk, srpd shows\n%s\nwas\n%s", what, a, b)
		}
		if _, err := os.Stat(filepath.Join(f.data, accessFile+".tmp")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after %s failed on a full disk, its temporary file is still there (%v): its pages stay taken", what, err)
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range cmds {
		e2etest.MustRun(t, f.srpd, cmd...)
	}
	after := f.aclState(t)
	if !strings.Contains(mustJSON(t, after.acl), `{"initiator":"host-b","volume":"vol0","access":"ro"}`) ||
		!strings.Contains(mustJSON(t, after.secrets), `{"initiator":"host-b","required":true}`) {
		t.Fatalf("with room again, the commands succeeded but srpd shows %s %s", mustJSON(t, after.acl), mustJSON(t, after.secrets))
	}
	f.serving(t, ctx, "with room again")
	f.stop(t)
}

// stop ends the session and stops srpd, which must exit 0: its store
// closes cleanly.
func (f *fullDisk) stop(t *testing.T) {
	t.Helper()
	f.s.Close()
	if code := f.d.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, f.d.Log())
	}
}

// mustJSON is vs as one line of JSON, for comparing and printing.
func mustJSON(t *testing.T, vs ...any) string {
	t.Helper()
	b, err := json.Marshal(vs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestVolumeChangesOnFullDisk: when srpd's data disk is full, the
// changes that commit to pebble's WAL (volume create, snapshot create)
// and the initiators' FLUSHes and DISCARDs, which log a WAL record each,
// never kill srpd: each fails (exit 1 and one line saying no space is
// left, or an error to the initiator) or succeeds, while srpd keeps
// serving vol0's data. Pebble does not survive ENOSPC in its WAL (block's
// package doc, "Out of space"): a commit that meets it is fatal to the
// process. srpd stopped on the full disk does not die of it either,
// and starts again once the space is freed; then the same commands
// succeed and srpd stops cleanly.
func TestVolumeChangesOnFullDisk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := startFullDisk(t, ctx)
	e2etest.MustRun(t, f.srpd, "volume", "create", "--data", f.data, "--size", "4MiB", "doomed")
	filler := f.fill(t)

	// Enough of each to take the WAL across several pages of the tmpfs.
	var refused, done int
	for i := range 40 {
		for _, cmd := range [][]string{
			{"volume", "create", "--data", f.data, "--size", "4MiB", "new" + strconv.Itoa(i)},
			{"snapshot", "create", "--data", f.data, "vol0", "s" + strconv.Itoa(i)},
		} {
			what := "srpd " + strings.Join(cmd[:2], " ") + " " + cmd[len(cmd)-1]
			r := e2etest.Run(t, nil, f.srpd, cmd...)
			dying := time.After(0)
			if r.Code != 0 && !strings.Contains(r.Stderr, "no space left on device") {
				// srpd's answer was cut: give its death, if that is
				// what cut it, time to show.
				dying = time.After(5 * time.Second)
			}
			select {
			case <-f.d.Exited():
				t.Fatalf("%s on a full disk (after %d done, %d refused) killed srpd (%v):\n%s", what, done, refused, f.d.Err(), f.d.Log())
			case <-dying:
			}
			if r.Code == 0 {
				done++
				continue
			}
			refusedForSpace(t, r, what, cmd[len(cmd)-1])
			if refused++; i == 0 {
				t.Logf("%s: %s", what, strings.TrimSpace(r.Stderr))
			}
		}
	}
	t.Logf("on the full disk: %d volume and snapshot creates done, %d refused", done, refused)
	// FLUSH and DISCARD (of a range vol0 holds no data in), a WAL record
	// each.
	ios := map[string]func() error{
		"FLUSH":   func() error { return f.v.Flush(ctx) },
		"DISCARD": func() error { return f.v.Discard(ctx, 2<<20, 64<<10) },
	}
	for _, op := range []string{"FLUSH", "DISCARD"} {
		var ok, failed int
		var last error
		for range 1000 {
			if err := ios[op](); err != nil {
				failed, last = failed+1, err
			} else {
				ok++
			}
			select {
			case <-f.d.Exited():
				t.Fatalf("%s on a full disk (after %d done, %d failed) killed srpd (%v):\n%s", op, ok, failed, f.d.Err(), f.d.Log())
			default:
			}
		}
		t.Logf("on the full disk: %d %ss done, %d failed (%v)", ok, op, failed, last)
	}
	f.serving(t, ctx, "after volume changes and FLUSHes on a full disk")

	// Stopped on the full disk, srpd closes its store without the record
	// it cannot log (pebble's close may still fail for the trailer that
	// ends its WAL: exit 1 then, with the reason logged), and starts
	// again on the same data once there is room, vol0's data whole.
	f.s.Close()
	code := f.d.Stop(t)
	t.Logf("srpd stopped on the full disk: exit %d", code)
	if log := f.d.Log(); strings.Contains(log, "fatal") || strings.Contains(log, "panic") {
		t.Fatalf("srpd stopped on the full disk:\n%s", log)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	f.d = e2etest.StartDaemon(t, f.srpd, f.data, f.addr, "")
	f.s, f.v = dialOpen(t, ctx, f.addr, "full-disk-host", initiator.OpenOptions{})
	f.serving(t, ctx, "restarted with room again")
	e2etest.MustRun(t, f.srpd, "volume", "create", "--data", f.data, "--size", "4MiB", "roomy")
	e2etest.MustRun(t, f.srpd, "snapshot", "create", "--data", f.data, "vol0", "roomy")
	e2etest.MustRun(t, f.srpd, "volume", "delete", "--data", f.data, "doomed")
	if err := f.v.Flush(ctx); err != nil {
		t.Fatalf("FLUSH with room again: %v", err)
	}
	f.serving(t, ctx, "with room again")
	f.stop(t)
}
