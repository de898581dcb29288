//go:build linux && cgo && ibverbs

package ibverbs

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

func TestBusyPollOption(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", DefaultBusyPoll, true}, // option absent
		{"0", 0, true},
		{"200us", 200 * time.Microsecond, true},
		{"2ms", 2 * time.Millisecond, true},
		{"1s", time.Second, true},
		{"adaptive", DefaultBusyPoll, true},
		{"2s", 0, false},
		{"-1us", 0, false},
		{"50", 0, false}, // a duration needs its unit
		{"fast", 0, false},
	} {
		opts := transport.Options{}
		if tc.v != "" {
			opts["busy_poll"] = tc.v
		}
		p, err := New(opts)
		if !tc.ok {
			if !errors.Is(err, transport.ErrInvalidArgument) {
				t.Errorf("busy_poll=%q: err %v, want ErrInvalidArgument", tc.v, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("busy_poll=%q: %v", tc.v, err)
			continue
		}
		if p.busyPoll != tc.want || p.adaptive != (tc.v == "adaptive") {
			t.Errorf("busy_poll=%q: %v (adaptive %v), want %v", tc.v, p.busyPoll, p.adaptive, tc.want)
		}
	}
}

// TestWaitBusyPoll checks the waiting discipline by what Wait did, not by
// how long it took: with a busy poll, a completion that comes while Wait
// polls ends it without arming the CQ; without one, every Wait on an
// empty CQ arms it and sleeps.
func TestWaitBusyPoll(t *testing.T) {
	for _, tc := range []struct {
		busyPoll   string
		arms, hits uint64 // want, for one SEND's completion
		sleeps     uint64
	}{
		{"1s", 0, 1, 0},
		{"0", 1, 0, 1},
	} {
		t.Run("busy_poll="+tc.busyPoll, func(t *testing.T) {
			pr := newPair(t, newProviderOpts(t, transport.Options{"busy_poll": tc.busyPoll}))
			a := &pr.a
			before := a.cq.WaitStats()
			// Wait on the empty CQ first, then post: the completion comes
			// while Wait polls (busy_poll=1s) or sleeps (0).
			waited := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				waited <- a.cq.Wait(ctx)
			}()
			for tc.sleeps > 0 && a.cq.WaitStats().Sleeps == before.Sleeps {
				// Post only once Wait has armed and found the CQ empty.
				runtime.Gosched()
			}
			post(t, a.qp, transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}, RemoteAddr: pr.b.addr(0), RKey: pr.b.mr.RKey()})
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			expect(t, waitWC(t, a.cq), 1, transport.StatusSuccess)
			got := a.cq.WaitStats()
			d := WaitStats{got.BusyHits - before.BusyHits, got.Arms - before.Arms, got.Sleeps - before.Sleeps}
			if want := (WaitStats{tc.hits, tc.arms, tc.sleeps}); d != want {
				t.Errorf("Wait did %+v, want %+v", d, want)
			}
		})
	}
}

// A busy poll ends with the context, without arming.
func TestWaitBusyPollCancel(t *testing.T) {
	p := newProviderOpts(t, transport.Options{"busy_poll": "1s"})
	dv, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	c, err := dv.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
	if s := c.(*CQ).WaitStats(); s.Arms != 0 || s.Sleeps != 0 {
		t.Fatalf("a Wait cut short in its busy poll armed or slept: %+v", s)
	}
}
