package main

import (
	"testing"

	"github.com/gosrp/gosrp/block"
)

// TestSnapshotNames: a refused volume delete names the first three
// snapshots and counts the rest, so that the line stays one line.
func TestSnapshotNames(t *testing.T) {
	snaps := func(names ...string) []block.SnapshotInfo {
		out := make([]block.SnapshotInfo, len(names))
		for i, n := range names {
			out[i].Name = n
		}
		return out
	}
	for _, tc := range []struct {
		snaps []block.SnapshotInfo
		want  string
	}{
		{snaps("a"), "v@a"},
		{snaps("a", "b", "c"), "v@a, v@b, v@c"},
		{snaps("a", "b", "c", "d", "e"), "v@a, v@b, v@c, and 2 more"},
	} {
		if got := snapshotNames("v", tc.snaps); got != tc.want {
			t.Errorf("snapshotNames(%d snapshots) = %q, want %q", len(tc.snaps), got, tc.want)
		}
	}
}
