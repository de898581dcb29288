package e2etest

import (
	"reflect"
	"testing"
)

// TestParseFUSEMounts: the FUSE mounts are found by file system type
// after the separator, whatever optional fields come before it, with
// the device minor that names their control directory.
func TestParseFUSEMounts(t *testing.T) {
	info := `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 0:57 / /tmp/TestMount1/001/mnt rw,nosuid,nodev,relatime shared:160 master:3 - fuse srpc:vol0 rw,user_id=0,group_id=0
302 22 0:58 / /home/u/x rw,relatime - fuse.sshfs u@h:/ rw
303 22 0:59 / /sys/fs/fuse/connections rw,relatime - fusectl fusectl rw
`
	want := []fuseMount{
		{dir: "/tmp/TestMount1/001/mnt", minor: "57", source: "srpc:vol0"},
		{dir: "/home/u/x", minor: "58", source: "u@h:/"},
	}
	if got := parseFUSEMounts(info); !reflect.DeepEqual(got, want) {
		t.Fatalf("parseFUSEMounts:\n got %+v\nwant %+v", got, want)
	}
}

// TestThreadState: the state letter follows the command name, which may
// itself hold spaces and parentheses.
func TestThreadState(t *testing.T) {
	for stat, want := range map[string]string{
		"4242 (srpc) D 1 4242 4242 0 -1":    "state D",
		"4243 (a (b) c) S 1 4242 4242 0 -1": "state S",
		"garbage":                           "",
	} {
		if got := threadState(stat); got != want {
			t.Errorf("threadState(%q) = %q, want %q", stat, got, want)
		}
	}
}
