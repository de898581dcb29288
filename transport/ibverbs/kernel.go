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

// kernelAtLeast reports whether release ("6.12.95+deb12-amd64") names
// version major.minor or later; false for a release it cannot read.
func kernelAtLeast(release string, major, minor int) bool {
	maj, rest, ok := strings.Cut(release, ".")
	if !ok {
		return false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	x, err1 := strconv.Atoi(maj)
	y, err2 := strconv.Atoi(rest[:end])
	if err1 != nil || err2 != nil {
		return false
	}
	return x > major || x == major && y >= minor
}
