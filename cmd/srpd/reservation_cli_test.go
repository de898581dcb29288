package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// TestReservationsCLI is reservations as a user meets them: hostA
// registers and reserves vol0 with srpc reserve; hostB's import fails in
// one line naming the volume and the reservation, its export works;
// srpc reserve show and srpd status name the holder; a second reserve by
// hostB is refused in one line saying by whom; after hostB preempts
// hostA, hostB imports and hostA's import is refused. An exclusive
// import refuses a second exclusive one and another session's plain
// import, and ends with its session.
func TestReservationsCLI(t *testing.T) {
	srpd, srpc, data, addr := startSrpd(t, "--default-volume-size", "8MiB")
	conn := func(host string) []string { return []string{"--target", addr, "--name", host, "--timeout", "10s"} }
	run := func(host string, args ...string) e2etest.Result {
		t.Helper()
		return e2etest.Run(t, nil, srpc, append(append(args[:1:1], conn(host)...), args[1:]...)...)
	}
	reserve := func(host string, args ...string) e2etest.Result {
		t.Helper()
		return e2etest.Run(t, nil, srpc, append(append([]string{"reserve", args[0]}, conn(host)...), args[1:]...)...)
	}
	ok := func(r e2etest.Result, what string) {
		t.Helper()
		if r.Code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", what, r.Code, r.Stderr)
		}
	}
	oneLine := func(r e2etest.Result, what string, want ...string) {
		t.Helper()
		msg := strings.TrimSpace(r.Stderr)
		if r.Code != 1 || strings.Contains(msg, "\n") {
			t.Fatalf("%s: exit %d, stderr %q; want exit 1 and one line", what, r.Code, r.Stderr)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Fatalf("%s: %q does not say %q", what, msg, w)
			}
		}
		t.Logf("%s: %s", what, msg)
	}
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}

	ok(reserve("hostA", "register", "vol0", "0xa"), "register")
	ok(reserve("hostA", "reserve", "--key", "0xa", "vol0"), "reserve")
	oneLine(run("hostB", "import", "vol0", img), "hostB's import under hostA's reservation", `volume "vol0" is reserved by another host`)
	ok(run("hostB", "export", "--length", "4096", "vol0", os.DevNull), "hostB's export under a write-exclusive reservation")
	oneLine(reserve("hostB", "reserve", "--key", "0xb", "vol0"), "hostB's reserve unregistered", `initiator "hostB" is not registered`)
	ok(reserve("hostB", "register", "vol0", "0xb"), "hostB registers")
	oneLine(reserve("hostB", "reserve", "--key", "0xb", "vol0"), "hostB's reserve", `reserved write-exclusive by initiator "hostA"`)

	show := reserve("hostB", "show", "vol0")
	ok(show, "show")
	for _, w := range []string{`write-exclusive by "hostA" (key 0xa)`, `"hostB" key 0xb`, "generation: 2"} {
		if !strings.Contains(strings.Join(strings.Fields(show.Stdout), " "), w) {
			t.Fatalf("srpc reserve show does not say %q:\n%s", w, show.Stdout)
		}
	}
	st := e2etest.MustRun(t, srpd, "status", "--data", data)
	if !strings.Contains(st.Stdout, "RESERVED") || !strings.Contains(st.Stdout, "hostA,hostB") {
		t.Fatalf("srpd status does not show the reservation:\n%s", st.Stdout)
	}

	ok(reserve("hostB", "preempt", "--key", "0xb", "--victim", "0xa", "--abort", "vol0"), "preempt")
	ok(run("hostB", "import", "vol0", img), "hostB's import after its preempt")
	oneLine(run("hostA", "import", "vol0", img), "hostA's import after it was preempted", `volume "vol0" is reserved by another host`)
	ok(reserve("hostB", "clear", "--key", "0xb", "vol0"), "clear")

	// Exclusive opens.
	imp := startImport(t, srpc, append(conn("hostE"), "--exclusive", "vol0", "-")...)
	if _, err := imp.stdin.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	waitSession(t, srpd, data, "hostE")
	oneLine(run("hostF", "import", "--exclusive", "vol0", img), "a second exclusive import", `volume "vol0" is open exclusively by another session`)
	oneLine(run("hostF", "import", "vol0", img), "a plain import under an exclusive one", `volume "vol0" is reserved by another host`)
	show = reserve("hostF", "show", "vol0")
	if !strings.Contains(show.Stdout, `exclusive open: by "hostE"`) {
		t.Fatalf("srpc reserve show under an exclusive open:\n%s", show.Stdout)
	}
	imp.stdin.Close()
	imp.Wait(t, time.Minute, "the exclusive import after its input ended")
	if code := imp.ExitCode(); code != 0 {
		t.Fatalf("the exclusive import: exit %d\n%s", code, imp.Output())
	}
	ok(run("hostF", "import", "--exclusive", "vol0", img), "an exclusive import after the other ended")
	r := run("hostF", "mount", "--exclusive", "--read-only", "vol0", t.TempDir())
	if r.Code != 2 || !strings.Contains(r.Stderr, "--exclusive and --read-only exclude each other") {
		t.Fatalf("mount --exclusive --read-only: exit %d, stderr %q; want a usage error", r.Code, r.Stderr)
	}
}
