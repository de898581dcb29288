package fusedisk

import (
	"log/slog"
	"sync"
	"time"
)

// errLogEvery is how often an I/O error that repeats is logged again.
const errLogEvery = 10 * time.Second

// errLog logs the I/O errors of a mount without a line for each: a
// volume that fails every request (replaced under the mount, its target
// gone past the loss deadline) fails every read and write of the file
// system above, thousands a second under writeback, and each once had
// its line. The first error of a kind is logged at once; the same error
// again, whatever the operation and offset, only after errLogEvery, with
// how many went unlogged meanwhile, which a different error's line
// reports too.
type errLog struct {
	log *slog.Logger     // nil: slog.Default()
	now func() time.Time // nil: time.Now

	mu         sync.Mutex
	msg        string // the last error logged
	at         time.Time
	suppressed int
}

func (l *errLog) report(op string, off, n int64, err error) {
	msg := err.Error()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	l.mu.Lock()
	if msg == l.msg && now.Sub(l.at) < errLogEvery {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	more := l.suppressed
	l.msg, l.at, l.suppressed = msg, now, 0
	l.mu.Unlock()
	args := []any{"op", op, "offset", off, "length", n, "err", err}
	if more > 0 {
		args = append(args, "unlogged_before", more)
	}
	log := l.log
	if log == nil {
		log = slog.Default()
	}
	log.Error("fusedisk: I/O error", args...)
}
