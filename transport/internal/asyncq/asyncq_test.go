package asyncq

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/gosrp/gosrp/transport"
)

func ev(n uint32) transport.AsyncEvent {
	return transport.AsyncEvent{Type: transport.EventQPFatal, QPNum: n}
}

// A full queue drops and counts; what it holds comes out in order.
func TestPostDropsWhenFull(t *testing.T) {
	q := New(2)
	for i, want := range []bool{true, true, false, false} {
		if got := q.Post(ev(uint32(i))); got != want {
			t.Fatalf("Post #%d = %v, want %v", i, got, want)
		}
	}
	if got := q.Dropped(); got != 2 {
		t.Fatalf("Dropped() = %d, want 2", got)
	}
	for want := range uint32(2) {
		got, err := q.Next(context.Background(), nil, "dev")
		if err != nil || got.QPNum != want {
			t.Fatalf("Next = %+v, %v; want QP %d", got, err, want)
		}
	}
}

// A queued event comes before a cancelled context and a closed device,
// and only an empty queue reports them.
func TestNextPrefersQueuedEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	close(done)
	q := New(4)
	for i := range uint32(3) {
		q.Post(ev(i))
	}
	for want := range uint32(3) {
		got, err := q.Next(ctx, done, "dev")
		if err != nil || got.QPNum != want {
			t.Fatalf("Next = %+v, %v; want QP %d before the cancel and the close", got, err, want)
		}
	}
	if _, err := q.Next(ctx, nil, "dev"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next on an empty queue, cancelled: %v, want context.Canceled", err)
	}
	_, err := q.Next(context.Background(), done, "emu: device events")
	if !errors.Is(err, transport.ErrClosed) || err.Error() != "emu: device events: transport: closed" {
		t.Fatalf("Next on an empty queue, closed: %v, want ErrClosed after the device's name", err)
	}
}

// Next waits for an event posted later.
func TestNextWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New(1)
		got := make(chan transport.AsyncEvent, 1)
		go func() {
			e, _ := q.Next(context.Background(), nil, "dev")
			got <- e
		}()
		synctest.Wait() // Next is blocked, or has returned
		if len(got) != 0 {
			t.Fatalf("Next returned %+v from an empty queue", <-got)
		}
		q.Post(ev(7))
		if e := <-got; e.QPNum != 7 {
			t.Fatalf("Next = %+v, want QP 7", e)
		}
	})
}
