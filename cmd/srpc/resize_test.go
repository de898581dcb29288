package main

import (
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/servetest"
)

// TestExportSizeFollowsResize: after a resize on the target, srpc nbd
// offers the new size to the next NBD negotiation even when the volume
// was idle (nbdVolume.Size asks the target), and the FUSE disk file,
// whose size is the Volume's, follows too. Before, both kept the size of
// the OPEN until srpc was restarted.
func TestExportSizeFollowsResize(t *testing.T) {
	const mib = 1 << 20
	r := servetest.NewRig(t)
	sv, err := r.Store.Create("vol0", mib, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	_, v := r.Open(t, "vol0", initiator.Config{})
	if err := sv.Resize(3 * mib); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Target.VolumeResized(ctx, "vol0", 3*mib); err != nil {
		t.Fatal(err)
	}
	if v.Size() != mib {
		t.Fatalf("an idle volume learned the size without a command: %d", v.Size())
	}
	if got := (&nbdVolume{v: v}).Size(); got != 3*mib {
		t.Fatalf("NBD export size after the grow: %d, want %d", got, 3*mib)
	}
	if got := (fuseVolume{v}).Size(); got != 3*mib {
		t.Fatalf("FUSE disk size after the grow: %d, want %d", got, 3*mib)
	}
}
