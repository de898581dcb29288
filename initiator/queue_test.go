package initiator

import (
	"slices"
	"testing"
)

// numbered is a queue of n requests whose offsets are 0 to n-1.
func numbered(n int) (queue, []Request) {
	var q queue
	rs := make([]Request, n)
	for i := range rs {
		rs[i].Offset = int64(i)
		q.push(&rs[i])
	}
	return q, rs
}

// drainWithTail pushes a request of offset 9 (the tail must still be
// right), pops q empty and returns the offsets in order; q must end
// with no count and no tail.
func drainWithTail(t *testing.T, q *queue) []int {
	t.Helper()
	var extra Request
	extra.Offset = 9
	q.push(&extra)
	var order []int
	for r := q.pop(); r != nil; r = q.pop() {
		order = append(order, int(r.Offset))
	}
	if q.n != 0 || q.tail != nil {
		t.Fatalf("drained to n %d, tail %v", q.n, q.tail)
	}
	return order
}

// TestQueuePopFirst: popFirst takes the first request it accepts from
// the head, the middle or the tail, and leaves the rest in order, with
// head, tail and count right for the pushes and pops that follow.
func TestQueuePopFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		take int // index of the request popFirst accepts; -1: none
		left []int
	}{
		{"the head", 0, []int{1, 2, 3}},
		{"the middle", 2, []int{0, 1, 3}},
		{"the tail", 3, []int{0, 1, 2}},
		{"none", -1, []int{0, 1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, rs := numbered(4)
			got := q.popFirst(func(r *Request) bool { return r.Offset == int64(tc.take) })
			if tc.take < 0 && got != nil || tc.take >= 0 && got != &rs[tc.take] {
				t.Fatalf("popFirst returned %v", got)
			}
			if order, want := drainWithTail(t, &q), append(slices.Clone(tc.left), 9); !slices.Equal(order, want) {
				t.Fatalf("left %v, want %v", order, want)
			}
		})
	}
}

// TestQueueExtract: extract takes the requests it accepts, wherever they
// stand, in their order, and leaves the rest in theirs, with head, tail
// and counts right for the pushes and pops that follow.
func TestQueueExtract(t *testing.T) {
	for _, tc := range []struct {
		name       string
		take, left []int
	}{
		{"none", nil, []int{0, 1, 2, 3, 4}},
		{"all", []int{0, 1, 2, 3, 4}, nil},
		{"the head and the tail", []int{0, 4}, []int{1, 2, 3}},
		{"every other", []int{1, 3}, []int{0, 2, 4}},
		{"a run in the middle", []int{1, 2, 3}, []int{0, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := numbered(5)
			got := q.extract(func(r *Request) bool { return slices.Contains(tc.take, int(r.Offset)) })
			if n := got.n; n != len(tc.take) || q.n != len(tc.left) {
				t.Fatalf("counts: taken %d, left %d; want %d, %d", n, q.n, len(tc.take), len(tc.left))
			}
			if o, want := drainWithTail(t, &got), append(slices.Clone(tc.take), 9); !slices.Equal(o, want) {
				t.Fatalf("taken %v, want %v", o, want)
			}
			if o, want := drainWithTail(t, &q), append(slices.Clone(tc.left), 9); !slices.Equal(o, want) {
				t.Fatalf("left %v, want %v", o, want)
			}
		})
	}
}
