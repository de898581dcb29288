package target

import (
	"fmt"
	"runtime"
	"testing"

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
// disconnect cycles must end with the live heap where it was after the
// first few; each connection that kept its link (two 256 KiB transmit
// batches on tcp, the QP, the connection) would add megabytes.
func TestConnectionsReleased(t *testing.T) {
	const warm, cycles = 10, 200
	for _, w := range []string{emu.WireTCP, emu.WireShm} {
		t.Run(w, func(t *testing.T) {
			r := newRig(t, env{w, "strict"}, Config{})
			cycle := func(i int) {
				// A subtest per cycle, so that the client its cleanup
				// list holds is released with it.
				t.Run("cycle", func(t *testing.T) {
					c := r.dial(t)
					c.login(fmt.Sprintf("ini-%d", i))
					c.close()
				})
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
					before, after, cycles, float64(after-before)/cycles)
			}
		})
	}
}
