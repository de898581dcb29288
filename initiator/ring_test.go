package initiator

import (
	"bytes"
	"testing"
)

func ringWrite(off int64, data []byte) *Request {
	return &Request{Op: OpWrite, Offset: off, Buf: data}
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// TestRingBounded: the ring takes writes until their bytes or its entry
// table are used up, and refuses the next without touching what it holds.
func TestRingBounded(t *testing.T) {
	v := &Volume{}
	q := newReplayRing(make([]byte, 16<<10), 8)
	for i := range 4 {
		if !q.push(v, ringWrite(int64(i)*4096, fill(4096, byte(i+1))), fill(4096, byte(i+1)), uint64(i+1)) {
			t.Fatalf("write %d refused with %d bytes used", i, q.tail-q.head)
		}
	}
	if q.push(v, ringWrite(0, fill(512, 9)), fill(512, 9), 5) {
		t.Fatal("a full ring took 512 more bytes")
	}
	for i := uint64(0); i < 4; i++ {
		if got := q.data(q.at(i), nil); !bytes.Equal(got, fill(4096, byte(i+1))) {
			t.Fatalf("entry %d holds other data", i)
		}
	}
	// The entry table bounds too: data-less WRITE_ZEROES take no bytes.
	q = newReplayRing(make([]byte, 16<<10), 2)
	z := &Request{Op: OpWriteZeroes, Length: 1 << 20}
	if !q.push(v, z, nil, 1) || !q.push(v, z, nil, 2) || q.push(v, z, nil, 3) {
		t.Fatal("entry table of 2 not enforced")
	}
	if e := q.at(0); e.op != OpWriteZeroes || e.n != 1<<20 || e.dlen != 0 {
		t.Fatalf("write-zeroes entry %+v", *e)
	}
}

// TestRingOrderAndWrap: entries come back in the order pushed, and data
// that wraps around the end is made whole in the scratch buffer.
func TestRingOrderAndWrap(t *testing.T) {
	v := &Volume{}
	q := newReplayRing(make([]byte, 10<<10), 16)
	scratch := make([]byte, 8<<10)
	seq := uint64(0)
	push := func(n int, b byte) {
		seq++
		if !q.push(v, ringWrite(int64(seq)*8192, fill(n, b)), fill(n, b), seq) {
			t.Fatalf("push %d (%d bytes) refused", seq, n)
		}
	}
	push(4096, 1)
	push(4096, 2)
	if n := q.trim(v, 1); n != 1 || q.head != 4096 || q.liveN() != 1 {
		t.Fatalf("trim killed %d, head %d, live %d", n, q.head, q.liveN())
	}
	push(6144, 3) // 2 KiB at the end, 4 KiB from the start
	e := q.at(2)
	if e.pos%int64(len(q.buf)) != 8192 {
		t.Fatalf("third entry at %d", e.pos)
	}
	got := q.data(e, scratch)
	if !bytes.Equal(got, fill(6144, 3)) || &got[0] != &scratch[0] {
		t.Fatal("wrapped entry not made whole in scratch")
	}
	if !bytes.Equal(q.data(q.at(1), scratch), fill(4096, 2)) {
		t.Fatal("second entry damaged by the wrap")
	}
	var order []uint64
	for i := q.eh; i < q.et; i++ {
		if e := q.at(i); !e.dead {
			order = append(order, e.seq)
		}
	}
	if len(order) != 2 || order[0] != 2 || order[1] != 3 {
		t.Fatalf("live entries in order %v, want [2 3]", order)
	}
}

// TestRingTrim: a flush kills its volume's entries up to the number it
// covers, and only those; room comes back from the oldest end only, so a
// live entry of another volume there holds it until that one dies too.
func TestRingTrim(t *testing.T) {
	a, b := &Volume{name: "a"}, &Volume{name: "b"}
	q := newReplayRing(make([]byte, 16<<10), 16)
	q.push(b, ringWrite(0, fill(4096, 1)), fill(4096, 1), 1)
	q.push(a, ringWrite(0, fill(4096, 2)), fill(4096, 2), 1)
	q.push(a, ringWrite(4096, fill(4096, 3)), fill(4096, 3), 2)
	q.push(a, ringWrite(8192, fill(4096, 4)), fill(4096, 4), 3)
	if n := q.trim(a, 2); n != 2 {
		t.Fatalf("trim of a up to 2 killed %d", n)
	}
	if q.head != 0 || q.oldest() != b {
		t.Fatalf("head %d moved past b's live entry", q.head)
	}
	if q.push(a, ringWrite(0, fill(4096, 5)), fill(4096, 5), 4) {
		t.Fatal("room taken that b's entry still holds")
	}
	if n := q.drop(b); n != 1 || q.head != 12288 || q.oldest() != a {
		t.Fatalf("drop of b: killed %d, head %d", n, q.head)
	}
	if !q.push(a, ringWrite(0, fill(8192, 6)), fill(8192, 6), 4) {
		t.Fatal("no room after b's entry died")
	}
	if n := q.trim(a, 4); n != 2 || q.liveN() != 0 || q.head != q.tail || q.oldest() != nil {
		t.Fatalf("final trim killed %d, live %d, head %d tail %d", n, q.liveN(), q.head, q.tail)
	}
}
