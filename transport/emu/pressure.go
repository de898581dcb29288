package emu

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A polling reader that finds a long gap between two of its polls has
// not run in between. Three things cause that: the kernel ran another
// thread on its CPU (the CPUs are oversubscribed, and polling takes time
// from threads that want it), this process's other goroutines ran (the
// reader yields to them), or the hypervisor took the vCPU away. Only the
// first is a reason to stop polling. Taking every long gap for it made
// the readers park after nearly every burst on a 2-vCPU VM whose vCPUs
// are often descheduled and where a pipe round trip between the CPUs
// took 29 µs (perf bench sched pipe): each answer then cost the peer a
// cross-CPU wake-up.
//
// The kernel's pressure stall information tells them apart: the "some"
// line of /proc/pressure/cpu totals the time in which at least one
// runnable task waited for a CPU (Documentation/accounting/psi.rst). Our
// own goroutines and a hypervisor's preemption add nothing to it.
const (
	// pressureEvery is how often the stall total is sampled at most.
	pressureEvery = 2_000_000 // ns
	// pressureShare is the share of wall time with a task waiting for a
	// CPU from which the CPUs count as oversubscribed, in parts per
	// thousand. bench and srpd alone on two vCPUs, both polling, showed
	// 34 (3.4%).
	pressureShare = 100
)

// cpuPressure is the process's gauge, shared by every link's reader and
// opened by the first that needs it.
var cpuPressure = &pressureGauge{path: "/proc/pressure/cpu", fd: -1}

// pressureGauge samples a PSI file.
type pressureGauge struct {
	path string
	open sync.Once
	fd   int // -1: no PSI here (kernel without it, or psi=0)
	over atomic.Bool
	mu   sync.Mutex // the sampler; readers that find it held use over
	at   int64      // clock of the last sample, ns
	last int64      // "some" total at the last sample, µs
	buf  [256]byte
}

// openFile opens the PSI file if it is there and parses; the descriptor
// stays open for the life of the process.
func (g *pressureGauge) openFile() {
	fd, err := unix.Open(g.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	if _, ok := g.read(fd); !ok {
		unix.Close(fd)
		return
	}
	g.fd = fd
}

// oversubscribed reports whether runnable tasks waited for a CPU for at
// least pressureShare of the time since the previous sample (taken at
// most pressureEvery ago; an older one is renewed first). Without PSI
// it reports true, so that a long gap alone counts, as it always did.
func (g *pressureGauge) oversubscribed(now int64) bool {
	g.open.Do(g.openFile)
	if g.fd < 0 {
		return true
	}
	if !g.mu.TryLock() {
		return g.over.Load()
	}
	defer g.mu.Unlock()
	if now-g.at < pressureEvery {
		return g.over.Load()
	}
	total, ok := g.read(g.fd)
	if !ok {
		return g.over.Load()
	}
	if g.at != 0 && now > g.at {
		// µs of stall per ns of wall time, in parts per thousand.
		g.over.Store((total-g.last)*1_000_000/(now-g.at) >= pressureShare)
	}
	g.at, g.last = now, total
	return g.over.Load()
}

// read returns the "some" total of the PSI file open at fd.
func (g *pressureGauge) read(fd int) (int64, bool) {
	n, err := unix.Pread(fd, g.buf[:], 0)
	if err != nil {
		return 0, false
	}
	return parsePressure(g.buf[:n])
}

// parsePressure finds total=N on the first line of a PSI file, which
// starts "some avg10=… avg60=… avg300=… total=N" (µs).
func parsePressure(b []byte) (int64, bool) {
	const some, key = "some ", "total="
	if len(b) < len(some) || string(b[:len(some)]) != some {
		return 0, false
	}
	for i := len(some); i+len(key) <= len(b) && b[i] != '\n'; i++ {
		if string(b[i:i+len(key)]) != key {
			continue
		}
		var v int64
		j := i + len(key)
		for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
			if v > (1<<63-1)/10-1 {
				return 0, false
			}
			v = v*10 + int64(b[j]-'0')
		}
		if j == i+len(key) {
			return 0, false
		}
		return v, true
	}
	return 0, false
}
