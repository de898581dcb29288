package frmr

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// One test per invariant of docs/registration.md#invariants. Rules whose
// check is a per-step device/pool assertion run a short faulted soak:
// rig.check asserts them after every step.

func shortSoak(t *testing.T, profile string, mech Mechanism) {
	runSoak(t, profile, mech, soakSeed(t, int64(len(t.Name()))), 60, 0.03)
}

func slotState(p *Pool, slot int) (st SlotInfo) {
	p.Slots(func(s SlotInfo) {
		if s.Slot == slot {
			st = s
		}
	})
	return st
}

func TestRule01NoFreeMRNamedByOutstandingWR(t *testing.T) { shortSoak(t, "strict", FRMR) }

func TestRule02InvPostedFreedOnlyBySuccess(t *testing.T) {
	r := newRig(t, "strict", FRMR, 21, true)
	reg := r.register(0, 4096, PeerWrites)
	r.ini.qp.Modify(transport.QPSQD)
	inv, _ := r.pool.Invalidate(reg)
	r.post([]transport.SendWR{inv})
	r.ini.qp.Modify(transport.QPErr) // the LINV is flushed, never executed
	r.waitIni(func() bool { return r.pool.Drained() })
	if s := slotState(r.pool, reg.Slot()); s.State != Tainted || r.pool.Done(reg) {
		t.Fatalf("flushed LINV left slot %+v, done=%v", s, r.pool.Done(reg))
	}
	if err := r.pool.Recover(); err != nil {
		t.Fatal(err)
	}
	if !r.pool.Done(reg) {
		t.Fatal("not done after replacement")
	}
}

func TestRule03RemoteInvalidationChecked(t *testing.T) {
	r := newRig(t, "strict", FRMR, 22, true)
	reg := r.register(0, 4096, PeerWrites)
	if err := r.pool.OnRemoteInvalidate(reg, reg.RKey().Bump()); !errors.Is(err, ErrBogusInvalidate) {
		t.Fatalf("bogus invalidation accepted: %v", err)
	}
	if r.pool.Done(reg) || slotState(r.pool, reg.Slot()).State != Tainted {
		t.Fatal("bogus invalidation freed the MR")
	}
	// Receive before send completion: response (with the right key) before
	// the SEND completion.
	r2 := newRig(t, "strict", FRMR, 23, true)
	reg2, _ := r2.pool.Get(Segment{Arena: r2.ini.arena, Off: 0, Len: 4096}, PeerWrites)
	r2.pool.Posted([]transport.SendWR{reg2.WR(), {ID: sendBit | 9, Flags: transport.FlagSignaled}}, 2)
	if err := r2.pool.OnRemoteInvalidate(reg2, reg2.RKey()); err != nil || r2.pool.Done(reg2) {
		t.Fatalf("freed before the SEND completion: err=%v", err)
	}
	r2.pool.OnSendCompletion(&transport.WC{ID: sendBit | 9})
	if !r2.pool.Done(reg2) {
		t.Fatal("not FREE after SEND completion + remote invalidation")
	}
}

func TestRule04BufferReturnedOnlyWhenFree(t *testing.T) { shortSoak(t, "rxe", MW) }

func TestRule05OneValidGenerationNoRegOnValid(t *testing.T) { shortSoak(t, "strict", MW) }

func TestRule06KeyBumpWrapsIndexUnchanged(t *testing.T) {
	c := newCycle(t, false)
	p := c.r.pool
	first := slotState(p, len(p.slots)-1)
	var prev transport.Key
	wrapped := false
	for i := 0; i < 300; i++ {
		reg, _ := p.Get(Segment{Arena: c.r.ini.arena, Off: 0, Len: 10}, PeerReads)
		k := reg.RKey()
		p.Cancel(reg)
		c.run(t)
		s := slotState(p, reg.Slot())
		if s.Index != k.Index() || (reg.Slot() == first.Slot && k.Index() != first.Index) {
			t.Fatalf("index changed: %s vs %#x", k, s.Index)
		}
		if i > 0 && reg.Slot() == first.Slot && prev != 0 && k.Variant() == 0 && prev.Variant() == 0xff {
			wrapped = true
		}
		if reg.Slot() == first.Slot {
			prev = s.DevKey
		}
	}
	_ = wrapped // single-slot walk below checks the wrap exactly
	one, err := New(Config{PD: c.r.ini.pd, Mechanism: FRMR, Size: 1, SQDepth: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	k0 := one.slots[0].devKey
	for i := 1; i <= 256; i++ {
		reg, _ := one.Get(Segment{Arena: c.r.ini.arena, Off: 0, Len: 10}, PeerReads)
		if want := transport.MakeKey(k0.Index(), k0.Variant()+uint8(i)); reg.RKey() != want {
			t.Fatalf("registration %d key %s want %s", i, reg.RKey(), want)
		}
		one.Posted([]transport.SendWR{reg.WR(), {ID: 5, Flags: transport.FlagSignaled}}, 2)
		one.OnSendCompletion(&transport.WC{ID: 5})
		inv, _ := one.Invalidate(reg)
		one.Posted([]transport.SendWR{inv}, 1)
		one.OnSendCompletion(&transport.WC{ID: inv.ID})
	}
	if one.slots[0].devKey != k0 {
		t.Fatalf("after 256 bumps key %s, want wrapped %s", one.slots[0].devKey, k0)
	}
}

func TestRule07UnretiredRKeysDistinct(t *testing.T) { shortSoak(t, "iwarp", FRMR) }

func TestRule08LocalInvNamesDeviceKey(t *testing.T) {
	r := newRig(t, "rxe", FRMR, 28, true) // rxe compares the full key
	for i := 0; i < rqDepth-2; i++ {      // the target does not repost receives here
		reg := r.register(0, 4096, PeerWrites)
		inv, _ := r.pool.Invalidate(reg)
		if info, _ := r.prov.MRInfo(reg.RKey().Index()); inv.InvalidateKey != info.Key {
			t.Fatalf("LINV names %s, device holds %s", inv.InvalidateKey, info.Key)
		}
		r.post([]transport.SendWR{inv})
		r.waitIni(func() bool { return r.pool.Done(reg) })
	}
	// An unposted REG: staged key never reaches the device; the MR is
	// replaced, never invalidated with the staged key.
	reg, _ := r.pool.Get(Segment{Arena: r.ini.arena, Off: 0, Len: 4096}, PeerWrites)
	r.pool.Posted([]transport.SendWR{reg.WR()}, 0)
	if _, err := r.pool.Invalidate(reg); err == nil {
		t.Fatal("Invalidate of an unposted registration")
	}
	if c := r.prov.Counters(); c.InvKeyMismatch != 0 {
		t.Fatalf("%d LINV key mismatches", c.InvKeyMismatch)
	}
}

func TestRule09IOVAVariesPerRegistration(t *testing.T) {
	r := newRig(t, "strict", FRMR, 29, true)
	a, _ := r.pool.Get(Segment{Arena: r.ini.arena, Off: 100, Len: 10}, PeerWrites)
	b, _ := r.pool.Get(Segment{Arena: r.ini.arena, Off: 100, Len: 10}, PeerWrites)
	// Two registrations of one buffer: disjoint iova ranges, each keeping
	// the buffer's page offset.
	if a.IOVA() == b.IOVA() || b.IOVA() < a.IOVA()+uint64(a.Len()) || a.IOVA()%uint64(transport.PageSize) != 100 || b.IOVA()%uint64(transport.PageSize) != 100 {
		t.Fatalf("iova %#x %#x", a.IOVA(), b.IOVA())
	}
}

func TestRule10TaintedReplacedNeverReused(t *testing.T) { shortSoak(t, "ib", FRMR) }

func TestRule11OldRKeyDeadOnNewConnection(t *testing.T) {
	r := newRig(t, "strict", FRMR, 31, true)
	reg := r.register(0, 4096, PeerWrites)
	r.broken = true
	r.recover()
	before := append([]byte(nil), r.ini.arena.Bytes()[:4096]...)
	if st := r.stray(reg.RKey(), reg.IOVA(), 64); st != transport.StatusRemAccessErr {
		t.Fatalf("stray with old rkey on the new connection: %s", st)
	}
	if string(before) != string(r.ini.arena.Bytes()[:4096]) {
		t.Fatal("stray changed memory")
	}
}

func TestRule12PartialPostNeverWaited(t *testing.T) {
	r := newRig(t, "strict", FRMR, 32, true)
	r.prov.InjectPostFailure(r.ini.qp, 1)
	r.postFail = true
	reg, _ := r.pool.Get(Segment{Arena: r.ini.arena, Off: 0, Len: 4096}, PeerWrites)
	chain := []transport.SendWR{reg.WR(), {ID: sendBit | 1, Opcode: transport.OpSend}}
	if n, _ := r.post(chain); n != 1 {
		t.Fatalf("posted %d", n)
	}
	if s := slotState(r.pool, reg.Slot()); s.State != Tainted || s.Pending != 1 {
		t.Fatalf("slot %+v", s)
	}
	if r.pool.Stats().Outstanding != 1 {
		t.Fatal("unposted SEND counted as outstanding")
	}
}

func TestRule13DeadlineEscalates(t *testing.T) {
	r := newRig(t, "strict", FRMR, 33, true)
	reg := r.register(0, 4096, PeerWrites)
	r.prov.InjectDropCQE(r.ini.qp, 0)
	inv, _ := r.pool.Invalidate(reg)
	r.post([]transport.SendWR{inv})
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = r.pool.Tick()
	}
	if !errors.Is(err, ErrDeadline) || r.pool.Done(reg) {
		t.Fatalf("tick: %v done=%v", err, r.pool.Done(reg))
	}
	r.broken = true
	r.recover()
	if !r.pool.Done(reg) {
		t.Fatal("not replaced after teardown")
	}
}

func TestRule14ErrorCompletionFieldsIgnored(t *testing.T) {
	// strict scrambles every field of an error completion but ID, Status,
	// QPNum and VendorErr; a faulted soak passes only if none is read.
	shortSoak(t, "strict", MW)
}

func TestRule15SQBoundedSignaled(t *testing.T) {
	r := newRig(t, "strict", FRMR, 35, true)
	p := r.pool
	one := make([]transport.SendWR, 1)
	posted := 0
	for {
		one[0] = transport.SendWR{ID: sendBit | uint64(posted), Opcode: transport.OpSend}
		if err := p.Admit(one); err != nil {
			if !errors.Is(err, ErrSQFull) {
				t.Fatal(err)
			}
			break
		}
		p.Posted(one, 1)
		posted++
	}
	if posted != sqDepth-1 {
		t.Fatalf("admitted %d, want %d (one slot kept for the drain marker)", posted, sqDepth-1)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	m := []transport.SendWR{p.DrainMarker()}
	if err := p.Admit(m); err != nil {
		t.Fatal("no room for the drain marker")
	}
}

func TestRule16CQSizedForFlush(t *testing.T) {
	if CQDepth(32, 16) != 49 {
		t.Fatal("CQDepth")
	}
	shortSoak(t, "rxe", FRMR)
}

func TestRule17DrainBeforeDeciding(t *testing.T) {
	r := newRig(t, "strict", FRMR, 37, true)
	reg := r.register(0, 4096, PeerWrites)
	inv, _ := r.pool.Invalidate(reg)
	r.ini.qp.Modify(transport.QPSQD)
	r.post([]transport.SendWR{inv})
	r.pool.OnQPError()
	if err := r.pool.Recover(); !errors.Is(err, ErrNotDrained) {
		t.Fatalf("recover before drain: %v", err)
	}
	if _, err := r.pool.Get(Segment{Arena: r.ini.arena, Off: 0, Len: 10}, PeerReads); !errors.Is(err, ErrQPError) {
		t.Fatalf("get during QP error: %v", err)
	}
	r.broken = true
	r.recover()
}

func TestRule18LeastAccess(t *testing.T) {
	for _, mech := range []Mechanism{FRMR, MW} {
		r := newRig(t, "strict", mech, 38, mech == FRMR)
		reg := r.register(0, 4096, PeerReads)
		info, _ := r.prov.MRInfo(reg.RKey().Index())
		if info.Access != transport.AccessRemoteRead {
			t.Fatalf("%s: data-out access %s", mech, info.Access)
		}
		if st := r.stray(reg.RKey(), reg.IOVA(), 16); st != transport.StatusRemAccessErr {
			t.Fatalf("%s: WRITE through a read-only registration: %s", mech, st)
		}
	}
}

func TestRule19AccountingConserved(t *testing.T) { shortSoak(t, "ib", MW) }
