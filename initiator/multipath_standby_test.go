package initiator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
)

// TestMultipathWedgedStandby: the active gateway dies while the
// standby's store hangs in the takeover (its BeforeActive does not
// return, as srpd's load of the volume's reservations from a cluster it
// can no longer reach). No path can serve the volume, so a write must
// fail with ErrConnectionLost about LossTimeout after its path failed,
// saying the takeover did not finish, not wait on the takeover (it did
// until IOTimeout, 30 s, ended the takeover's connection); once the store answers again, the
// next write goes through the second gateway, which took the volume
// over, and the block written before the kill reads back. The handle
// of the takeover the write gave up on is closed once it completes.
func TestMultipathWedgedStandby(t *testing.T) {
	hung := make(chan struct{})
	var released bool
	r := newGatewayRigOpts(t, rigOpts{beforeActive: func(i int, name string) error {
		if i == 1 {
			<-hung
		}
		return nil
	}})
	release := func() {
		if !released {
			released = true
			close(hung)
		}
	}
	defer release()
	r.lossTimeout = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	buf := make([]byte, 4096)
	pattern(buf, 0, 1, 1)
	if _, err := mv.WriteAtContext(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}

	r.stop[0]()
	at := time.Now()
	done := make(chan *initiator.Request, 1)
	if err := mv.Submit(&initiator.Request{Op: initiator.OpWrite, Buf: make([]byte, 4096), Offset: 8192, Done: done}); err != nil {
		t.Fatal(err)
	}
	_, err := mv.WriteAtContext(ctx, buf, 4096)
	took := time.Since(at)
	t.Logf("active killed, standby's takeover hung: the write failed after %v: %v", took, err)
	for what, err := range map[string]error{"a write": err, "a submitted write": (<-done).Err} {
		if !errors.Is(err, initiator.ErrConnectionLost) || !strings.Contains(err.Error(), "takeover") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s no gateway can serve: %q, want ErrConnectionLost and the takeover's failure, on one line", what, err)
		}
	}
	if took := time.Since(at); took > 2*r.lossTimeout {
		t.Errorf("the writes failed after %v: they waited on the hung takeover past LossTimeout (%v)", took, r.lossTimeout)
	}

	release()
	pattern(buf, 1, 1, 1)
	if _, err := mv.WriteAtContext(ctx, buf, 4096); err != nil {
		t.Fatalf("a write once the standby's store answers: %v", err)
	}
	if mv.Path() != r.addrs[1] {
		t.Fatalf("path %s after the store answered, want the second gateway", mv.Path())
	}
	verifyStamps(t, mv, []uint32{1, 1})
	// The takeover the first write gave up on completed once the store
	// answered: its handle is closed, not left open at the gateway
	// beside the one the second write's takeover opened.
	open := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		open = 0
		for _, c := range r.tgts[1].Stats().Conns {
			open += c.OpenVolumes
		}
		if open == 1 || time.Now().After(deadline) {
			break
		}
	}
	if open != 1 {
		t.Errorf("%d handles open at the second gateway, want 1: an abandoned takeover's handle was left open", open)
	}
}
