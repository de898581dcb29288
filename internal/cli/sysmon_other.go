//go:build !linux

package cli

// QuietSysmon does nothing off Linux, where the programs' speed on a
// few shared cores was not measured.
func QuietSysmon() {}
