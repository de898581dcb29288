//go:build linux && cgo && ibverbs

package ibverbs

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestMeasure records how the device under test behaves where devices
// differ (the rules of transport.Quirks), prints one "MEASURE" line per
// rule, and checks the outcome against the Quirks the provider reports.
// On rxe these lines are the source of the table in the package doc.
func TestMeasure(t *testing.T) {
	p := newProvider(t)
	dv, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	q := dv.Attr().Quirks
	caps := dv.Attr().Caps
	logf := func(rule, format string, args ...any) {
		t.Helper()
		t.Logf("MEASURE %-34s "+format, append([]any{rule}, args...)...)
	}
	isLocalOpErr := func(st transport.Status) bool {
		if q.LocalErrFlushed {
			return st == transport.StatusWRFlushErr
		}
		return st == q.LocalOpErrStatus
	}
	if !caps.Has(transport.CapMemWindow2 | transport.CapLocalInv | transport.CapSendWithInv) {
		t.Skipf("device caps %s: windows and invalidation needed", caps)
	}

	t.Run("LinvFreeWindow", func(t *testing.T) {
		pr := newPair(t, p)
		w, err := pr.pd.AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		pr.mws = append(pr.mws, w.(*MW))
		post(t, pr.b.qp, transport.SendWR{ID: 1, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: w.Key()})
		wc := waitWC(t, pr.b.cq)
		logf("LINV on FREE window (its key)", "%s", wc.Status)
		if (wc.Status == transport.StatusSuccess) != q.InvalidateFreeOK {
			t.Errorf("status %s but Quirks.InvalidateFreeOK=%v", wc.Status, q.InvalidateFreeOK)
		}
		if wc.Status != transport.StatusSuccess && !isLocalOpErr(wc.Status) {
			t.Errorf("status %s, Quirks.LocalOpErrStatus=%s", wc.Status, q.LocalOpErrStatus)
		}
	})

	t.Run("LinvAfterLinv", func(t *testing.T) {
		pr := newPair(t, p)
		_, key := pr.bind(t, 0, 4096, 10)
		post(t, pr.b.qp, transport.SendWR{ID: 1, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key})
		expect(t, waitWC(t, pr.b.cq), 1, transport.StatusSuccess)
		post(t, pr.b.qp, transport.SendWR{ID: 2, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key})
		wc := waitWC(t, pr.b.cq)
		logf("LINV twice (window FREE, same key)", "%s", wc.Status)
		if (wc.Status == transport.StatusSuccess) != q.InvalidateFreeOK {
			t.Errorf("status %s but Quirks.InvalidateFreeOK=%v", wc.Status, q.InvalidateFreeOK)
		}
	})

	t.Run("LinvKeyCompare", func(t *testing.T) {
		pr := newPair(t, p)
		_, key := pr.bind(t, 0, 4096, 10)
		post(t, pr.b.qp, transport.SendWR{ID: 1, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key.Bump()})
		wc := waitWC(t, pr.b.cq)
		logf("LINV, right index wrong 8-bit key", "%s vendor_err=%#x", wc.Status, wc.VendorErr)
		if (wc.Status == transport.StatusSuccess) != q.InvalidateIndexOnly {
			t.Errorf("status %s but Quirks.InvalidateIndexOnly=%v", wc.Status, q.InvalidateIndexOnly)
		}
		if wc.Status != transport.StatusSuccess && !isLocalOpErr(wc.Status) {
			t.Errorf("status %s, Quirks.LocalOpErrStatus=%s", wc.Status, q.LocalOpErrStatus)
		}
		logf("  QP after failed LINV", "%s", pr.b.qp.State())
	})

	t.Run("BindValidWindow", func(t *testing.T) {
		pr := newPair(t, p)
		mw, key := pr.bind(t, 0, 4096, 10)
		post(t, pr.b.qp, transport.SendWR{ID: 11, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled,
			Bind: transport.BindWR{MW: mw, Key: key.Bump(), MR: pr.b.mr, Addr: pr.b.addr(0), Length: 4096, Access: transport.AccessRemoteRead}})
		wc := waitWC(t, pr.b.cq)
		logf("BIND_MW on a bound (VALID) window", "%s", wc.Status)
		// rxe fails binds with MW_BIND_ERR but LOCAL_INV with
		// LOC_QP_OP_ERR; Quirks has one LocalOpErrStatus (see the report).
		if wc.Status == transport.StatusSuccess {
			t.Errorf("bind of a VALID type-2 window succeeded")
		}
	})

	t.Run("BindWrongIndex", func(t *testing.T) {
		pr := newPair(t, p)
		w, err := pr.pd.AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		pr.mws = append(pr.mws, w.(*MW))
		bad := transport.MakeKey(w.Key().Index()+1, w.Key().Variant()+1)
		post(t, pr.b.qp, transport.SendWR{ID: 11, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled,
			Bind: transport.BindWR{MW: w, Key: bad, MR: pr.b.mr, Addr: pr.b.addr(0), Length: 4096, Access: transport.AccessRemoteRead}})
		wc := waitWC(t, pr.b.cq)
		logf("BIND_MW with another index", "%s", wc.Status)
		if wc.Status == transport.StatusSuccess {
			// rxe takes only the 8-bit key of the new rkey; find out which
			// key the window now answers to.
			w2 := transport.MakeKey(w.Key().Index(), bad.Variant())
			for i, k := range []transport.Key{bad, w2} {
				post(t, pr.a.qp, transport.SendWR{ID: uint64(30 + i), Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
					SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 8, LKey: pr.a.mr.LKey()}}, RemoteAddr: pr.b.addr(0), RKey: k})
				wc := waitWC(t, pr.a.cq)
				logf("  READ through "+k.String(), "%s", wc.Status)
				if wc.Status != transport.StatusSuccess {
					break
				}
			}
		}
	})

	t.Run("WindowBounds", func(t *testing.T) {
		pr := newPair(t, p)
		fill(pr.buf(&pr.a, 0, 16), 5)
		_, key := pr.bind(t, 4096, 4096, 10) // window over b's [4096, 8192)
		before := append([]byte(nil), pr.buf(&pr.b, 8192, 64)...)
		post(t, pr.a.qp, transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 16, LKey: pr.a.mr.LKey()}}, RemoteAddr: pr.b.addr(8192 - 8), RKey: key})
		wc := waitWC(t, pr.a.cq)
		changed := !bytesEqual(pr.buf(&pr.b, 8192, 64), before)
		logf("WRITE across a window's end (inside the MR)", "%s; bytes beyond the window changed: %v", wc.Status, changed)
		if (wc.Status == transport.StatusSuccess) != q.WindowBoundsUnchecked {
			t.Errorf("status %s but Quirks.WindowBoundsUnchecked=%v", wc.Status, q.WindowBoundsUnchecked)
		}
	})

	t.Run("DeregWithBoundWindow", func(t *testing.T) {
		pr := newPair(t, p)
		pr.bind(t, 0, 4096, 10)
		err := pr.b.mr.Close()
		logf("ibv_dereg_mr with a bound window", "%v", err)
		if !errors.Is(err, transport.ErrBusy) {
			t.Errorf("MR.Close: %v, want ErrBusy", err)
		}
	})

	t.Run("ErrorWCFields", func(t *testing.T) {
		pr := newPair(t, p)
		post(t, pr.a.qp,
			transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 512, LKey: pr.a.mr.LKey()}},
				RemoteAddr: pr.b.addr(0), RKey: pr.b.mr.RKey() ^ 0x5500},
			transport.SendWR{ID: 2, Opcode: transport.OpSend, SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 8, LKey: pr.a.mr.LKey()}}})
		wc := waitWC(t, pr.a.cq)
		logf("RDMA WRITE, bad rkey (unsignaled)", "%s opcode=%d byte_len=%d qp_ok=%v vendor_err=%#x", wc.Status, wc.Opcode, wc.ByteLen, wc.QPNum == pr.a.qp.Num(), wc.VendorErr)
		expect(t, wc, 1, transport.StatusRemAccessErr)
		wc = waitWC(t, pr.a.cq)
		logf("  next WR (unsignaled)", "%s opcode=%d byte_len=%d", wc.Status, wc.Opcode, wc.ByteLen)
		expect(t, wc, 2, transport.StatusWRFlushErr)
		logf("  requester QP / responder QP", "%s / %s", pr.a.qp.State(), pr.b.qp.State())
		evs := drainEvents(dv)
		logf("  async events", "%v", evs)
		if (len(evs) == 0) != q.NoQPErrorEvents {
			t.Errorf("events %v but Quirks.NoQPErrorEvents=%v", evs, q.NoQPErrorEvents)
		}
	})

	t.Run("SendWithInvBadKey", func(t *testing.T) {
		pr := newPair(t, p)
		_, key := pr.bind(t, 0, 4096, 10)
		postRecv(t, &pr.b, 20, 8192, 256)
		post(t, pr.a.qp, transport.SendWR{ID: 1, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: key.Bump(),
			SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 16, LKey: pr.a.mr.LKey()}}})
		rwc := waitWC(t, pr.b.cq)
		swc, none := noWC(pr.a.cq, 3*time.Second)
		sender := "no completion in 3 s"
		if !none {
			sender = swc.Status.String()
		}
		logf("SEND_WITH_INV, wrong key, at receiver", "recv %s; sender %s; receiver QP %s; events %v", rwc.Status, sender, pr.b.qp.State(), drainEvents(dv))
		if rwc.Status == transport.StatusSuccess {
			t.Errorf("receive succeeded: %v", &rwc)
		}
	})

	t.Run("SQDrainedEvent", func(t *testing.T) {
		pr := newPair(t, p)
		drainEvents(dv)
		if err := pr.a.qp.Modify(transport.QPSQD); err != nil {
			logf("modify RTS -> SQD", "%v", err)
			return
		}
		evs := drainEvents(dv)
		logf("modify RTS -> SQD, async events", "%v", evs)
		found := false
		for _, e := range evs {
			found = found || e == transport.EventSQDrained.String()
		}
		if !found {
			t.Errorf("no SQ_DRAINED event after RTS -> SQD (events %v)", evs)
		}
		if err := pr.a.qp.Modify(transport.QPRTS); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("LocalSGEError", func(t *testing.T) {
		pr := newPair(t, p)
		postRecv(t, &pr.b, 1, 0, 1024)
		bad := transport.SGE{Addr: pr.a.addr(0), Length: 16, LKey: pr.a.mr.LKey() ^ 0x5500}
		good := transport.SGE{Addr: pr.a.addr(0), Length: 16, LKey: pr.a.mr.LKey()}
		post(t, pr.a.qp,
			transport.SendWR{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{bad}},
			transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: []transport.SGE{good}},
			transport.SendWR{ID: 3, Opcode: transport.OpSend, SGL: []transport.SGE{good}})
		var got []string
		for range 3 {
			wc, none := noWC(pr.a.cq, 3*time.Second)
			if none {
				break
			}
			got = append(got, wc.String())
		}
		logf("SEND with a bad lkey, then 2 more", "%v; QP %s", got, pr.a.qp.State())
		want := q.LocalKeyErrStatus
		if want == transport.StatusSuccess {
			want = transport.StatusLocProtErr
		}
		if q.LocalErrFlushed {
			want = transport.StatusWRFlushErr
		}
		if len(got) == 0 || !strings.Contains(got[0], want.String()) {
			t.Errorf("first completion %v, Quirks say %s", got, want)
		}
		if len(got) < 3 {
			_ = pr.a.qp.Modify(transport.QPErr)
			var after []string
			for range 3 {
				wc, none := noWC(pr.a.cq, time.Second)
				if none {
					break
				}
				after = append(after, wc.String())
			}
			logf("  after Modify(ERR)", "%v", after)
		}
	})

	t.Run("RecvTooSmall", func(t *testing.T) {
		pr := newPair(t, p)
		postRecv(t, &pr.b, 1, 0, 100)
		post(t, pr.a.qp, transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 200, LKey: pr.a.mr.LKey()}}})
		swc := waitWC(t, pr.a.cq)
		rwc := waitWC(t, pr.b.cq)
		logf("SEND larger than the receive buffer", "receiver %s, sender %s", rwc.Status, swc.Status)
		want := q.RecvLenErrStatus
		if want == transport.StatusSuccess {
			want = transport.StatusLocLenErr
		}
		if rwc.Status != want {
			t.Errorf("receiver status %s, Quirks say %s", rwc.Status, want)
		}
	})

	t.Run("RNR", func(t *testing.T) {
		pr := newPair(t, p)
		post(t, pr.a.qp, transport.SendWR{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 8, LKey: pr.a.mr.LKey()}}})
		t0 := time.Now()
		wc := waitWC(t, pr.a.cq)
		logf("SEND with no receive posted", "%s after %v", wc.Status, time.Since(t0).Round(time.Millisecond))
	})

	t.Run("PostBeforeRTS", func(t *testing.T) {
		dv2, _ := p.OpenDevice("")
		pd, err := dv2.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		defer pd.Close()
		arena, _ := transport.NewArena(4096, transport.ArenaOptions{})
		defer arena.Close()
		mr, err := pd.RegMR(arena, 0, 4096, transport.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer mr.Close()
		cq, _ := dv2.CreateCQ(16)
		defer cq.Close()
		qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		sge := []transport.SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}
		for _, st := range []transport.QPState{transport.QPReset, transport.QPInit} {
			if st == transport.QPInit {
				if err := qp.Modify(transport.QPInit); err != nil {
					t.Fatal(err)
				}
			}
			n, err := qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: sge}})
			wc, none := noWC(cq, time.Second)
			out := "no completion in 1 s"
			if !none {
				out = wc.String()
			}
			logf("post send in "+st.String(), "accepted %d, err %v; %s", n, err, out)
			if q.DropPostsBeforeRTS && (n != 1 || err != nil || !none) {
				t.Errorf("Quirks.DropPostsBeforeRTS but post %d, %v, completion %v", n, err, !none)
			}
			if !q.DropPostsBeforeRTS && (n != 0 || !errors.Is(err, transport.ErrInvalidState)) {
				t.Errorf("strict device: post %d, %v; want 0, ErrInvalidState", n, err)
			}
			n, err = qp.PostRecv([]transport.RecvWR{{ID: 2, SGL: sge}})
			logf("post recv in "+st.String(), "accepted %d, err %v", n, err)
		}
		_ = qp.Modify(transport.QPErr)
		wc, none := noWC(cq, time.Second)
		logf("  then modify to ERR", "%v (none=%v)", &wc, none)
	})

	t.Run("PostInInitThenConnect", func(t *testing.T) {
		// Does a send posted before RTS execute once the QP is connected?
		pr := newPairHook(t, p, func(pr *pair) {
			if err := pr.a.qp.Modify(transport.QPInit); err != nil {
				t.Fatal(err)
			}
			n, err := pr.a.qp.PostSend([]transport.SendWR{{ID: 77, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
				SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 8, LKey: pr.a.mr.LKey()}}}})
			logf("post send in INIT before connect", "accepted %d, err %v", n, err)
		})
		postRecv(t, &pr.b, 5, 0, 64)
		rwc, rnone := noWC(pr.b.cq, 3*time.Second)
		swc, snone := noWC(pr.a.cq, time.Second)
		logf("  after connecting", "receiver got completion=%v (%v); sender completion=%v (%v)", !rnone, &rwc, !snone, &swc)
		if q.DropPostsBeforeRTS && (!rnone || !snone) {
			t.Errorf("DropPostsBeforeRTS, but the early send executed after RTS")
		}
	})
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// TestOops reproduces the rxe kernel oops on invalidating a FREE type-2
// window. It kills the VM, so it runs only on request:
// GOSRP_RXE_OOPS=linv (LOCAL_INV, with GOSRP_IBVERBS_UNGUARDED=1 so the
// provider does not turn it into a failing LOCAL_INV) or sendinv (a peer's
// SEND_WITH_INV, which no local guard can stop).
func TestOops(t *testing.T) {
	mode := os.Getenv("GOSRP_RXE_OOPS")
	if mode == "" {
		t.Skip("set GOSRP_RXE_OOPS=linv|sendinv to crash the rxe kernel on purpose")
	}
	p := newProvider(t)
	pr := newPair(t, p)
	w, err := pr.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	pr.mws = append(pr.mws, w.(*MW))
	t.Logf("invalidating FREE window %s by %s; the VM should now die", w.Key(), mode)
	switch mode {
	case "linv":
		post(t, pr.b.qp, transport.SendWR{ID: 1, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: w.Key()})
		wc := waitWC(t, pr.b.cq)
		t.Logf("survived: %v", &wc)
	case "sendinv":
		postRecv(t, &pr.b, 2, 0, 64)
		post(t, pr.a.qp, transport.SendWR{ID: 1, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: w.Key(),
			SGL: []transport.SGE{{Addr: pr.a.addr(0), Length: 8, LKey: pr.a.mr.LKey()}}})
		wc := waitWC(t, pr.b.cq)
		t.Logf("survived: %v", &wc)
	}
}

func drainEvents(d transport.Device) []string {
	var out []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		ev, err := d.NextEvent(ctx)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, ev.Type.String())
	}
}
