package cli

import (
	"flag"
	"runtime"
)

// ProcsUsage is the help text of the --procs flag the programs share.
const ProcsUsage = "`N` threads running Go code (GOMAXPROCS; 0: the Go default, one per CPU); 1 suits a host whose few cores initiator and target share"

// RegisterProcs binds the --procs flag to p. Fewer threads than CPUs
// pay off where processes share a few cores: every idle P the Go
// scheduler wakes for a goroutine made ready is a futex wake-up and a
// context switch taken from the peer process.
func RegisterProcs(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "procs", *p, ProcsUsage)
}

// SetProcs applies a --procs value: n > 0 sets GOMAXPROCS to n, 0 leaves
// the runtime's choice; a negative n is a usage error.
func SetProcs(n int) error {
	switch {
	case n < 0:
		return Usagef("--procs %d: want 0 (the Go default) or more", n)
	case n > 0:
		runtime.GOMAXPROCS(n)
	}
	return nil
}
