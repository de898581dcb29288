package block

import "sync"

// syncGroup gives the file backend group commit: concurrent Flush and FUA
// callers share fsyncs. A caller needs one fsync that started after it
// arrived (an fsync already running may have missed its write); whoever
// finds none running starts the next one, and everybody waiting for that
// one returns with it. A failed fsync is sticky: after it the kernel may
// have dropped dirty pages, so no later fsync can prove durability.
type syncGroup struct {
	mu      sync.Mutex
	cond    sync.Cond
	running bool
	started uint64 // fsyncs started
	done    uint64 // fsyncs finished
	err     error  // first failure, sticky
}

// do runs sync (or waits for a concurrent caller's run) so that one full
// fsync starts after do was called, and returns its error.
func (g *syncGroup) do(sync func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond.L == nil {
		g.cond.L = &g.mu
	}
	// The fsync numbered want is the first to start after now.
	want := g.started + 1
	for g.done < want && g.err == nil {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		g.started++
		g.mu.Unlock()
		err := sync()
		g.mu.Lock()
		g.running = false
		g.done++
		if err != nil && g.err == nil {
			g.err = err
		}
		g.cond.Broadcast()
	}
	return g.err
}
