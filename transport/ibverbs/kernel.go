//go:build linux

package ibverbs

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// rxe is part of the kernel, so what it does is what the running kernel's
// release does: the quirks that changed between releases are chosen by
// it (quirksFor).

// kernelRelease is the running kernel's release, as uname -r prints it;
// "" if it cannot be read.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelVersion reads major, minor and patch from release
// ("6.12.95+deb12-amd64" is 6, 12, 95; Debian's "6.1.0-41-amd64" hides
// its patch level behind 0); ok is false for a release it cannot read.
func kernelVersion(release string) (major, minor, patch int, ok bool) {
	var v [3]int
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, 0, false
	}
	for i, p := range parts {
		end := strings.IndexFunc(p, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(p)
		}
		n, err := strconv.Atoi(p[:end])
		if err != nil {
			if i < 2 {
				return 0, 0, 0, false
			}
			break // "6.10.x": no patch level
		}
		v[i] = n
		if end < len(p) {
			break // "6.10-rc1": what follows is not a version number
		}
	}
	return v[0], v[1], v[2], true
}

// kernelAtLeast reports whether release names version major.minor or
// later; false for a release it cannot read.
func kernelAtLeast(release string, major, minor int) bool {
	x, y, _, ok := kernelVersion(release)
	return ok && (x > major || x == major && y >= minor)
}

// rxeReplaysOnErr reports whether rxe in release executes again, for
// every receive still posted, a request its responder carried out as its
// QP entered ERR (transport.Quirks.ReplayOnErr). Linux 6.1 does not: its
// check_resource completes the remaining receives WR_FLUSH_ERR when the
// QP is in error. 6.12.95 does, and oopses when the request is a
// SEND_WITH_INV (the second invalidation of a window already FREE:
// rxe_do_invalidate_mw puts its NULL QP); Debian's 6.12.111 carries the
// fix ("RDMA/rxe: Avoid reprocessing the current packet after the QP
// enters the error state"), and 6.12.118's do_complete ends such a
// packet with CLEANUP (its faults run passes 40 of 40 with remote
// invalidation; test/rxe/README.md, GOSRP_RXE_KERNEL_PKG). Releases
// between 6.1 and 6.12.111, later
// series whose fix is not known here, and releases it cannot read are
// taken as affected: the cost is remote invalidation, the alternative a
// kernel oops.
func rxeReplaysOnErr(release string) bool {
	x, y, z, ok := kernelVersion(release)
	switch {
	case !ok:
		return true
	case x < 6 || x == 6 && y <= 1:
		return false
	case x == 6 && y == 12 && z >= 111:
		return false
	}
	return true
}
