package main

import (
	"log/slog"

	"github.com/gosrp/gosrp/target"
)

// setLiveACL makes ACL changes reach the running target: through
// SetACL when the target has it; otherwise they apply at the next start.
func setLiveACL(t *target.Target, a *access, log *slog.Logger) bool {
	if s, ok := any(t).(interface{ SetACL(*target.ACL) }); ok {
		a.mu.Lock()
		a.onACL = s.SetACL
		a.mu.Unlock()
		return true
	}
	a.mu.Lock()
	a.onACL = func(*target.ACL) {
		log.Warn("ACL saved; it takes effect when srpd restarts (this target cannot swap its ACL live)")
	}
	a.mu.Unlock()
	return false
}
