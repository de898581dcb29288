// Package asyncq is a device's queue of asynchronous events for the
// providers: what ibv_get_async_event(3) hands out, in the contract's
// terms (transport.AsyncEvent). The device posts without ever waiting
// for a consumer and drops an event it has no room for, as a real
// device's async queue overflows; Device.NextEvent takes the events in
// order:
//
//	q := asyncq.New(256)
//	q.Post(transport.AsyncEvent{Type: transport.EventQPFatal, QPNum: n})
//	ev, err := q.Next(ctx, done, "emu: device events")
//
// An event already queued is returned before a cancelled context or a
// closed device is reported, so a consumer draining the queue after a
// fatal error sees every event that was raised.
package asyncq

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/gosrp/gosrp/transport"
)

// Queue is a bounded queue of asynchronous events, safe for concurrent
// use. Make one with New.
type Queue struct {
	ch      chan transport.AsyncEvent
	dropped atomic.Uint64
}

// New returns a queue that holds up to depth events.
func New(depth int) *Queue {
	return &Queue{ch: make(chan transport.AsyncEvent, depth)}
}

// Post queues ev, or drops and counts it when the queue is full. It
// reports whether ev was queued; it never blocks.
func (q *Queue) Post(ev transport.AsyncEvent) bool {
	select {
	case q.ch <- ev:
		return true
	default:
		q.dropped.Add(1)
		return false
	}
}

// Dropped returns how many events Post has dropped.
func (q *Queue) Dropped() uint64 { return q.dropped.Load() }

// Next returns the oldest queued event, waiting for one until ctx is
// done (ctx.Err()) or done is closed (transport.ErrClosed, after what,
// which names the device in the error).
func (q *Queue) Next(ctx context.Context, done <-chan struct{}, what string) (transport.AsyncEvent, error) {
	select {
	case ev := <-q.ch:
		return ev, nil
	default:
	}
	select {
	case ev := <-q.ch:
		return ev, nil
	case <-ctx.Done():
		return transport.AsyncEvent{}, ctx.Err()
	case <-done:
		return transport.AsyncEvent{}, fmt.Errorf("%s: %w", what, transport.ErrClosed)
	}
}
