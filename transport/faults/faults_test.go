package faults_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/faults"
	"github.com/gosrp/gosrp/transport/transporttest"
)

// The hooks the conformance suite's fault tests look for, and which of
// them this package gives every provider.
var (
	_ transporttest.PostFailureInjector = (*faults.Provider)(nil)
	_ transporttest.QPErrorInjector     = (*faults.Provider)(nil)
	_ transporttest.CQEDropInjector     = (*faults.Provider)(nil)
	_ transporttest.CQEStatusInjector   = (*faults.Provider)(nil)
	_ transporttest.LinkCutter          = (*faults.Provider)(nil)
	_ transporttest.Seeder              = (*faults.Provider)(nil)
)

// TestConformance runs the whole conformance suite over the software NIC
// wrapped with no random faults: everything passes through unchanged, and
// the fault tests run through the wrapper's hooks (the NIC's own are
// hidden by it). The same run over ibverbs is in transport/ibverbs.
func TestConformance(t *testing.T) {
	for _, wire := range []string{emu.WireTCP, emu.WireShm} {
		t.Run("wire="+wire, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T) transport.Provider {
				under, err := emu.New(emu.Config{Profile: "rxe", Wire: wire, Seed: 1,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					t.Fatal(err)
				}
				p := faults.Wrap(under, faults.Config{})
				if _, isEmu := transport.Provider(p).(transporttest.StrayInjector); isEmu {
					t.Fatal("the wrapper shows the NIC's own stray hook: its tests would not test the wrapper")
				}
				return p
			})
		})
	}
}

func TestSplitOptions(t *testing.T) {
	for _, tc := range []struct {
		opts    transport.Options
		want    faults.Config
		rest    transport.Options
		any     bool
		wantErr string
	}{
		{opts: transport.Options{"profile": "rxe"}, rest: transport.Options{"profile": "rxe"}},
		{
			opts: transport.Options{"wire": "shm", "fault-seed": "7", "fault-postfail": "0.01", "fault-corruptcqe": "1"},
			want: faults.Config{Seed: 7, PostFail: 0.01, CorruptCQE: 1},
			rest: transport.Options{"wire": "shm"}, any: true,
		},
		{
			opts: transport.Options{"fault-qperror": "0.5", "fault-dropcqe": "0", "fault-linkcut": "0.25"},
			want: faults.Config{QPError: 0.5, LinkCut: 0.25}, rest: transport.Options{}, any: true,
		},
		{
			opts: transport.Options{"fault-destroylatency": "9m", "fault-postlatency": "1ms"},
			want: faults.Config{DestroyLatency: 9 * time.Minute, PostLatency: time.Millisecond}, rest: transport.Options{}, any: true,
		},
		{opts: transport.Options{"fault-destroylatency": "soon"}, wantErr: "fault-destroylatency=\"soon\": want a duration"},
		{opts: transport.Options{"fault-postlatency": "-1s"}, wantErr: "want a duration"},
		{opts: transport.Options{"fault-postfail": "2"}, wantErr: "fault-postfail=\"2\": want a probability"},
		{opts: transport.Options{"fault-postfail": "-0.1"}, wantErr: "want a probability"},
		{opts: transport.Options{"fault-seed": "x"}, wantErr: "fault-seed=\"x\": want an integer"},
		{opts: transport.Options{"fault-dup": "0.1"}, wantErr: "fault-dup: unknown fault"},
	} {
		c, rest, any, err := faults.SplitOptions(tc.opts)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("SplitOptions(%v): err %v, want one containing %q", tc.opts, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("SplitOptions(%v): %v", tc.opts, err)
			continue
		}
		if c != tc.want || any != tc.any || len(rest) != len(tc.rest) {
			t.Errorf("SplitOptions(%v) = %+v, %v, %v; want %+v, %v, %v", tc.opts, c, rest, any, tc.want, tc.rest, tc.any)
		}
		for k, v := range tc.rest {
			if rest[k] != v {
				t.Errorf("SplitOptions(%v): rest[%s] = %q, want %q", tc.opts, k, rest[k], v)
			}
		}
	}
}

// TestHookRefusesForeignQP: a hook given a QP of another provider says so
// rather than injecting nothing.
// wrapped is a software NIC wrapped with no faults, and a PD on the
// device of the wrapper (onWrapper) or of the NIC underneath; the test's
// cleanup closes it.
func wrapped(t *testing.T, onWrapper bool) (*faults.Provider, transport.Device, transport.PD) {
	t.Helper()
	under, err := emu.New(emu.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := faults.Wrap(under, faults.Config{})
	t.Cleanup(func() { p.Close() })
	var src transport.Provider = under
	if onWrapper {
		src = p
	}
	dev, err := src.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return p, dev, pd
}

func TestHookRefusesForeignQP(t *testing.T) {
	p, dev, pd := wrapped(t, false)
	cq, err := dev.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.InjectPostFailure(qp, 0); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("InjectPostFailure on the NIC's own QP: %v, want ErrInvalidArgument", err)
	}
}

// TestRandomFaults: with random rates, streams of WRITEs meet every kind
// of fault the rates ask for, and the same seed makes the same faults.
// QP errors are left out of the replay: the WRs before the error point
// complete or flush as the device's timing has it, which moves the
// completions the later choices are made on.
func TestRandomFaults(t *testing.T) {
	run := func(cfg faults.Config) faults.Counters {
		under, err := emu.New(emu.Config{Seed: 3, Wire: emu.WireLoop,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		p := faults.Wrap(under, cfg)
		defer p.Close()
		// A connection per round, since a fault may leave its QP in ERR:
		// 16 signaled WRITEs, then every completion they will give.
		for round := 0; round < 60; round++ {
			writeRound(t, p, 16)
		}
		return p.Counters()
	}
	cfg := faults.Config{Seed: 42, PostFail: 0.02, DropCQE: 0.03, CorruptCQE: 0.03}
	a := run(cfg)
	t.Logf("seed 42: %+v", a)
	if a.PostFails == 0 || a.Drops == 0 || a.Corrupts == 0 {
		t.Errorf("seed 42: some fault never happened: %+v", a)
	}
	if b := run(cfg); b != a {
		t.Errorf("the same seed made other faults: %+v, then %+v", a, b)
	}
	if c := run(faults.Config{Seed: 42, QPError: 0.05}); c.QPErrors == 0 {
		t.Errorf("QPError 0.05 over 960 WRs: no QP error: %+v", c)
	}
}

// writeRound connects a pair of QPs on p, posts n signaled WRITEs from A
// to B and waits until every WR the post accepted has completed, in order,
// except those a fault lost.
func writeRound(t *testing.T, p transport.Provider, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type side struct {
		qp   transport.QP
		cq   transport.CQ
		mr   transport.MR
		a    *transport.Arena
		conn transport.Conn
	}
	open := func(dev transport.Device) *side {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pd.Close() })
		cq, err := dev.CreateCQ(64)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cq.Close() })
		qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 32, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { qp.Close() })
		a, err := transport.NewArena(1<<16, transport.ArenaOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		mr, err := pd.RegMR(a, 0, a.Len(), transport.AccessLocalWrite|transport.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mr.Close() })
		return &side{qp: qp, cq: cq, mr: mr, a: a}
	}
	accepted := make(chan *side, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		b := open(req.Device())
		if b.conn, err = req.Accept(ctx, b.qp, nil); err != nil {
			accepted <- nil
			return
		}
		accepted <- b
	}()
	ep, err := p.Resolve(ctx, l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	a := open(ep.Device())
	if a.conn, err = ep.Connect(ctx, a.qp, nil); err != nil {
		t.Fatal(err)
	}
	defer a.conn.Disconnect()
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	defer b.conn.Disconnect()
	wrs := make([]transport.SendWR, n)
	for i := range wrs {
		wrs[i] = transport.SendWR{ID: uint64(i), Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
			SGL:        []transport.SGE{{Addr: a.a.Addr() + uint64(i)*512, Length: 512, LKey: a.mr.LKey()}},
			RemoteAddr: b.a.Addr() + uint64(i)*512, RKey: b.mr.RKey()}
	}
	posted, err := a.qp.PostSend(wrs)
	if err != nil && !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("PostSend: %v", err)
	}
	// Every accepted WR completes (lost ones excepted); the last one's
	// completion, or its loss, ends the round: wait for the device to be
	// done with all of them, then take what the CQ holds.
	var wcs [32]transport.WC
	seen := 0
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		k, err := a.cq.Poll(wcs[:])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, wc := range wcs[:k] {
			if int(wc.ID) < seen-1 || int(wc.ID) >= posted {
				t.Fatalf("completion %s out of order or of a WR never posted (%d posted)", wc.String(), posted)
			}
			seen = int(wc.ID) + 1
		}
		if seen == posted {
			return
		}
		if k == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// TestHoldDestroys: a QP's Close waits while a hold is on, and returns
// when that hold is released; two holds, each released twice and out of
// order, let go of what each held, and of nothing else.
func TestHoldDestroys(t *testing.T) {
	p, dev, pd := wrapped(t, true)
	closeQP := func() <-chan error {
		cq, err := dev.CreateCQ(8)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- qp.Close() }()
		return done
	}
	held := func(n uint64) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); p.Counters().DestroysHeld < n; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d destroys held, want %d", p.Counters().DestroysHeld, n)
			}
		}
	}
	returned := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Close still waiting", what)
		}
	}
	first := p.HoldDestroys()
	a := closeQP()
	held(1)
	second := p.HoldDestroys()
	b := closeQP()
	held(2)
	first()
	first()
	returned(a, "the first hold's Close after its release")
	select {
	case <-b:
		t.Fatal("the second hold's Close returned when the first hold was released")
	default:
	}
	second()
	second()
	returned(b, "the second hold's Close after its release")
	returned(closeQP(), "a Close with no hold on")
	if n := p.Counters().DestroysHeld; n != 2 {
		t.Errorf("%d destroys held, want 2", n)
	}
}
