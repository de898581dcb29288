//go:build linux && cgo && ibverbs

package ibverbs

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestSlowDestroyBlocksNoOne: a QP whose ibv_destroy_qp takes long (rxe
// waits for the kernel's references to it, RXE_POOL_TIMEOUT, and under
// churn a destroy was seen to take 9 minutes) holds up no one else:
// its state calls answer as for a closed QP, its peer's disconnect
// reaches the connection manager's event loop, which moves the QP to
// ERR (toErr) and must not wait on the destroy, and a new connection
// is made meanwhile. Before, Close held stateMu across the destroy, the
// event loop stopped in toErr, and every connection on the device
// timed out behind the one slow QP.
func TestSlowDestroyBlocksNoOne(t *testing.T) {
	p := newProvider(t)
	pr := newPair(t, p)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookDestroyQP = func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	t.Cleanup(func() { testHookDestroyQP = nil })
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)

	closed := make(chan error, 1)
	go func() { closed <- pr.b.qp.Close() }()
	<-entered

	// Each call below either returns or hangs the test: a hang is the
	// failure, reported after a minute (the rxe VM runs under TCG).
	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("%s waited on the QP's destroy", what)
		}
	}
	within("State", func() {
		if st := pr.b.qp.State(); st != transport.QPErr {
			t.Errorf("State of a QP being destroyed: %s, want ERR", st)
		}
	})
	within("Modify", func() {
		if err := pr.b.qp.Modify(transport.QPErr); !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Modify of a QP being destroyed: %v, want ErrClosed", err)
		}
	})
	// The active side's disconnect sends a DREQ; the passive side's
	// event loop answers it and moves the destroyed QP's state: toErr.
	// A connection made after it needs the same event loop; newPair
	// fails the test when the connect times out.
	within("the peer's disconnect", func() { pr.a.conn.Disconnect() })
	newPair(t, p)
	unblock()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := pr.b.qp.State(); st != transport.QPErr {
		t.Errorf("State after Close: %s, want ERR", st)
	}
}
