package target

import (
	"context"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// TestShrinkUnderRequest: a READ held at the volume while the volume
// shrinks past it (the sessions told first, as srpd does, then the
// store) fails at the store, and is answered out of range: the volume
// shrank, its medium is fine. It was answered MEDIUM ERROR, and srpc
// said "medium error" of an import into a volume resized under it.
func TestShrinkUnderRequest(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		gate, entered := r.gateReads()
		c := r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		cmd := c.io(wire.OpRead, h, volSize-bs, 0, bs, 1)
		c.postCommand(&cmd)
		<-entered
		if err := r.tgt.VolumeResized(context.Background(), "vol0", volSize/2); err != nil {
			t.Fatal(err)
		}
		v, err := r.store.Open("vol0")
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Resize(volSize / 2); err != nil {
			t.Fatal(err)
		}
		v.Close()
		close(gate)
		rsp, _ := c.readResponse()
		if rsp.Status != wire.StatusError || rsp.Sense != wire.SenseOutOfRange {
			t.Fatalf("a READ past the new end, held at the store during the shrink: status %v sense %v; want out of range", rsp.Status, rsp.Sense)
		}
	})
}
