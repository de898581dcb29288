package frmr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// The faults with the most moving parts (completions lost in a flush, stray
// with a wrapped key, failed registration, wrong-key invalidation, posts
// before RTS: headings of docs/registration.md#fault-scenarios, as are the
// invariant names in messages and comments here): the rig's hooks
// (used by the soak's fault menu) and one named test each.

// onIniSendWC handles one initiator send completion.
func (r *rig) onIniSendWC(wc *transport.WC) {
	ok := wc.Status == transport.StatusSuccess
	switch {
	case r.regFailIDs[wc.ID] != nil:
		// failed registration: a failed REG completes in error although
		// unsignaled (docs/verbs.md#completions); its own status is the
		// device's, not an I/O's reuse.
		if ok {
			r.fatalf("failed registration: the REG/BIND that must fail completed SUCCESS")
		}
		r.regFailSeen++
		r.regFailStatus = wc.Status
	case r.wrongInvIDs[wc.ID]:
		// wrong-key invalidation: a LOCAL_INV naming a wrong key. Full-key
		// devices (strict, rxe) must refuse it; index-only devices (ib,
		// iwarp) accept it, which is how srp's off-by-one keys went unnoticed
		// (docs/registration.md#early-recycling).
		if ok && !r.prov.Profile().Quirks.InvalidateIndexOnly {
			r.fatalf("wrong-key invalidation: LOCAL_INV with a wrong key succeeded on a full-key-compare device")
		}
	default:
		if wc.Status == transport.StatusMWBindErr && !r.bogusConn {
			r.mwBind++
			k, sl, g, _ := decodeID(wc.ID)
			r.mwBindWhy = fmt.Sprintf("wr %#x (kind %d slot %d gen %d; last failed registration %#x)", wc.ID, k, sl, g, r.regFailID)
		}
	}
	r.pool.OnSendCompletion(wc)
	if f := r.regFailIDs[wc.ID]; f != nil {
		if s := slotState(r.pool, f.slot); s.Gen == f.gen && s.State != Tainted {
			r.fatalf("failed registration: MR of the failed REG is %s, want TAINTED", s.State)
		}
	}
	if !ok || r.pool.Err() != nil {
		r.broken = true
	}
}

type regFailRec struct {
	slot int
	gen  uint32
}

// clearInjected forgets the WRs of the injected failed registration and
// wrong-key invalidation once the connection is gone.
func (r *rig) clearInjected() {
	clear(r.regFailIDs)
	clear(r.regFailReqs)
	clear(r.wrongInvIDs)
	r.regFailID = 0
}

// breakReg makes the registration of the I/O being started fail on the device
// (failed registration): variant 0 a malformed REG (invalid access; for a
// window a range outside the base MR), 1 a PD mismatch (an object of the
// target's PD), 2 a REG/BIND on an object the device holds VALID (a
// registration of the same object and key chained in front of it).
func (r *rig) breakReg(chain []transport.SendWR, reg Reg) []transport.SendWR {
	v := r.regFailArm - 1
	r.regFailArm = 0
	r.regFailInj++
	ri := len(chain) - 2 // the registration, after the fence if any, before its SEND
	r.regFailID, r.regFailSlot, r.regFailGen = chain[ri].ID, reg.Slot(), reg.gen
	r.regFailIDs[r.regFailID] = &regFailRec{slot: reg.Slot(), gen: reg.gen}
	r.regFailReqs[r.nextReq] = true
	w := &chain[ri]
	frmr := w.Opcode == transport.OpRegMR
	switch v {
	case 0:
		if frmr {
			w.Reg.Access = transport.AccessRemoteWrite // without LOCAL_WRITE: invalid
		} else {
			w.Bind.Length = uint64(r.ini.mr.Len()) + uint64(transport.PageSize)
		}
	case 1:
		var err error
		if frmr {
			if r.spareFR == nil {
				if r.spareFR, err = r.tgt.pd.AllocFastRegMR(maxPages); err != nil {
					r.fatalf("spare MR: %v", err)
				}
			}
			w.Reg.MR = r.spareFR
		} else {
			if r.spareMW == nil {
				if r.spareMW, err = r.tgt.pd.AllocMW(); err != nil {
					r.fatalf("spare MW: %v", err)
				}
			}
			w.Bind.MW = r.spareMW
		}
	default:
		sneak := *w
		r.sendID++
		sneak.ID = sendBit | 3<<20 | r.sendID
		sneak.Flags = 0
		r.injRegOnValid++
		return append([]transport.SendWR{sneak}, chain...)
	}
	return chain
}

// resetToInit is the first half of a reconnect that reuses the initiator QP:
// the QP goes to RESET (its WRs are discarded without completions, so the
// pool is Reset: drained teardown) and then INIT; the old target is
// destroyed. From here the rig posts without looking at the QP state (posts
// before RTS): strict devices refuse the posts, ib drops them silently. With
// reconnect the QP is connected again after the first accepted post (the race
// of a reconnect), so later completions skip the dropped WRs.
func (r *rig) resetToInit(reconnect bool) {
	r.pool.OnQPError()
	r.ini.qp.Modify(transport.QPReset)
	r.tgt.qp.Close()
	r.tgt.cq.Close()
	// Purge the QP's unpolled completions, as mlx4/mlx5 do on RESET.
	for {
		n, err := r.ini.cq.Poll(r.wcs)
		if err != nil || n == 0 {
			break
		}
	}
	r.deferSends, r.deferred = false, nil
	r.pool.Reset()
	r.recoverIOs("after the reset")
	if err := r.ini.qp.Modify(transport.QPInit); err != nil {
		r.fatalf("modify INIT: %v", err)
	}
	for i := 0; i < rqDepth; i++ {
		r.postRecv(&r.ini, i)
	}
	r.clearInjected()
	r.preRTS, r.preRTSReconnect, r.preRTSPosted = true, reconnect, false
	r.broken = false
}

// strayWrapped is stray with a wrapped key: a stray WRITE with an (rkey, va)
// advertised by an earlier registration whose rkey a live I/O holds again
// (the 8-bit key wrapped, or the device reused the index with that key).
func (r *rig) strayWrapped() {
	for tag := range r.ios {
		x := &r.ios[tag]
		if x.state != ioPosted {
			continue
		}
		va, ok := r.keyHist[x.reg.RKey()]
		if !ok || va == x.reg.IOVA() {
			continue
		}
		if r.mech == MW && r.prov.Profile().Quirks.WindowBoundsUnchecked {
			return // the window would not bound it: TestStaleWrappedKey
		}
		r.wrappedStrays++
		st := r.stray(x.reg.RKey(), va, 16)
		if r.mech == FRMR && st == transport.StatusSuccess {
			r.fatalf("varying iova (stray with a wrapped key): stray WRITE with a wrapped rkey %s and its old va %#x succeeded (live iova %#x)", x.reg.RKey(), va, x.reg.IOVA())
		}
		if st == transport.StatusSuccess {
			// A window's va is not tagged: the write landed inside the live
			// registration, memory the pool still owns (the accepted risk of
			// a stray with a wrapped key; unique live keys keeps that rkey on
			// one I/O only).
			x.strayHit = true
		}
		return
	}
}

// runUntilRecovered polls (without starting I/Os) until the rig has torn
// the connection down and rebuilt it.
func (r *rig) runUntilRecovered() {
	r.t.Helper()
	rec := r.recovers
	for i := 0; r.recovers == rec; i++ {
		if i > 20000 {
			r.fatalf("no recovery")
		}
		if !r.broken && !r.poll() {
			r.idle()
		}
		r.retire()
		r.check()
		if r.broken {
			r.recover()
		}
	}
}

// TestLostFlushCompletions: completions lost during a flush. rxe-like:
// the CQ fills during the flush and the remaining flush completions
// (including the drain marker's) are dropped; undersized: a CQ below
// CQDepth overruns during the flush (the software NIC kills the CQ). The
// pool must not wait forever (bounded waits), must not recycle anything on the
// strength of what it did not see, and replaces every MR that was in use.
func TestLostFlushCompletions(t *testing.T) {
	for _, mech := range []Mechanism{FRMR, MW} {
		for _, mode := range []string{"rxe-like", "undersized"} {
			t.Run(mech.String()+"/"+mode, func(t *testing.T) {
				r := newRig(t, "rxe", mech, 40, mech == FRMR)
				if mode == "undersized" {
					r.nextCQ = rqDepth / 2
					r.broken = true
					r.recover()
					if !r.overrunOK || r.ini.cq.Depth() != rqDepth/2 {
						t.Fatalf("CQ depth %d", r.ini.cq.Depth())
					}
				}
				for i := 0; i < 5; i++ {
					r.step()
				}
				for tag := range r.ios {
					if r.ios[tag].state == ioIdle && !r.broken {
						r.start(tag)
					}
				}
				inUse := r.busySlots()
				if len(inUse) == 0 {
					t.Fatal("nothing in use")
				}
				st0 := r.pool.Stats()
				if mode == "rxe-like" {
					r.lossy = 2
				}
				r.ini.qp.Modify(transport.QPErr)
				r.runUntilRecovered()
				st := r.pool.Stats()
				switch mode {
				case "rxe-like":
					if r.lostCQEs == 0 {
						t.Fatal("no flush completion was lost")
					}
					if st.Deadlines == st0.Deadlines {
						t.Fatal("the drain ended without the pool's deadline (bounded waits)")
					}
				}
				// A slot in use at the flush is either replaced or was proven
				// FREE by a SUCCESS polled before the flush completions
				// (rig.check: FREE on the device, one live generation).
				replaced := 0
				r.pool.Slots(func(s SlotInfo) {
					if u, ok := inUse[s.Slot]; ok && s.Gen != u.Gen {
						replaced++
					}
				})
				if replaced == 0 || st.Replacements == st0.Replacements {
					t.Fatalf("no MR replaced after the flush: %+v", st)
				}
				for r.done < 60 {
					r.step()
				}
				t.Logf("%d flush completions lost; stats %+v", r.lostCQEs, st)
			})
		}
	}
}

// TestStaleWrappedKey: a hostile peer keeps every descriptor (rkey,
// iova, length) it was ever handed and, while each new registration of
// the same MR is live, fires all of them. The 8-bit key wraps every 256
// registrations, so without the iova tag (FRMR) or window rotation (MW)
// the descriptor of 256 registrations ago is served inside the live
// registration. None may be served, on any profile, across four wraps;
// the live descriptor itself must be (the probe is not vacuous).
func TestStaleWrappedKey(t *testing.T) {
	const rounds = 1024
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		for _, mech := range []Mechanism{FRMR, MW} {
			t.Run(profile+"/"+mech.String(), func(t *testing.T) {
				r := newRig(t, profile, mech, 70, true)
				c := newCycleOn(r, true)
				type desc struct {
					key  transport.Key
					iova uint64
					n    int
				}
				var seen []desc
				stray := make([]byte, 64)
				for i := range stray {
					stray[i] = 0xEE
				}
				slot, wraps := -1, 0
				c.live = func(live Reg) {
					if slot < 0 {
						slot = live.Slot()
					} else if live.Slot() != slot {
						t.Fatalf("QD1 took slot %d, want %d", live.Slot(), slot)
					}
					if ok, why, err := r.prov.Probe(r.ini.qp, transport.OpRDMAWrite, live.RKey(), live.IOVA()+8, stray); err != nil || !ok {
						t.Fatalf("the live descriptor %s@%#x is refused (%s, %v): the probe proves nothing", live.RKey(), live.IOVA(), why, err)
					}
					for _, d := range seen {
						if d.key == live.RKey() {
							wraps++
						}
						if ok, _, _ := r.prov.Probe(r.ini.qp, transport.OpRDMAWrite, d.key, d.iova+8, stray); ok {
							t.Fatalf("registration %d: stale descriptor %s@%#x+%d served while %s@%#x is live", len(seen), d.key, d.iova, d.n, live.RKey(), live.IOVA())
						}
					}
					seen = append(seen, desc{live.RKey(), live.IOVA(), live.Len()})
				}
				for i := 0; i < rounds; i++ {
					c.run(t)
				}
				st := r.pool.Stats()
				t.Logf("%d registrations, %d live keys equal to an earlier one, %d window rotations", rounds, wraps, st.Rotations)
				if mech == FRMR && wraps == 0 {
					t.Fatalf("the key never wrapped: the test did not reach the hazard")
				}
				if mech == MW && st.Rotations < rounds/maxBinds {
					t.Fatalf("%d rotations in %d registrations of one window, want >= %d", st.Rotations, rounds, rounds/maxBinds)
				}
				if err := r.pool.Check(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestRegFailure: a REG_MR (BIND_MW) the device rejects — malformed
// (bad page list / access), PD mismatch, REG on VALID — completes in
// error although unsignaled (WR_FLUSH_ERR alone where the device hides
// the cause, Quirks.LocalErrFlushed); the SEND chained behind it is
// flushed, so the target never sees the key; the MR is TAINTED and
// replaced.
func TestRegFailure(t *testing.T) {
	for _, profile := range []string{"strict", "rxe"} {
		for _, mech := range []Mechanism{FRMR, MW} {
			for v, name := range []string{"malformed", "pd-mismatch", "reg-on-valid"} {
				t.Run(profile+"/"+mech.String()+"/"+name, func(t *testing.T) {
					r := newRig(t, profile, mech, 130+int64(v), mech == FRMR)
					r.regFailArm = v + 1
					r.start(0)
					if r.ios[0].state != ioPosted || r.regFailID == 0 {
						t.Fatalf("not started: %+v", r.ios[0])
					}
					slot, gen := r.regFailSlot, r.regFailGen
					r.runUntilRecovered() // the target fatals if it sees the command
					if r.regFailSeen != 1 {
						t.Fatalf("%d error completions for the unsignaled REG, want 1", r.regFailSeen)
					}
					prof, err := emu.LookupProfile(profile)
					if err != nil {
						t.Fatal(err)
					}
					want := transport.StatusMWBindErr
					switch {
					case prof.Quirks.LocalErrFlushed:
						// rxe on Linux 6.12: the failed REG reports only a
						// flush, and the pool must still see it for what it is.
						want = transport.StatusWRFlushErr
					case mech == FRMR:
						want = prof.Quirks.LocalOpErrStatus
					}
					if r.regFailStatus != want {
						t.Errorf("REG failed with %s, want %s", r.regFailStatus, want)
					}
					if s := slotState(r.pool, slot); s.Gen == gen {
						t.Fatalf("slot %d not replaced: %+v", slot, s)
					}
					c := r.prov.Counters()
					if wantRoV := uint64(v / 2); c.RegOnValid != wantRoV {
						t.Fatalf("%d REG on VALID, want %d", c.RegOnValid, wantRoV)
					}
					for r.done < 30 {
						r.step()
					}
				})
			}
		}
	}
}

// TestWrongKeyLocalInv: a LOCAL_INV naming a wrong key (a pool bug,
// simulated). strict and rxe refuse it (error completion, QP to ERR, MR
// TAINTED); ib and iwarp match on the index only and invalidate anyway.
// The pool itself never does this: rig.check counts key mismatches on
// every step of the soak (invalidate the device key).
func TestWrongKeyLocalInv(t *testing.T) {
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		t.Run(profile, func(t *testing.T) {
			r := newRig(t, profile, FRMR, 140, true)
			reg := r.register(0, 4096, PeerWrites)
			inv, err := r.pool.Invalidate(reg)
			if err != nil {
				t.Fatal(err)
			}
			inv.InvalidateKey = inv.InvalidateKey.Bump()
			r.wrongInv++
			r.post([]transport.SendWR{inv})
			r.waitIni(func() bool { return r.pool.Drained() })
			c := r.prov.Counters()
			if r.prov.Profile().Quirks.InvalidateIndexOnly {
				if !r.pool.Done(reg) || r.pool.Err() != nil || c.InvKeyMismatch != 0 {
					t.Fatalf("index-only device: done=%v err=%v mismatches=%d", r.pool.Done(reg), r.pool.Err(), c.InvKeyMismatch)
				}
				return
			}
			if r.pool.Done(reg) || slotState(r.pool, reg.Slot()).State != Tainted || r.pool.Err() == nil || c.InvKeyMismatch != 1 {
				t.Fatalf("full-key device: done=%v slot %+v err=%v mismatches=%d", r.pool.Done(reg), slotState(r.pool, reg.Slot()), r.pool.Err(), c.InvKeyMismatch)
			}
			r.broken = true
			r.recover()
			if !r.pool.Done(reg) {
				t.Fatal("not replaced")
			}
		})
	}
}

// TestPostBeforeRTS: posts to a QP in INIT. strict and iwarp refuse
// them at once: nothing is outstanding, the REG's MR is replaced. On rxe
// the pool is fenced (Config.FenceRegistrations) and registers nothing
// before a new QP's prologue. ib
// accepts and drops them: the pool counts them outstanding only until its
// deadline (bounded waits). In the reconnect race the QP reaches RTS after the
// dropped posts and a later signaled WR completes: the pool must not take
// that as proof the dropped REG and SEND executed.
func TestPostBeforeRTS(t *testing.T) {
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		for _, mech := range []Mechanism{FRMR, MW} {
			t.Run(profile+"/"+mech.String(), func(t *testing.T) {
				r := newRig(t, profile, mech, 190, mech == FRMR)
				r.resetToInit(false)
				r.start(0)
				x := &r.ios[0]
				drops := r.prov.Profile().Quirks.DropPostsBeforeRTS
				st := r.pool.Stats()
				if r.pool.cfg.FenceRegistrations {
					// The reset broke the fence: nothing registers
					// until a new QP's prologue, so nothing is posted
					// before RTS at all.
					if x.state != ioIdle || !r.broken || st.Outstanding != 0 {
						t.Fatalf("fenced pool registered on a QP in INIT: io %+v, broken %v, stats %+v", *x, r.broken, st)
					}
					r.recover()
					for r.done < 20 {
						r.step()
					}
					return
				}
				if !drops {
					if !x.failed || st.Outstanding != 0 || slotState(r.pool, x.reg.Slot()).State != Tainted {
						t.Fatalf("refused post: io %+v, stats %+v", *x, st)
					}
					r.recover()
					for r.done < 20 {
						r.step()
					}
					return
				}
				if x.failed || st.Outstanding != 2 {
					t.Fatalf("dropped post: io failed=%v, %d outstanding", x.failed, st.Outstanding)
				}
				var err error
				n := 0
				for ; err == nil && n < 2*r.pool.cfg.DeadlineTicks; n++ {
					err = r.pool.Tick()
				}
				if !errors.Is(err, ErrDeadline) || r.pool.Done(x.reg) {
					t.Fatalf("after %d ticks: %v, done=%v", n, err, r.pool.Done(x.reg))
				}
				r.broken = true
				r.recover()
				if !r.pool.Done(x.reg) {
					t.Fatal("dropped registration not replaced")
				}

				// The reconnect race.
				r.resetToInit(true)
				r.start(0)
				dropped := r.ios[0].reg
				r.connectQP(true)
				lost := r.pool.Stats().LostCompletions
				r.start(1)
				r.waitIni(func() bool { return r.pool.Err() != nil })
				if !errors.Is(r.pool.Err(), ErrLostCompletion) || r.pool.Stats().LostCompletions != lost+1 {
					t.Fatalf("pool error %v, lost completions %d", r.pool.Err(), r.pool.Stats().LostCompletions)
				}
				if s := slotState(r.pool, dropped.Slot()); s.State != Tainted {
					t.Fatalf("taint on error: the dropped REG's MR is %s, want TAINTED (the device never registered it)", s.State)
				}
				r.broken = true
				r.recover()
				for r.done < 20 {
					r.step()
				}
				if r.mwBind != 0 {
					t.Fatalf("%d MW_BIND_ERR", r.mwBind)
				}
			})
		}
	}
}
