package frmr

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// waitIni polls the initiator CQ until pred holds, feeding send
// completions to the pool.
func (r *rig) waitIni(pred func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !pred() {
		if time.Now().After(deadline) {
			r.fatalf("timed out")
		}
		n, err := r.ini.cq.Poll(r.wcs)
		if err != nil {
			r.fatalf("poll: %v", err)
		}
		for _, wc := range r.wcs[:n] {
			if wc.ID>>56 != 1 {
				r.pool.OnSendCompletion(&wc)
			}
		}
		if n == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			r.ini.cq.Wait(ctx)
			cancel()
		}
	}
}

// register posts REG+SEND for buf through the pool and waits for the
// SEND completion: the MR is VALID and its key known to the peer.
func (r *rig) register(off, n int, dir Direction) Reg {
	r.t.Helper()
	reg, err := r.pool.Get(Segment{Arena: r.ini.arena, Off: off, Len: n}, dir)
	if err != nil {
		r.fatalf("get: %v", err)
	}
	r.sendID++
	chain := []transport.SendWR{reg.WR(), {ID: sendBit | r.sendID, Opcode: transport.OpSend,
		SGL: []transport.SGE{{Addr: r.iuAddr(&r.ini, rqDepth), Length: 32, LKey: r.ini.mr.LKey()}}}}
	if n, err := r.post(chain); n != 2 {
		r.fatalf("post: %v", err)
	}
	st := -1
	r.waitIni(func() bool {
		r.pool.Slots(func(s SlotInfo) {
			if s.Slot == reg.Slot() {
				st = int(s.State)
			}
		})
		return st == int(Valid)
	})
	return reg
}

// TestNaivePoolLetsStrayWriteCorrupt reproduces ib_srp's early recycling
// (docs/registration.md#early-recycling): a naive pool that recycles an MR
// when its LOCAL_INV is *posted* hands the buffer back while the old rkey is
// still VALID; a stray WRITE with that rkey lands in application memory. The
// LINV is held back deterministically by putting the QP in SQD, so it cannot
// execute yet. The real pool returns the buffer only after the LINV
// completed, and the same stray WRITE fails with REM_ACCESS_ERR without
// changing a byte.
func TestNaivePoolLetsStrayWriteCorrupt(t *testing.T) {
	const off, n = 100, 3 * 4096
	app := func(r *rig) []byte { return r.ini.arena.Bytes()[off : off+n] }
	stray := bytes.Repeat([]byte{0xEE}, 64)

	t.Run("naive", func(t *testing.T) {
		r := newRig(t, "strict", FRMR, 2, false)
		// The naive pool: one raw FRMR, unsignaled LINV, recycled on post.
		f, err := r.ini.pd.AllocFastRegMR(maxPages)
		if err != nil {
			t.Fatal(err)
		}
		key := f.Key().Bump()
		iova := r.ini.arena.Addr() + off
		if err := f.Map(r.ini.arena, off, n, iova); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ini.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpRegMR, Flags: transport.FlagSignaled,
			Reg: transport.RegWR{MR: f, Key: key, Access: transport.AccessLocalWrite | transport.AccessRemoteWrite}}}); err != nil {
			t.Fatal(err)
		}
		r.waitIni(func() bool { info, _ := r.prov.MRInfo(key.Index()); return info.State == "VALID" })
		if err := r.ini.qp.Modify(transport.QPSQD); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ini.qp.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.OpLocalInv, InvalidateKey: key}}); err != nil {
			t.Fatal(err)
		}
		// naive put: the MR is "free" and the buffer goes back to the app.
		for i := range app(r) {
			app(r)[i] = 0xA5
		}
		info, _ := r.prov.MRInfo(key.Index())
		if info.State != "VALID" || info.Key != key {
			t.Fatalf("expected the old rkey still VALID when the naive pool returned the buffer, device %+v", info)
		}
		st, err := r.prov.InjectStray(r.tgt.qp, transport.OpRDMAWrite, key, iova+8, stray)
		if err != nil {
			t.Fatal(err)
		}
		if st != transport.StatusSuccess || !bytes.Equal(app(r)[8:8+64], stray) {
			t.Fatalf("stray status %s: expected the software NIC to show the corruption", st)
		}
		t.Logf("software NIC: stray WRITE with rkey %s landed in application memory returned by the naive pool (device state %s)", key, info.State)
		r.ini.qp.Modify(transport.QPRTS)
	})

	t.Run("pool", func(t *testing.T) {
		r := newRig(t, "strict", FRMR, 2, false)
		reg := r.register(off, n, PeerWrites)
		if err := r.ini.qp.Modify(transport.QPSQD); err != nil {
			t.Fatal(err)
		}
		inv, err := r.pool.Invalidate(reg)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := r.post([]transport.SendWR{inv}); n != 1 {
			t.Fatal(err)
		}
		if r.pool.Done(reg) {
			t.Fatal("buffer return: buffer returned before the LOCAL_INV completed")
		}
		if err := r.ini.qp.Modify(transport.QPRTS); err != nil {
			t.Fatal(err)
		}
		r.waitIni(func() bool { return r.pool.Done(reg) })
		// Back to the application.
		for i := range app(r) {
			app(r)[i] = 0xA5
		}
		before := bytes.Clone(app(r))
		st, err := r.prov.InjectStray(r.tgt.qp, transport.OpRDMAWrite, reg.RKey(), reg.IOVA()+8, stray)
		if err != nil {
			t.Fatal(err)
		}
		if st != transport.StatusRemAccessErr {
			t.Fatalf("stray WRITE status %s, want REM_ACCESS_ERR", st)
		}
		if !bytes.Equal(before, app(r)) {
			t.Fatal("stray WRITE changed application memory")
		}
	})
}

// TestQPErrorMidBurstIB: under the ib (ConnectX-3-like) profile a
// QP error mid-burst flushes REG/LINV WRs and poisons their MRs; no
// MW_BIND_ERR ever reaches an I/O and every flushed MR is replaced.
func TestQPErrorMidBurstIB(t *testing.T) {
	for _, mech := range []Mechanism{FRMR, MW} {
		t.Run(mech.String(), func(t *testing.T) {
			r := newRig(t, "ib", mech, 1000, mech == FRMR)
			for i := 0; i < 50; i++ {
				r.step()
			}
			for tag := range r.ios {
				if r.ios[tag].state == ioIdle {
					r.start(tag)
				}
			}
			old := r.busySlots()
			if len(old) == 0 {
				t.Fatal("no MR in use at the error")
			}
			r.prov.InjectQPError(r.ini.qp, 1)
			rec := r.recovers
			for i := 0; r.recovers == rec; i++ {
				if i > 10000 {
					t.Fatal("no recovery")
				}
				r.step()
			}
			r.pool.Slots(func(s SlotInfo) {
				if o, ok := old[s.Slot]; ok && s.Index == o.Index && s.State != Free {
					t.Errorf("slot %d still holds MR index %#x after the QP error", s.Slot, o.Index)
				}
			})
			for r.done < 200 {
				r.step()
			}
			if r.mwBind != 0 {
				t.Fatalf("%d MW_BIND_ERR reached an I/O", r.mwBind)
			}
			if st := r.pool.Stats(); st.Replacements == 0 {
				t.Fatalf("no replacement: %+v", st)
			}
		})
	}
}

// TestCanaryCheckerFailsOnBrokenInvariant breaks invariants on purpose and
// proves Check notices.
func TestCanaryCheckerFailsOnBrokenInvariant(t *testing.T) {
	r := newRig(t, "strict", FRMR, 9, true)
	reg := r.register(0, 4096, PeerWrites)
	if err := r.pool.Check(); err != nil {
		t.Fatal(err)
	}
	p := r.pool
	// Free-list gating and conservation (docs/registration.md#invariants):
	// an in-use MR pushed on the free list (the naive pool).
	p.free = append(p.free, uint32(reg.Slot()))
	if err := p.Check(); err == nil {
		t.Fatal("Check missed an in-use MR on the free list")
	}
	p.free = p.free[:len(p.free)-1]
	// Conservation (docs/registration.md#conservation): accounting drift.
	p.nInUse++
	if err := p.Check(); err == nil {
		t.Fatal("Check missed an accounting drift")
	}
	p.nInUse--
	// Send-queue accounting (docs/registration.md#send-queue-accounting): a
	// run of unsignaled WRs.
	for i := 0; i < p.cfg.SignalEvery; i++ {
		p.push(entry{id: uint64(i), kind: kindCaller})
	}
	if err := p.Check(); err == nil {
		t.Fatal("Check missed a run of unsignaled WRs")
	}
}
