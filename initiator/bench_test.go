package initiator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// runQD keeps qd 4 KiB requests in flight with the asynchronous API for n
// completions and returns per-I/O latencies.
func runQD(tb testing.TB, v *initiator.Volume, op initiator.Op, qd, n int, bufs [][]byte, lat []time.Duration) {
	done := make(chan *initiator.Request, qd)
	reqs := make([]initiator.Request, qd)
	starts := make([]time.Time, qd)
	rng := rand.New(rand.NewPCG(1, 2))
	nblocks := v.Size() / 4096
	submit := func(i int) {
		r := &reqs[i]
		r.Op, r.Buf, r.Offset, r.Done = op, bufs[i], rng.Int64N(nblocks)*4096, done
		starts[i] = time.Now()
		if err := v.Submit(r); err != nil {
			tb.Fatal(err)
		}
	}
	idx := func(r *initiator.Request) int {
		for i := range reqs {
			if &reqs[i] == r {
				return i
			}
		}
		return -1
	}
	for i := 0; i < qd && i < n; i++ {
		submit(i)
	}
	inflight := min(qd, n)
	for k := 0; k < n; k++ {
		r := <-done
		inflight--
		if r.Err != nil {
			tb.Fatal(r.Err)
		}
		i := idx(r)
		if lat != nil {
			lat[k] = time.Since(starts[i])
		}
		if k+inflight+1 < n {
			submit(i)
			inflight++
		}
	}
	for inflight > 0 {
		<-done
		inflight--
	}
}

func benchRig(b *testing.B) *initiator.Volume {
	r := newRig(b, emu.Config{Seed: 7}, 256<<20, target.Config{})
	s := r.dial(b, initiator.Config{Credits: 64})
	v, err := s.Open(context.Background(), "vol0", initiator.OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkRandom4K measures 4 KiB random I/O over the loop wire with the
// memory backend at queue depth 1 and 32; it reports IOPS and p50/p99.
func BenchmarkRandom4K(b *testing.B) {
	for _, op := range []initiator.Op{initiator.OpRead, initiator.OpWrite} {
		for _, qd := range []int{1, 32} {
			b.Run(op.String()+"/qd="+itoa(qd), func(b *testing.B) {
				v := benchRig(b)
				bufs := make([][]byte, qd)
				for i := range bufs {
					bufs[i] = make([]byte, 4096)
				}
				runQD(b, v, op, qd, 2*qd, bufs, nil) // warm up
				lat := make([]time.Duration, b.N)
				b.SetBytes(4096)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				runQD(b, v, op, qd, b.N, bufs, lat)
				el := time.Since(start)
				b.StopTimer()
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.ReportMetric(float64(b.N)/el.Seconds(), "IOPS")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// checkSteadyAllocs fails the test if 4 KiB writes, then reads, at
// queue depth 4 on v allocate more than 0.1 times per I/O once warmed
// up; what names the session in the failure.
func checkSteadyAllocs(t *testing.T, v *initiator.Volume, what string) {
	t.Helper()
	bufs := [][]byte{make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)}
	for _, op := range []initiator.Op{initiator.OpWrite, initiator.OpRead} {
		runQD(t, v, op, 4, 64, bufs, nil)
		a := testing.AllocsPerRun(20, func() { runQD(t, v, op, 4, 64, bufs, nil) })
		// runQD itself allocates its channel and request array once per call.
		if per := a / 64; per > 0.1 {
			t.Errorf("%s (%s): %.2f allocations per I/O (%.0f per run of 64), want 0", op, what, per, a)
		}
	}
}

// TestSteadyStateAllocs asserts that 4 KiB reads and writes through the
// asynchronous API allocate nothing per I/O on the initiator and target
// hot paths (loop wire, memory backend).
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are measured in full runs")
	}
	r := newRig(t, emu.Config{Seed: 3}, 16<<20, target.Config{})
	// Writes with immediate data (the default for 4 KiB) and through a
	// registration and the target's RDMA READ.
	for _, imm := range []int{0, -1} {
		s := r.dial(t, initiator.Config{Credits: 8, ImmediateData: imm})
		checkSteadyAllocs(t, openVol0(t, context.Background(), s), fmt.Sprintf("immediate data %d", imm))
	}
	// Where registrations are fenced (the rxe profile: a barrier and the
	// commands reordered behind it, frmr.Config.FenceRegistrations),
	// every I/O registering.
	rx := newRig(t, emu.Config{Seed: 3, Profile: "rxe"}, 16<<20, target.Config{})
	checkSteadyAllocs(t, openVol0(t, context.Background(), rx.dial(t, initiator.Config{Credits: 8, ImmediateData: -1})), "fenced registrations")
	// With a replay buffer every write is copied into it, and one of
	// 1 MiB fills up every 256 writes of 4 KiB: the copies and the
	// session's own flushes for room allocate nothing either.
	for _, imm := range []int{0, -1} {
		s := r.dial(t, initiator.Config{Credits: 8, ImmediateData: imm, ReplayBuffer: 1 << 20})
		v := openVol0(t, context.Background(), s)
		bufs := [][]byte{make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)}
		runQD(t, v, initiator.OpWrite, 4, 512, bufs, nil)
		a := testing.AllocsPerRun(20, func() { runQD(t, v, initiator.OpWrite, 4, 64, bufs, nil) })
		if per := a / 64; per > 0.1 {
			t.Errorf("replayed writes (immediate data %d): %.2f allocations per I/O (%.0f per run of 64), want 0", imm, per, a)
		}
		if s.Stats().ReplayFlushes == 0 {
			t.Error("the replay buffer never filled up")
		}
	}
}
