package block

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// maskValue is the value of the range keys that mask lower layers (see
// doc.go); only the presence of the range key matters.
var maskValue = []byte{'z'}

// pebbleCore is an open pebble volume or snapshot, shared by its handles.
type pebbleCore struct {
	coreState
	s    *PebbleStore
	db   *pebble.DB
	vol  string
	snap string

	// meta is guarded by mu: a request sees one size and one layer chain
	// from check to commit.
	meta *volumeMeta
}

func newPebbleCore(s *PebbleStore, m *volumeMeta) *pebbleCore {
	c := &pebbleCore{coreState: coreState{nm: m.Name, bs: m.BlockSize, id: volumeIdentity(m.Name, m.Snapshot, m.Created)},
		s: s, db: s.db, vol: m.Name, snap: m.Snapshot, meta: m}
	if m.Snapshot != "" {
		c.nm, c.readOnly = m.Name+"@"+m.Snapshot, true
	}
	return c
}

func (c *pebbleCore) size() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.meta.Size
}

func (c *pebbleCore) caps() Caps {
	if c.readOnly {
		return CapPersistent
	}
	return CapFlush | CapFUA | CapDiscard | CapWriteZeroes | CapResize | CapSnapshot | CapPersistent
}

// check validates a request. REQUIRES: c.mu held (shared is enough).
func (c *pebbleCore) check(op string, off, n int64, write bool) error {
	return c.checkReq(op, off, n, c.meta.Size, write)
}

func (c *pebbleCore) readAt(p []byte, off int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.check("read", off, n, false); err != nil {
		return err
	}
	var err error
	switch {
	case len(c.meta.Layers) > 1:
		err = c.readChain(p, off)
	case len(p) == c.bs:
		err = c.readOne(p, off)
	default:
		err = c.readRange(p, off)
	}
	if err != nil {
		return ioErr(c.nm, "read", n, off, err)
	}
	return nil
}

// readOne reads one block of a single-layer volume with a point lookup.
func (c *pebbleCore) readOne(p []byte, off int64) error {
	var key [dataKeyLen]byte
	putDataKey(key[:], c.meta.Layers[0], off/int64(c.bs))
	v, closer, err := c.db.Get(key[:])
	if errors.Is(err, pebble.ErrNotFound) {
		clear(p)
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	return c.copyBlock(p, v, key[:])
}

func (c *pebbleCore) copyBlock(dst, v, key []byte) error {
	if len(v) != c.bs {
		return fmt.Errorf("data key %x holds %d bytes, want %d: %w", key, len(v), c.bs, ErrCorrupt)
	}
	copy(dst, v)
	return nil
}

// readRange reads several blocks of a single-layer volume with one
// iterator, zero-filling the blocks it does not find.
func (c *pebbleCore) readRange(p []byte, off int64) error {
	bs := int64(c.bs)
	first, end := off/bs, (off+int64(len(p)))/bs
	layer := c.meta.Layers[0]
	var lo, hi [dataKeyLen]byte
	putDataKey(lo[:], layer, first)
	putDataKey(hi[:], layer, end)
	it, err := c.db.NewIter(&pebble.IterOptions{LowerBound: lo[:], UpperBound: hi[:]})
	if err != nil {
		return err
	}
	next := first // first block not yet filled
	for ok := it.First(); ok; ok = it.Next() {
		_, blk, ok := parseDataKey(it.Key())
		if !ok || blk < next || blk >= end {
			_ = it.Close()
			return fmt.Errorf("unexpected key %x: %w", it.Key(), ErrCorrupt)
		}
		clear(p[(next-first)*bs : (blk-first)*bs])
		v, err := it.ValueAndErr()
		if err == nil {
			err = c.copyBlock(p[(blk-first)*bs:(blk-first+1)*bs], v, it.Key())
		}
		if err != nil {
			_ = it.Close()
			return err
		}
		next = blk + 1
	}
	clear(p[(next-first)*bs:])
	return firstErr(it.Error(), it.Close())
}

// readChain reads through a layer chain: for each block, the first layer
// (newest first) that has the block as a point key supplies it; a layer
// whose mask range key covers the block ends the search with zeros.
func (c *pebbleCore) readChain(p []byte, off int64) error {
	bs := int64(c.bs)
	first := off / bs
	it, err := c.db.NewIter(&pebble.IterOptions{
		KeyTypes:   pebble.IterKeyTypePointsAndRanges,
		LowerBound: []byte{kindData},
		UpperBound: []byte{kindData + 1},
	})
	if err != nil {
		return err
	}
	var key [dataKeyLen]byte
	for i := int64(0); i < int64(len(p))/bs; i++ {
		dst := p[i*bs : (i+1)*bs]
		found := false
		for _, layer := range c.meta.Layers {
			putDataKey(key[:], layer, first+i)
			if !it.SeekGE(key[:]) || !bytes.Equal(it.Key(), key[:]) {
				continue // nothing for this block in this layer
			}
			if hasPoint, _ := it.HasPointAndRange(); hasPoint {
				v, err := it.ValueAndErr()
				if err == nil {
					err = c.copyBlock(dst, v, key[:])
				}
				if err != nil {
					_ = it.Close()
					return err
				}
			} else {
				clear(dst) // masked: discarded or cut off at this layer
			}
			found = true
			break
		}
		if !found {
			clear(dst)
		}
	}
	return firstErr(it.Error(), it.Close())
}

func (c *pebbleCore) writeAt(p []byte, off int64, fua bool) error {
	op, opts := writeOp(fua), pebble.NoSync
	if fua {
		opts = pebble.Sync
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := int64(len(p))
	if err := c.check(op, off, n, true); err != nil {
		return err
	}
	if err := c.s.space.admit(n); err != nil {
		return ioErr(c.nm, op, n, off, err)
	}
	// One batch per request: a multi-block write is atomic, and with
	// pebble.Sync it joins pebble's group commit.
	b := c.db.NewBatch()
	c.setBlocksLocked(b, p, off)
	if err := c.db.Apply(b, opts); err != nil {
		return ioErr(c.nm, op, n, off, err)
	}
	_ = b.Close()
	return nil
}

// writeBatch applies several writes as one pebble batch: one trip through
// pebble's commit pipeline (sequence numbers, WAL record, memtable, publish)
// instead of one per request. Every request is checked before any is added,
// so an invalid one fails the whole call and changes nothing.
func (c *pebbleCore) writeBatch(bufs [][]byte, offs []int64) error {
	if len(bufs) != len(offs) {
		return fmt.Errorf("block: volume %q: write batch: %d buffers for %d offsets: %w", c.nm, len(bufs), len(offs), ErrInvalid)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	var total int64
	for i, p := range bufs {
		if err := c.check("write", offs[i], int64(len(p)), true); err != nil {
			return err
		}
		total += int64(len(p))
	}
	if err := c.s.space.admit(total); err != nil {
		return fmt.Errorf("block: volume %q: write batch of %d requests: %w", c.nm, len(bufs), err)
	}
	b := c.db.NewBatch()
	for i, p := range bufs {
		c.setBlocksLocked(b, p, offs[i])
	}
	if err := c.db.Apply(b, pebble.NoSync); err != nil {
		return fmt.Errorf("block: volume %q: write batch of %d requests: %w", c.nm, len(bufs), err)
	}
	_ = b.Close()
	return nil
}

// setBlocksLocked adds to b the blocks of a checked write of p at off, one
// key each in the top layer. REQUIRES: c.mu (shared is enough).
func (c *pebbleCore) setBlocksLocked(b *pebble.Batch, p []byte, off int64) {
	bs := int64(c.bs)
	layer := c.meta.Layers[0]
	var key [dataKeyLen]byte
	for i := int64(0); i < int64(len(p)); i += bs {
		putDataKey(key[:], layer, (off+i)/bs)
		_ = b.Set(key[:], p[i:i+bs], nil)
	}
}

// stalled reports whether pebble is holding writes back.
func (c *pebbleCore) stalled() bool { return c.s.stalls.Load() > 0 }

// flush syncs pebble's WAL. An empty batch is not enough (pebble commits
// it without touching the WAL); a LogData record is written and synced,
// and because the WAL is a sequential log the sync covers every record
// before it. Concurrent callers share fsyncs through pebble's group commit.
func (c *pebbleCore) flush() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.usable("flush", false); err != nil {
		return err
	}
	if c.readOnly {
		return nil // nothing was written through this handle
	}
	// The LogData record needs a few bytes of WAL, which pebble would
	// die for on a file system something else has filled (admitWAL).
	if err := c.s.space.admitWAL(false); err != nil {
		return fmt.Errorf("block: volume %q: flush: %w", c.nm, err)
	}
	if err := c.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("block: volume %q: flush: %w", c.nm, err)
	}
	return nil
}

// zeroRangeLocked adds to b what makes blocks [first, end) of the top
// layer read as zeros: a range deletion of its point keys and, when older
// layers lie below, a mask range key over the same span. REQUIRES: c.mu.
func (c *pebbleCore) zeroRangeLocked(b *pebble.Batch, first int64, endKey []byte) {
	layer := c.meta.Layers[0]
	start := dataKey(layer, first)
	_ = b.DeleteRange(start, endKey, nil)
	if len(c.meta.Layers) > 1 {
		_ = b.RangeKeySet(start, endKey, nil, maskValue, nil)
	}
}

func (c *pebbleCore) zero(op string, off, n int64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.check(op, off, n, true); err != nil {
		return err
	}
	// A few bytes of WAL, as for flush.
	if err := c.s.space.admitWAL(false); err != nil {
		return ioErr(c.nm, op, n, off, err)
	}
	bs := int64(c.bs)
	b := c.db.NewBatch()
	c.zeroRangeLocked(b, off/bs, dataKey(c.meta.Layers[0], (off+n)/bs))
	if err := c.db.Apply(b, pebble.NoSync); err != nil {
		return ioErr(c.nm, op, n, off, err)
	}
	_ = b.Close()
	return nil
}

// discard is a range deletion: O(1) work whatever the length.
func (c *pebbleCore) discard(off, n int64) error { return c.zero("discard", off, n) }

// writeZeroes is the same range deletion: no zero block is ever stored.
func (c *pebbleCore) writeZeroes(off, n int64) error { return c.zero("write-zeroes", off, n) }

func (c *pebbleCore) resize(n int64) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.resizable(n); err != nil {
		return err
	}
	what := fmt.Sprintf("volume %q: resize to %d", c.nm, n)
	if err := s.checkOvercommitLocked(what, c.meta.Size, n); err != nil {
		return err
	}
	m := c.meta.clone()
	b := s.db.NewBatch()
	if n < m.Size {
		// Drop (and mask) everything from the new end to the end of the
		// layer, not just to the old size, so growing later reads zeros
		// even where an older layer was larger.
		c.zeroRangeLocked(b, n/int64(c.bs), layerEnd(m.Layers[0]))
	}
	m.Size = n
	m.Generation++
	_ = b.Set(volumeKey(c.vol), encodeRecord(m), nil)
	if err := s.commitMetaLocked(b, what); err != nil {
		return err
	}
	c.meta = m
	return nil
}
