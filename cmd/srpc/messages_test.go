package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// runStdin runs srpc with stdin from in (an *os.File stays a file, so
// srpc can stat it; anything else comes through a pipe).
func runStdin(t *testing.T, srpc string, in any, args ...string) e2etest.Result {
	t.Helper()
	cmd := exec.Command(srpc, args...)
	switch in := in.(type) {
	case *os.File:
		cmd.Stdin = in
	case []byte:
		cmd.Stdin = bytes.NewReader(in)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := e2etest.Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.Code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// startTarget starts srpd, with flags, with a vol0 of size in a fresh
// directory dir and returns srpc's path, dir and srpd's address.
func startTarget(t *testing.T, size string, flags ...string) (srpc, dir, addr string) {
	t.Helper()
	srpd, srpc := e2etest.Binaries(t)
	dir, addr = t.TempDir(), e2etest.FreeAddr(t)
	e2etest.StartDaemon(t, srpd, filepath.Join(dir, "data"), addr, "", append(flags, "--default-volume-size", size)...)
	return srpc, dir, addr
}

// TestClientMessages: what a user meets in srpc names the real cause on
// one line: a missing volume through every command that opens one, a
// secret the target does not know, an empty --length, an input too large
// for the volume (up front when its size is known), a queue depth out of
// range.
func TestClientMessages(t *testing.T) {
	srpc, dir, addr := startTarget(t, "1MiB")
	conn := []string{"--target", addr, "--name", "h"}
	noVol := `srpc: no volume "nosuch" on ` + addr + ` for initiator "h" (srpc list shows what you may open)` + "\n"
	big := filepath.Join(dir, "big.img")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	bigFile, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	defer bigFile.Close()
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)

	for _, tc := range []struct {
		name   string
		in     any
		args   []string
		code   int
		stderr string
	}{
		{"info", nil, []string{"info", "nosuch"}, 1, noVol},
		{"export", nil, []string{"export", "nosuch", os.DevNull}, 1, noVol},
		{"import", nil, []string{"import", "nosuch", os.DevNull}, 1, noVol},
		{"mount", nil, []string{"mount", "nosuch", mnt}, 1, noVol},
		{"nbd", nil, []string{"nbd", "--socket", filepath.Join(dir, "nbd.sock"), "nosuch"}, 1, noVol},
		{"secret the target lacks", nil, []string{"list", "--secret-file", secret}, 1,
			"srpc: target " + addr + ` did not ask initiator "h" for a secret: it has none for it (add one there with 'srpd secret set'), ` +
				"or it is not the target that shares yours\n"},
		{"length 0", nil, []string{"export", "--length", "0", "vol0", os.DevNull}, 2,
			"srpc export: --length 0: want a length above 0, or no --length to export to the end\nRun 'srpc export --help' for usage.\n"},
		{"stdin file too large", bigFile, []string{"import", "vol0", "-"}, 1,
			"srpc: stdin (2097152 bytes) does not fit in vol0 at offset 0 (1048576 bytes); nothing was written\n"},
		{"stdin pipe too large", make([]byte, 2<<20), []string{"import", "vol0", "-"}, 1,
			"srpc: the input does not fit in vol0 (1048576 bytes) past offset 0: srpc wrote the first 1048576 bytes of it, unflushed, and stopped\n"},
		{"mount point missing", nil, []string{"mount", "vol0", filepath.Join(dir, "nodir")}, 1,
			"srpc: mount point: stat " + filepath.Join(dir, "nodir") + ": no such file or directory\n"},
		{"mount point a file", nil, []string{"mount", "vol0", big}, 1, "srpc: mount point " + big + " is not a directory\n"},
		{"empty secret file", nil, []string{"list", "--secret-file", os.DevNull}, 1, "srpc: --secret-file " + os.DevNull + " is empty\n"},
		{"register key 0", nil, []string{"reserve", "register", "vol0", "0x0"}, 2,
			"srpc reserve register: NEWKEY 0 with no --key registers nothing: 0 unregisters the key --key names\nRun 'srpc reserve register --help' for usage.\n"},
		{"mount qd 0", nil, []string{"mount", "--qd", "0", "vol0", mnt}, 2,
			"srpc mount: --qd 0: want 1..1024\nRun 'srpc mount --help' for usage.\n"},
		// It once gave up before the first connect: "timed out", srpd up.
		{"timeout 0", nil, []string{"list", "--timeout", "0"}, 2,
			"srpc list: --timeout 0s: want a duration above zero\nRun 'srpc list --help' for usage.\n"},
		{"timeout negative", nil, []string{"export", "--timeout", "-1s", "vol0", "-"}, 2,
			"srpc export: --timeout -1s: want a duration above zero\nRun 'srpc export --help' for usage.\n"},
		// It once said "invalid request ... (srpc list shows what you may
		// open)", exit 1.
		// It once said "cannot connect to ADDR: replay buffer of ...".
		{"replay buffer beyond memory", nil, []string{"import", "--replay-buffer", "99999TiB", "vol0", os.DevNull}, 1,
			"srpc: not enough memory for the session: replay buffer of 109950063265972224 bytes: transport: mmap arena of 109950063265972224 bytes: " +
				"cannot allocate memory (lower --replay-buffer or --qd)\n"},
		{"exclusive over srp", nil, []string{"export", "--exclusive", "--protocol", "srp", "lun0", "-"}, 2,
			"srpc export: --exclusive is gosrp's protocol's: over --protocol srp, reserve the volume instead (srpc reserve --protocol srp)\nRun 'srpc export --help' for usage.\n"},
	} {
		r := runStdin(t, srpc, tc.in, append(tc.args, conn...)...)
		if r.Code != tc.code || r.Stderr != tc.stderr {
			t.Errorf("%s: exit %d, stderr %q; want %d, %q", tc.name, r.Code, r.Stderr, tc.code, tc.stderr)
		}
	}
	// An address without a port once came back through every layer
	// that had repeated it ("connect to 127.0.0.1: emu: connect to ...").
	if r, want := runStdin(t, srpc, nil, "list", "--target", "127.0.0.1"),
		"srpc: cannot reach a target at 127.0.0.1: missing port in address (want HOST:PORT, e.g. 127.0.0.1:4420)\n"; r.Code != 1 || r.Stderr != want {
		t.Errorf("--target without a port: exit %d, stderr %q; want 1, %q", r.Code, r.Stderr, want)
	}

	// Nobody listening: told by the transport's ErrRefused, not by the
	// words of its message.
	free := e2etest.FreeAddr(t)
	if r, want := runStdin(t, srpc, nil, "list", "--target", free),
		"srpc: cannot reach a target at "+free+": connection refused (is srpd running? --target or SRPC_TARGET)\n"; r.Code != 1 || r.Stderr != want {
		t.Errorf("--target where nothing listens: exit %d, stderr %q; want 1, %q", r.Code, r.Stderr, want)
	}

	// Another service on the port (srpd's default, 4420, is NVMe/TCP's
	// too) was "cannot connect to ADDR: connect to ADDR: emu: connect
	// to ADDR: bad answer (emu: malformed frame: magic 0x5448, …)".
	foreign := foreignListener(t, "HTTP/1.0 400 Bad Request\r\n\r\n")
	if r, want := runStdin(t, srpc, nil, "list", "--target", foreign),
		"srpc: cannot connect to "+foreign+`: something else listens there, not a gosrp target (it answered "HTTP/1.0 400 Bad")`+"\n"; r.Code != 1 || r.Stderr != want {
		t.Errorf("--target another service: exit %d, stderr %q; want 1, %q", r.Code, r.Stderr, want)
	}

	// An empty --name once logged in under the library's default name.
	if r, want := runStdin(t, srpc, nil, "list", "--target", addr, "--name", ""),
		"srpc list: --name is empty: want the initiator name the target's ACLs and secrets know\nRun 'srpc list --help' for usage.\n"; r.Code != 2 || r.Stderr != want {
		t.Errorf("--name \"\": exit %d, stderr %q; want 2, %q", r.Code, r.Stderr, want)
	}

	// Connection flags may come before the command, as go, git and
	// kubectl accept them; srpc used to say "flag provided but not
	// defined: -target".
	r := e2etest.MustRun(t, srpc, "--target", addr, "--name=h", "info", "vol0")
	if !strings.Contains(r.Stdout, "1 MiB") {
		t.Errorf("srpc --target %s --name=h info vol0:\n%s", addr, r.Stdout)
	}
}

// foreignListener listens on a free local port as another service would,
// answering each connection's first bytes with answer and hanging up,
// and returns its address.
func foreignListener(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 64))
			c.Write([]byte(answer))
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestMountMessages: SIGTERM while a loop device holds DIR/disk says the
// mount is busy and what to detach, without the fusermount fallback's
// own failure (multi-line, and naming a missing /bin/fusermount on hosts
// without one); once the loop device is gone, srpc unmounts and exits 0.
// Then a FUSE mount left by a killed srpc is named as such, where it
// used to be reported as "not a directory".
func TestMountMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: FUSE direct mount and losetup")
	}
	for _, p := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("needs %s", p)
		}
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup (util-linux)")
	}
	srpc, dir, addr := startTarget(t, "1MiB")
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	defer exec.Command("umount", "-l", mnt).Run()

	cmd := exec.Command(srpc, "mount", "--target", addr, "vol0", mnt)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := bufio.NewScanner(stderr)
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("srpc mount closed stderr: %v", lines.Err())
		}
		return lines.Text()
	}
	if l := next(); !strings.HasPrefix(l, "srpc: mounted vol0") {
		t.Fatalf("first line %q, want srpc: mounted vol0…", l)
	}
	disk := filepath.Join(mnt, "disk")
	dev := run(t, "losetup", "-f", "--show", disk)
	detached := false
	defer func() {
		if !detached {
			exec.Command("losetup", "-d", dev).Run()
		}
	}()
	cmd.Process.Signal(syscall.SIGTERM)
	want := "srpc: " + mnt + " is busy (device or resource busy): detach its loop device first (losetup -j " + disk +
		"; losetup -d /dev/loopN); retrying, a second signal exits at once"
	if l := next(); l != want {
		t.Errorf("busy unmount said\n%q\nwant\n%q", l, want)
	}
	run(t, "losetup", "-d", dev)
	detached = true
	// srpc now unmounts and exits. Once (a loaded machine, 1 run of many)
	// it stayed a zombie with a thread left in the kernel and the mount
	// in place, and the test waited for its stderr until go test's
	// timeout: wait a bounded time instead, and say where it is stuck.
	exited := make(chan error, 1)
	go func() {
		for lines.Scan() {
		}
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("srpc mount after the loop device was detached: %v", err)
		}
	case <-time.After(time.Minute):
		stacks, _ := exec.Command("sh", "-c", fmt.Sprintf("for f in /proc/%d/task/*/stack; do echo $f; cat $f; done", cmd.Process.Pid)).CombinedOutput()
		e2etest.AbortFUSE(mnt) // else the deferred Kill and Wait would wait forever
		t.Fatalf("srpc mount did not exit a minute after the loop device was detached; its threads' kernel stacks:\n%s", stacks)
	}

	m := startMount(t, srpc, addr, "vol0", mnt)
	m.Kill(t)
	r := e2etest.Run(t, nil, srpc, "mount", "--target", addr, "vol0", mnt)
	want = "srpc: mount point " + mnt + " is a stale FUSE mount (its srpc was killed): clean it up with 'umount -l' first\n"
	if r.Code != 1 || r.Stderr != want {
		t.Errorf("mount on a stale mount point: exit %d, stderr %q; want 1, %q", r.Code, r.Stderr, want)
	}
}

// TestProgress: with stderr not a terminal, import and export end with a
// summary line whatever --progress says (they used to print nothing);
// --progress always adds a line at every tenth of the copy, and --quiet
// silences both.
func TestProgress(t *testing.T) {
	srpc, dir, addr := startTarget(t, "16MiB")
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, bytes.Repeat([]byte{7}, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args     []string
		lines    int    // progress lines
		summary  string // prefix of the last line ("": no output), or all of stderr on a usage error
		wantCode int
	}{
		{[]string{"import", "vol0", img}, 0, "srpc: imported 16 MiB into vol0 in ", 0},
		{[]string{"import", "--progress", "never", "vol0", img}, 0, "srpc: imported 16 MiB into vol0 in ", 0},
		{[]string{"import", "--progress", "always", "vol0", img}, 9, "srpc: imported 16 MiB into vol0 in ", 0},
		{[]string{"import", "--quiet", "--progress", "always", "vol0", img}, 0, "", 0},
		{[]string{"export", "--progress", "always", "vol0", os.DevNull}, 9, "srpc: exported 16 MiB from vol0 in ", 0},
		{[]string{"export", "vol0", os.DevNull}, 0, "srpc: exported 16 MiB from vol0 in ", 0},
		{[]string{"export", "--progress", "sometimes", "vol0", os.DevNull}, 0,
			"srpc export: --progress \"sometimes\": want auto, always or never\nRun 'srpc export --help' for usage.\n", 2},
	} {
		r := e2etest.Run(t, nil, srpc, append(tc.args, "--target", addr)...)
		lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
		if r.Stderr == "" {
			lines = nil
		}
		if r.Code != tc.wantCode || (r.Code != 0 && r.Stderr != tc.summary) {
			t.Errorf("srpc %q: exit %d, stderr %q; want %d", tc.args, r.Code, r.Stderr, tc.wantCode)
			continue
		}
		if r.Code != 0 {
			continue
		}
		if tc.summary == "" {
			if r.Stderr != "" {
				t.Errorf("srpc %q: stderr %q, want none", tc.args, r.Stderr)
			}
			continue
		}
		if len(lines) != tc.lines+1 || !strings.HasPrefix(lines[len(lines)-1], tc.summary) {
			t.Errorf("srpc %q: stderr %q; want %d progress lines, then %q…", tc.args, r.Stderr, tc.lines, tc.summary)
			continue
		}
		for _, l := range lines[:tc.lines] {
			if !strings.HasPrefix(l, "srpc: "+tc.args[0]+" vol0: ") || !strings.Contains(l, "% ") && !strings.Contains(l, "%)") {
				t.Errorf("srpc %q: progress line %q", tc.args, l)
			}
		}
	}
}
