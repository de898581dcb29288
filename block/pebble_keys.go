package block

import "encoding/binary"

// Pebble key layout (see doc.go). Every key starts with a one-byte kind so
// the kinds occupy disjoint, contiguous key ranges.
const (
	kindFormat    = 'f' // "f": the storeMeta record
	kindNextLayer = 'n' // "n": next unused layer id, 8 bytes big-endian
	kindVolume    = 'v' // "v" + name: a volumeMeta record
	kindSnapshot  = 's' // "s" + volume + 0x00 + snapshot: a volumeMeta record
	kindData      = 'd' // "d" + layer (8 BE) + block index (8 BE): one block
)

// dataKeyLen is the length of a data key.
const dataKeyLen = 17

// maxLayerID bounds layer ids so layer+1 never overflows in range ends.
const maxLayerID = 1 << 62

var (
	keyFormat    = []byte{kindFormat}
	keyNextLayer = []byte{kindNextLayer}
)

func volumeKey(name string) []byte { return append([]byte{kindVolume}, name...) }

func snapshotKey(volume, snap string) []byte {
	k := append([]byte{kindSnapshot}, volume...)
	k = append(k, 0)
	return append(k, snap...)
}

// snapshotPrefix is the prefix of every snapshot key of a volume; volume
// names contain no 0x00, so it matches no other volume's snapshots.
func snapshotPrefix(volume string) []byte {
	return append(append([]byte{kindSnapshot}, volume...), 0)
}

// putDataKey writes the key of block blk of layer into k (dataKeyLen
// bytes). Big-endian integers make pebble's bytewise order equal to the
// numeric order, so one layer's blocks are contiguous and sorted.
func putDataKey(k []byte, layer uint64, blk int64) {
	_ = k[dataKeyLen-1]
	k[0] = kindData
	binary.BigEndian.PutUint64(k[1:9], layer)
	binary.BigEndian.PutUint64(k[9:17], uint64(blk))
}

func dataKey(layer uint64, blk int64) []byte {
	k := make([]byte, dataKeyLen)
	putDataKey(k, layer, blk)
	return k
}

// layerEnd is the exclusive upper bound of every key of layer.
func layerEnd(layer uint64) []byte { return dataKey(layer+1, 0) }

// parseDataKey splits a data key; ok is false for anything else.
func parseDataKey(k []byte) (layer uint64, blk int64, ok bool) {
	if len(k) != dataKeyLen || k[0] != kindData {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(k[1:9]), int64(binary.BigEndian.Uint64(k[9:17])), true
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}
