package e2etest

import (
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// AbortFUSE aborts the FUSE connection mounted at dir, if any, and
// detaches the mount lazily: every request waiting on it fails with
// ENOTCONN and a server stuck in one of its own requests can exit. The
// connection's control directory is named for the mount's device minor
// (Documentation/filesystems/fuse.rst, "Control filesystem").
func AbortFUSE(dir string) {
	for _, m := range fuseMounts() {
		if m.dir == dir {
			abort(m)
		}
	}
}

type fuseMount struct{ dir, minor, source string }

// fuseMounts lists this mount namespace's FUSE mounts from
// /proc/self/mountinfo (proc(5): mount point in field 5, major:minor in
// field 3, file system type and source after the " - " separator).
func fuseMounts() []fuseMount {
	info, _ := os.ReadFile("/proc/self/mountinfo")
	return parseFUSEMounts(string(info))
}

func parseFUSEMounts(info string) []fuseMount {
	var ms []fuseMount
	for _, line := range strings.Split(info, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 || g[0] != "fuse" && !strings.HasPrefix(g[0], "fuse.") {
			continue
		}
		if _, minor, ok := strings.Cut(f[2], ":"); ok {
			ms = append(ms, fuseMount{dir: f[4], minor: minor, source: g[1]})
		}
	}
	return ms
}

func abort(m fuseMount) {
	const ctl = "/sys/fs/fuse/connections"
	if _, err := os.Stat(ctl + "/" + m.minor); err != nil {
		// The control file system is not mounted where no init
		// system did it (fusectl, Documentation/filesystems/fuse.rst).
		unix.Mount("fusectl", ctl, "fusectl", 0, "")
	}
	os.WriteFile(ctl+"/"+m.minor+"/abort", []byte("1"), 0)
	exec.Command("umount", "-l", m.dir).Run()
}
