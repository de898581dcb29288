package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes are user and system CPU time.
type cpuTimes struct{ User, Sys time.Duration }

func (c cpuTimes) Total() time.Duration { return c.User + c.Sys }

func (c cpuTimes) sub(o cpuTimes) cpuTimes { return cpuTimes{c.User - o.User, c.Sys - o.Sys} }

// selfCPU is this process's CPU time (getrusage RUSAGE_SELF: every thread,
// so in --embedded mode the target's too).
func selfCPU() cpuTimes {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuTimes{}
	}
	tv := func(t syscall.Timeval) time.Duration {
		return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
	}
	return cpuTimes{User: tv(ru.Utime), Sys: tv(ru.Stime)}
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on every
// Linux architecture Go supports).
const clockTick = 100

// procCPU reads a process's CPU time from /proc/PID/stat.
func procCPU(pid int) (cpuTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}, err
	}
	// The command name is in parentheses and may hold spaces; fields count
	// from after its closing parenthesis (field 3 is the state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64) // field 14: utime
	st, err2 := strconv.ParseUint(f[12], 10, 64) // field 15: stime
	if err1 != nil || err2 != nil {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	tick := time.Second / clockTick
	return cpuTimes{User: time.Duration(ut) * tick, Sys: time.Duration(st) * tick}, nil
}

// findTargetPID finds the local process listening on addr: a TCP
// HOST:PORT on this host, or a unix socket path (the shm wire). It
// returns 0 when the target is remote or cannot be found (another user's
// process, no /proc).
func findTargetPID(addr, wire string) int {
	var inode string
	if wire == "shm" || strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "@") {
		inode = unixListenInode(addr)
	} else {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || !isLocalHost(host) {
			return 0
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return 0
		}
		inode = tcpListenInode(p)
	}
	if inode == "" {
		return 0
	}
	return pidOfSocket(inode)
}

func isLocalHost(host string) bool {
	if host == "" || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// tcpListenInode finds the inode of a listening TCP socket on port.
func tcpListenInode(port int) string {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			// sl local_address rem_address st ... inode is field 9
			if len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			_, ps, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(ps, 16, 16); err == nil && int(p) == port {
				fh.Close()
				return fs[9]
			}
		}
		fh.Close()
	}
	return ""
}

// unixListenInode finds the inode of a listening unix socket bound to path.
func unixListenInode(path string) string {
	fh, err := os.Open("/proc/net/unix")
	if err != nil {
		return ""
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// Num RefCount Protocol Flags Type St Inode Path; flag 00010000 is __SO_ACCEPTCON
		if len(fs) >= 8 && fs[7] == path && fs[3] == "00010000" {
			return fs[6]
		}
	}
	return ""
}

// pidOfSocket finds a process holding socket:[inode] open.
func pidOfSocket(inode string) int {
	want := "socket:[" + inode + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == self {
			continue
		}
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}
