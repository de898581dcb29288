package transporttest

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

func init() {
	register("Send/PollWhilePosting", testPollWhilePosting)
}

// testPollWhilePosting: the device may complete a work request, and
// another goroutine poll its completion, before PostSend or PostRecv has
// returned. Every signaled SEND and every receive must still complete
// exactly once and in order while each CQ is polled without pause by a
// goroutine of its own. The ibverbs provider once published its ring
// slots only after ibv_post_send returned and dropped a completion that
// came sooner as stale; on rxe one SEND in a few hundred lost its
// completion, and the initiator tore its QP down.
func testPollWhilePosting(t *testing.T, p transport.Provider) {
	const (
		n      = 2000
		window = 32 // SENDs A may have ahead of B's reposted receives
		slots  = 64 // B's receive buffers
		size   = 64
	)
	pr := connectPair(t, p, pairConfig{sendWR: 2 * window, recvWR: slots})
	a, b := pr.a, pr.b
	src := newBuf(t, p, a.pd, size, transport.AccessLocalWrite)
	dst := newBuf(t, p, b.pd, slots*size, transport.AccessLocalWrite)
	for i := 0; i < slots; i++ {
		postRecv(t, b.qp, recvWR(uint64(i), dst.sge(i*size, size)))
	}

	var (
		mu       sync.Mutex
		problems []string
		received atomic.Int64 // receives B has completed and reposted
		sendDone atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	var once sync.Once
	fail := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
		once.Do(func() { close(stop) }) // every goroutine stops at once
	}
	// poll drains cq until want completions came or stop; each must be
	// the next ID in order and succeed. got is what it has seen.
	poll := func(cq transport.CQ, what string, want int64, got *atomic.Int64, each func(transport.WC)) {
		defer wg.Done()
		wcs := make([]transport.WC, 16)
		last := time.Now()
		for got.Load() < want {
			select {
			case <-stop:
				return
			default:
			}
			k, err := cq.Poll(wcs)
			if err != nil {
				fail("%s: Poll: %v", what, err)
				return
			}
			if k == 0 {
				if time.Since(last) > 4*Timeout {
					fail("%s: no completion for %v after %d of %d", what, 4*Timeout, got.Load(), want)
					return
				}
				runtime.Gosched()
				continue
			}
			last = time.Now()
			for _, wc := range wcs[:k] {
				if wc.Status != transport.StatusSuccess {
					fail("%s: completion %#x %v", what, wc.ID, wc.Status)
					return
				}
				if next := uint64(got.Load()); wc.ID != next {
					fail("%s: completion %#x, want %#x: a completion was lost or reordered", what, wc.ID, next)
					return
				}
				got.Add(1)
				each(wc)
			}
		}
	}
	// B's receives are reposted by a goroutine of their own, so B's poller
	// can see a receive complete before the PostRecv that posted it has
	// returned.
	repost := make(chan uint64, slots)
	wg.Add(3)
	go poll(a.scq, "sender", n, &sendDone, func(transport.WC) {})
	go poll(b.rcq, "receiver", n, new(atomic.Int64), func(wc transport.WC) { repost <- wc.ID })
	go func() {
		defer wg.Done()
		for id := uint64(0); id < n; id++ {
			var done uint64
			select {
			case done = <-repost:
			case <-stop:
				return
			}
			next := done + slots
			if next < n+slots {
				if _, err := b.qp.PostRecv([]transport.RecvWR{recvWR(next, dst.sge(int(next%slots)*size, size))}); err != nil {
					fail("PostRecv %d: %v", next, err)
					return
				}
			}
			received.Add(1)
		}
	}()

	deadline := time.Now().Add(20 * Timeout)
send:
	for i := int64(0); i < n; i++ {
		for i-received.Load() >= window || i-sendDone.Load() >= window {
			select {
			case <-stop:
				break send
			default:
			}
			if time.Now().After(deadline) {
				fail("sender: stuck at %d SENDs, %d received", i, received.Load())
				break send
			}
			runtime.Gosched()
		}
		if _, err := a.qp.PostSend([]transport.SendWR{{ID: uint64(i), Opcode: transport.OpSend, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{src.sge(0, size)}}}); err != nil {
			fail("PostSend %d: %v", i, err)
			break
		}
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * Timeout):
		fail("pollers still running after %v", 20*Timeout)
		<-waited
	}
	for _, s := range problems {
		t.Error(s)
	}
	if len(problems) == 0 && sendDone.Load() != n {
		t.Errorf("%d of %d SEND completions", sendDone.Load(), n)
	}
}
