//go:build linux && cgo && ibverbs

package ibverbs

import (
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/faults"
	"github.com/gosrp/gosrp/transport/transporttest"
)

// TestConformance runs the transport conformance suite on the first RDMA
// device (rxe in the VM of test/rxe/run.sh).
func TestConformance(t *testing.T) {
	needDevice(t)
	// rxe under TCG: completions and connection setup take milliseconds,
	// with tails far longer than on hardware.
	transporttest.Timeout = 30 * time.Second
	// Both ways of waiting: the provider's default, and the adaptive
	// busy poll srpd runs with (cmd/srpd), whose waits end by a
	// completion found while polling as often as by one that wakes them.
	for _, opts := range []transport.Options{nil, {"busy_poll": "adaptive"}} {
		name := "busy_poll=default"
		if opts != nil {
			name = "busy_poll=" + opts["busy_poll"]
		}
		t.Run(name, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T) transport.Provider {
				p, err := transport.Open(Name, opts)
				if err != nil {
					t.Fatal(err)
				}
				return p
			})
		})
	}
}

// TestConformanceFaults runs the suite's fault tests (post failures, QP
// errors, lost and failed completions, link cuts) on the real device
// through transport/faults, which makes those faults without the device's
// help; the software NIC's run of the same tests is its own.
func TestConformanceFaults(t *testing.T) {
	needDevice(t)
	transporttest.Timeout = 30 * time.Second
	faultTest := func(name string) bool {
		return strings.HasPrefix(name, "Inject/") || strings.HasSuffix(name, "/PostFailureMidChain")
	}
	transporttest.RunMatching(t, faultTest, func(t *testing.T) transport.Provider {
		p, err := transport.Open(Name, nil)
		if err != nil {
			t.Fatal(err)
		}
		return faults.Wrap(p, faults.Config{})
	})
}

// needDevice skips the test when the host has no RDMA device.
func needDevice(t *testing.T) {
	t.Helper()
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
}
