package cli

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// QuietSysmon re-executes the program with sysmonSetting added to
// GODEBUG, which the runtime reads only at start-up, unless GODEBUG
// already sets schedtrace. Programs call it first in main; it returns
// when there is nothing to do or the exec failed (the program then runs
// with Go's default).
func QuietSysmon() {
	godebug, ok := withSysmonSetting(os.Getenv("GODEBUG"))
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	syscall.Exec(exe, os.Args, append(env, "GODEBUG="+godebug))
}
