package initiator

// replayRing holds copies of acknowledged writes in the order they were
// acknowledged: data in one preallocated byte ring, entries in a
// preallocated table, so keeping a copy allocates nothing. Space comes
// back only from the oldest end, as entries die (a flush covered them,
// their volume lost them or closed). Session.dmu guards it.
type replayRing struct {
	buf        []byte
	head, tail int64 // data positions, counting from the start: used = tail - head
	ents       []replayEntry
	eh, et     uint64 // entry indexes, counting from the start
	live       int
}

// replayEntry is one acknowledged write. A DISCARD or WRITE_ZEROES takes
// no bytes, only its range, and is replayed as itself.
type replayEntry struct {
	vol  *Volume
	op   Op
	off  int64
	n    int64 // length of the range written
	pos  int64 // where the data starts in buf (a write's data may wrap)
	dlen int64 // bytes of data held
	seq  uint64
	dead bool
}

func newReplayRing(buf []byte, entries int) *replayRing {
	return &replayRing{buf: buf, ents: make([]replayEntry, entries)}
}

func (q *replayRing) at(i uint64) *replayEntry { return &q.ents[i%uint64(len(q.ents))] }

func (q *replayRing) liveN() int { return q.live }

// push appends a copy of r (data is what it wrote); false if there is no
// room for it.
func (q *replayRing) push(v *Volume, r *Request, data []byte, seq uint64) bool {
	dlen := int64(len(data))
	if q.et-q.eh == uint64(len(q.ents)) || q.tail-q.head+dlen > int64(len(q.buf)) {
		return false
	}
	e := q.at(q.et)
	*e = replayEntry{vol: v, op: r.Op, off: r.Offset, n: r.length(), pos: q.tail, dlen: dlen, seq: seq}
	p := int(q.tail % int64(len(q.buf)))
	if k := copy(q.buf[p:], data); k < len(data) {
		copy(q.buf, data[k:])
	}
	q.tail += dlen
	q.et++
	q.live++
	return true
}

// data is an entry's data: a view of the ring, or, when it wraps around
// the end, a copy made whole in scratch.
func (q *replayRing) data(e *replayEntry, scratch []byte) []byte {
	p := int(e.pos % int64(len(q.buf)))
	if p+int(e.dlen) <= len(q.buf) {
		return q.buf[p : p+int(e.dlen)]
	}
	b := scratch[:e.dlen]
	k := copy(b, q.buf[p:])
	copy(b[k:], q.buf)
	return b
}

// trim kills v's entries numbered up to upTo (a flush covered them) and
// reports how many.
func (q *replayRing) trim(v *Volume, upTo uint64) int {
	return q.kill(func(e *replayEntry) bool { return e.vol == v && e.seq <= upTo })
}

// drop kills all of v's entries.
func (q *replayRing) drop(v *Volume) int {
	return q.kill(func(e *replayEntry) bool { return e.vol == v })
}

func (q *replayRing) kill(match func(*replayEntry) bool) int {
	n := 0
	for i := q.eh; i < q.et; i++ {
		if e := q.at(i); !e.dead && match(e) {
			e.dead = true
			e.vol = nil // the table must not keep a closed volume alive
			n++
		}
	}
	q.live -= n
	for q.eh < q.et && q.at(q.eh).dead {
		q.eh++
	}
	if q.eh == q.et {
		q.head = q.tail
	} else {
		q.head = q.at(q.eh).pos
	}
	return n
}

// oldest is the volume of the entry holding the oldest bytes, whose flush
// frees room first; nil if the ring is empty.
func (q *replayRing) oldest() *Volume {
	if q.eh == q.et {
		return nil
	}
	return q.at(q.eh).vol
}
