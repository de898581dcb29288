// Package logsink is an io.Writer that tests hand to what logs or prints
// from its own goroutines (a target's slog handler, a child process's
// stdout and stderr, an NBD server's log) and read while it is still
// being written: a bytes.Buffer is not safe for that, and the race
// detector says so.
//
//	var logs logsink.Buffer
//	tgt, _ := target.New(target.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
//	...
//	if !strings.Contains(logs.String(), "session ended") { ... }
package logsink

import (
	"bytes"
	"sync"
)

// Buffer collects what is written to it; its methods are safe for
// concurrent use. The zero value is an empty buffer.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
