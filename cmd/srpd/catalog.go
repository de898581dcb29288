package main

import (
	"strings"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
)

// catalog serves a block.Store to the target: every volume read-write, and
// every snapshot read-only as VOLUME@SNAPSHOT.
type catalog struct{ store block.Store }

func (c catalog) List() ([]target.VolumeInfo, error) {
	vols, err := c.store.List()
	if err != nil {
		return nil, err
	}
	snapper, _ := c.store.(block.Snapshotter)
	out := make([]target.VolumeInfo, 0, len(vols))
	for _, v := range vols {
		out = append(out, target.VolumeInfo{Name: v.Name, Size: v.Size, BlockSize: v.BlockSize})
		if snapper == nil {
			continue
		}
		snaps, err := snapper.Snapshots(v.Name)
		if err != nil {
			return nil, err
		}
		for _, s := range snaps {
			out = append(out, target.VolumeInfo{Name: s.Volume + "@" + s.Name, Size: s.Size, BlockSize: s.BlockSize, ReadOnly: true})
		}
	}
	return out, nil
}

// OpenVolume returns a block.Volume, which the target closes (io.Closer).
func (c catalog) OpenVolume(name string) (target.Volume, error) {
	if vol, snap, ok := strings.Cut(name, "@"); ok {
		if s, isSnap := c.store.(block.Snapshotter); isSnap {
			return s.OpenSnapshot(vol, snap)
		}
		return nil, block.ErrNotFound
	}
	return c.store.Open(name)
}
