package initiator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
)

// openGate holds the opens of a gateway's store while it is shut (an
// RBD image whose OSDs stopped answering).
type openGate struct {
	mu sync.Mutex
	ch chan struct{} // non-nil: shut
}

func (g *openGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
}

func (g *openGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

func (g *openGate) wait() {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// gatedClient is a gatewaytest client whose opens pass its gate.
type gatedClient struct {
	*gatewaytest.Client
	g *openGate
}

func (c gatedClient) Open(name string) (block.Volume, error) {
	c.g.wait()
	return c.Client.Open(name)
}

func (c gatedClient) OpenShared(name string) (block.Volume, error) {
	c.g.wait()
	return c.Client.OpenShared(name)
}

// TestMultipathLateVolume: QD8 stamped writes through the first gateway;
// the host's connection to it is lost (its QPs forced to error), and its
// store then hangs when the volume is opened again. The path reconnects
// at once, but the volume does not come back with it: the target
// answers NOT READY after its OpenWait (300 ms), a late volume
// (initiator/late_open.go), and the writes wait on it. FastFail (2 s) is
// longer than OpenWait, so no connection stays down long enough to
// count as lost: the late volume's own deadline, the path's
// LossTimeout (Multipath sets it to FastFail), must fail the writes
// over. They go on through the second gateway, which takes the volume
// over, and every acknowledged write reads back.
func TestMultipathLateVolume(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{openWait: 300 * time.Millisecond})
	r.fastFail, r.lossTimeout = 2*time.Second, 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	if mv.Path() != r.addrs[0] {
		t.Fatalf("active path %s, want the first", mv.Path())
	}
	gens, took := writesThrough(t, mv, func() {
		r.gates[0].shut()
		for _, q := range r.nics[0].QPs() {
			if err := r.nics[0].InjectQPError(q, 0); err != nil {
				t.Error(err)
			}
		}
	})
	t.Logf("loss with the store hung → first write acknowledged through the other gateway: %v (OpenWait 300 ms, FastFail %v)", took, r.fastFail)
	if took > r.lossTimeout {
		t.Errorf("the failover took %v, past the session's LossTimeout (%v): the late volume's writes waited for the connection's deadline, not the path's", took, r.lossTimeout)
	}
	r.checkMoved(t, mv, gens)
}
