package initiator_test

import (
	"context"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// isolationDevices are the three ways a session on an rxe-like device
// registers I/O: windows over a device that does not check their bounds
// (the initiator isolates: an MR of its own per credit, every I/O
// bounced), the same device with window bounds checked (the only quirk
// changed), and FRMR, which needs no isolation on either.
var isolationDevices = []struct {
	name      string
	mech      frmr.Mechanism
	unchecked bool
}{
	{"mw-unchecked", frmr.MW, true},
	{"mw-checked", frmr.MW, false},
	{"frmr", frmr.FRMR, true},
}

// BenchmarkIsolation measures what isolating I/O costs on a device whose
// windows' bounds are not checked (transport.Quirks.WindowBoundsUnchecked,
// rxe; docs/registration.md#windows-without-bounds-checks): 4 KiB reads
// and writes from Session.AllocBuffer buffers at QD1 and QD32, loop wire,
// memory backend. Besides ns/op it reports the median latency (p50-µs),
// the CPU time of the whole process per I/O (cpu-µs/op: initiator,
// software NIC and target together, so only differences between devices
// mean anything), the bytes copied through a bounce buffer per I/O
// (copied-B/op) and the bytes of memory regions the session registered
// per credit at Dial (MR-B/credit, the target's per-connection MRs
// included, the same for every device). memcpy-4KiB times the copy alone.
// Run it several times (-count, or a loop of runs) and compare medians:
// the copy is a fraction of a microsecond, the spread of a run on a busy
// machine more.
func BenchmarkIsolation(b *testing.B) {
	rxe, err := emu.LookupProfile("rxe")
	if err != nil {
		b.Fatal(err)
	}
	const credits = 32
	// The copy isolation adds, alone: the floor of its cost per I/O.
	b.Run("memcpy-4KiB", func(b *testing.B) {
		src, dst := make([]byte, 4096), make([]byte, 4096)
		b.SetBytes(4096)
		for b.Loop() {
			copy(dst, src)
		}
	})
	// Devices innermost, so the runs compared are next to each other in
	// time on a machine whose load drifts.
	for _, op := range []initiator.Op{initiator.OpRead, initiator.OpWrite} {
		for _, qd := range []int{1, 32} {
			for _, dev := range isolationDevices {
				b.Run(op.String()+"/qd="+itoa(qd)+"/"+dev.name, func(b *testing.B) {
					q := rxe.Quirks
					q.WindowBoundsUnchecked = dev.unchecked
					r := newRig(b, emu.Config{Seed: 7, Quirks: &q}, 256<<20, target.Config{})
					before := registeredMR(r.ip)
					s := r.dial(b, initiator.Config{Mechanism: dev.mech, Credits: credits, BufferBytes: qd * 4096})
					v, err := s.Open(context.Background(), "vol0", initiator.OpenOptions{})
					if err != nil {
						b.Fatal(err)
					}
					regPerCredit := float64(registeredMR(r.ip)-before) / credits
					bufs := make([][]byte, qd)
					for i := range bufs {
						if bufs[i], err = s.AllocBuffer(4096); err != nil {
							b.Fatal(err)
						}
					}
					copied := 0
					if initiator.Bounced(s, bufs[0]) {
						copied = 4096
					}
					runQD(b, v, op, qd, 2*qd, bufs, nil) // warm up
					lat := make([]time.Duration, b.N)
					b.SetBytes(4096)
					b.ReportAllocs()
					b.ResetTimer()
					cpu0 := cpuTime()
					runQD(b, v, op, qd, b.N, bufs, lat)
					cpu := cpuTime() - cpu0
					b.StopTimer()
					sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
					b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
					b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
					b.ReportMetric(float64(copied), "copied-B/op")
					b.ReportMetric(regPerCredit, "MR-B/credit")
				})
			}
		}
	}
}

// registeredMR is the number of bytes the software NIC's live memory
// regions (not FRMRs or windows) cover.
func registeredMR(p *emu.Provider) int64 {
	var n int64
	for _, idx := range p.MemObjects("mr") {
		if info, ok := p.MRInfo(idx); ok {
			n += int64(info.Len)
		}
	}
	return n
}

// cpuTime is the user and system time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
