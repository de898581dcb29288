// Package storecatalog serves the volumes of a block.Store to a target:
// it is the target.Catalog that srpd, bench's embedded target and the
// tests hand to target.New.
//
//	st, _ := block.OpenStore("pebble", dir)
//	tgt, _ := target.New(target.Config{Catalog: storecatalog.Catalog{Store: st}})
//
// Every volume is served read-write under its name. When the store
// takes snapshots (block.Snapshotter), every snapshot is served too,
// read-only, as VOLUME@SNAPSHOT.
package storecatalog

import (
	"strings"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
)

// Catalog is a target.Catalog over Store.
type Catalog struct{ Store block.Store }

var _ target.Catalog = Catalog{}

// List implements target.Catalog: the volumes, each followed by its
// snapshots.
func (c Catalog) List() ([]target.VolumeInfo, error) {
	vols, err := c.Store.List()
	if err != nil {
		return nil, err
	}
	snapper, _ := c.Store.(block.Snapshotter)
	out := make([]target.VolumeInfo, 0, len(vols))
	for _, v := range vols {
		out = append(out, target.VolumeInfo{Name: v.Name, Size: v.Size, BlockSize: v.BlockSize, Identity: v.Identity})
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

// OpenVolume implements target.Catalog; it returns a block.Volume, which
// the target closes (io.Closer).
func (c Catalog) OpenVolume(name string) (target.Volume, error) {
	if vol, snap, ok := strings.Cut(name, "@"); ok {
		if s, isSnap := c.Store.(block.Snapshotter); isSnap {
			return s.OpenSnapshot(vol, snap)
		}
		return nil, block.ErrNotFound
	}
	return c.Store.Open(name)
}
