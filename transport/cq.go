package transport

import "context"

// CQ is a completion queue shared by any number of QPs' send and receive
// queues.
type CQ interface {
	// Poll moves up to len(wcs) completions into the caller's slice and
	// returns how many (ibv_poll_cq). It never allocates and never blocks.
	// After an overrun it returns ErrCQOverrun: the CQ is dead (IBA CQ
	// error, IBV_EVENT_CQ_ERR) and every QP on it has been moved to ERR.
	Poll(wcs []WC) (int, error)
	// Wait blocks until the CQ may hold a completion, the context ends, or
	// the CQ is closed (ibv_req_notify_cq plus the completion channel).
	// Spurious returns are allowed; callers poll after every return.
	Wait(ctx context.Context) error
	// Depth is the number of completions the CQ holds before it overruns.
	Depth() int
	// Close destroys the CQ once no QP uses it.
	Close() error
}

// CQNotifier is implemented by CQs that can signal completions on a
// channel, so an event loop can select on them with its other inputs
// instead of running a goroutine in Wait. The channel receives a value
// (coalesced) after completions are added; as with Wait, a consumer polls
// until the CQ is empty before it waits on the channel again, and spurious
// wake-ups are allowed. It is never closed: a closed or dead CQ reports
// through Poll.
type CQNotifier interface {
	Notify() <-chan struct{}
}
