package target

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/gosrp/gosrp/transport/emu"
)

// heapInuse is the live heap after two collections (the second frees
// what finalizers of the first released).
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestConnectionsReleased: a connection that has ended, logged in or
// not, leaves nothing behind on either side. 200 connect, login and
// disconnect cycles (GOSRP_LEAK_CYCLES=N: N; issue 21's figure is 1,000)
// must end with the live heap within 10% of where it was after the first
// few; each connection that kept its link (two 256 KiB transmit batches
// on tcp, the QP, the connection) would add megabytes.
func TestConnectionsReleased(t *testing.T) {
	const warm = 10
	cycles := int(testenv.Int(t, "GOSRP_LEAK_CYCLES", 200, 1))
	for _, w := range []string{emu.WireTCP, emu.WireShm} {
		t.Run(w, func(t *testing.T) {
			r := newRig(t, env{w, "strict"}, Config{})
			cycle := func(i int) {
				ct := &cycleTB{TB: t}
				c := r.dial(ct)
				c.login(fmt.Sprintf("ini-%d", i))
				c.close()
				ct.done()
				waitFor(t, "the target to end the connection", func() bool { return r.tgt.Stats().Connections == 0 })
			}
			for i := range warm {
				cycle(i)
			}
			before := heapInuse()
			for i := range cycles {
				cycle(warm + i)
			}
			after := heapInuse()
			t.Logf("live heap after %d cycles: %d B, after %d more: %d B", warm, before, cycles, after)
			if after > before+before/10 {
				t.Errorf("live heap grew from %d to %d bytes over %d connections (%.0f bytes each)",
					before, after, cycles, float64(after-before)/float64(cycles))
			}
		})
	}
}

// cycleTB is t for one cycle: it runs the cleanups the cycle registered
// when the cycle ends, so that its client is released with it. A subtest
// per cycle would do the same, but the testing package keeps every
// subtest's name for good (about 75 bytes each), which is the kind of
// growth the test looks for.
type cycleTB struct {
	testing.TB
	cleanups []func()
}

func (c *cycleTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

func (c *cycleTB) done() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
}
