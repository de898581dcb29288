package cli

import "strings"

// sysmonSetting keeps the Go runtime's sysmon thread out of its deep
// sleep: runtime.sysmon parks on a note whenever every P is idle, and
// then whichever thread next makes a P busy must wake it (a futex
// wake-up and a context switch), after which it polls every 20 µs
// again. A storage process goes idle and busy again once per I/O at low
// queue depths and many times a millisecond at high ones, so on a host
// with two shared cores those wake-ups and polls took a tenth of the
// target's CPU samples and doubled the latency of a 4 KiB read at QD1
// over tcp. Any schedtrace value above zero turns the deep sleep off
// (it exists so that the trace keeps its cadence); this one asks for a
// trace every 24.8 days, the largest interval the setting holds, so the
// only trace line ever printed is one at start-up on a host up that
// long. Without the deep sleep an idle process's sysmon wakes at most
// every 10 ms.
const sysmonSetting = "schedtrace=2147483647"

// withSysmonSetting returns the GODEBUG value to run with, and false
// when the user's GODEBUG already chose a schedtrace (schedtrace=0
// restores Go's default).
func withSysmonSetting(godebug string) (string, bool) {
	if SetsSchedtrace(godebug) {
		return godebug, false
	}
	if godebug == "" {
		return sysmonSetting, true
	}
	return godebug + "," + sysmonSetting, true
}

// SetsSchedtrace reports whether a GODEBUG value chooses a schedtrace
// interval, which QuietSysmon then leaves as it is.
func SetsSchedtrace(godebug string) bool {
	for _, kv := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(kv), "schedtrace=") {
			return true
		}
	}
	return false
}
