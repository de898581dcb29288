//go:build linux && cgo && ibverbs

package ibverbs

import (
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/transporttest"
)

// TestConformance runs the transport conformance suite on the first RDMA
// device (rxe in the VM of test/rxe/run.sh).
func TestConformance(t *testing.T) {
	probe, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	names, err := probe.Devices()
	probe.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Skip("no RDMA device: ibv_get_device_list returned none (run test/rxe/run.sh for the rxe VM)")
	}
	// rxe under TCG: completions and connection setup take milliseconds,
	// with tails far longer than on hardware.
	transporttest.Timeout = 30 * time.Second
	transporttest.Run(t, func(t *testing.T) transport.Provider {
		p, err := transport.Open(Name, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}
