package initiator

import (
	"slices"
	"testing"
)

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
			var q queue
			rs := make([]Request, 4)
			for i := range rs {
				rs[i].Offset = int64(i)
				q.push(&rs[i])
			}
			got := q.popFirst(func(r *Request) bool { return r.Offset == int64(tc.take) })
			if tc.take < 0 && got != nil || tc.take >= 0 && got != &rs[tc.take] {
				t.Fatalf("popFirst returned %v", got)
			}
			var extra Request
			extra.Offset = 9
			q.push(&extra) // the tail must still be right
			var order []int
			for r := q.pop(); r != nil; r = q.pop() {
				order = append(order, int(r.Offset))
			}
			if want := append(slices.Clone(tc.left), 9); !slices.Equal(order, want) || q.n != 0 || q.tail != nil {
				t.Fatalf("left %v (n %d), want %v", order, q.n, want)
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
			var q queue
			rs := make([]Request, 5)
			for i := range rs {
				rs[i].Offset = int64(i)
				q.push(&rs[i])
			}
			got := q.extract(func(r *Request) bool { return slices.Contains(tc.take, int(r.Offset)) })
			drain := func(q *queue) []int {
				var extra Request
				extra.Offset = 9
				q.push(&extra) // the tail must still be right
				var order []int
				for r := q.pop(); r != nil; r = q.pop() {
					order = append(order, int(r.Offset))
				}
				if q.n != 0 || q.tail != nil {
					t.Fatalf("drained to n %d, tail %v", q.n, q.tail)
				}
				return order
			}
			if n := got.n; n != len(tc.take) || q.n != len(tc.left) {
				t.Fatalf("counts: taken %d, left %d; want %d, %d", n, q.n, len(tc.take), len(tc.left))
			}
			if o, want := drain(&got), append(slices.Clone(tc.take), 9); !slices.Equal(o, want) {
				t.Fatalf("taken %v, want %v", o, want)
			}
			if o, want := drain(&q), append(slices.Clone(tc.left), 9); !slices.Equal(o, want) {
				t.Fatalf("left %v, want %v", o, want)
			}
		})
	}
}
