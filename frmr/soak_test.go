package frmr

import (
	"math"
	"testing"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/gosrp/gosrp/transport"
)

// inject applies one random fault of docs/registration.md#fault-scenarios;
// each case names its heading there.
func (r *rig) inject() {
	ini, tgt := r.ini.qp, r.tgt.qp
	if r.preRTS {
		return // the target of the posts-before-RTS window is gone; let it play out
	}
	switch r.rng.IntN(17) {
	case 0: // QP error mid-burst; poisoned after a flush (ib)
		r.prov.InjectQPError(ini, r.rng.IntN(4))
	case 1: // lost completion: deadline → teardown
		r.prov.InjectDropCQE(ini, r.rng.IntN(3))
	case 2: // stray after re-registration; stray with a wrapped key
		if r.retiredN > 0 {
			k := r.retiredKeys[r.rng.IntN(min(r.retiredN, len(r.retiredKeys)))]
			r.stray(k.key, k.iova, 16)
		}
	case 3: // stray before invalidation; least privilege
		for tag := range r.ios {
			x := &r.ios[tag]
			if x.state != ioPosted {
				continue
			}
			x.strayHit = true
			st := r.stray(x.reg.RKey(), x.reg.IOVA(), min(16, x.n))
			if x.dir == PeerReads && st == transport.StatusSuccess {
				r.fatalf("least privilege: WRITE through a REMOTE_READ registration succeeded")
			}
			break
		}
	case 4: // duplicate packets
		if r.rng.IntN(2) == 0 {
			r.prov.InjectDuplicate(ini, r.rng.IntN(3))
		} else {
			r.prov.InjectDuplicate(tgt, r.rng.IntN(3))
		}
	case 5: // disconnect during a read: link cut (possibly during a target READ)
		r.prov.CutLink(tgt)
	case 6: // partial post: post_send fails partway through a chain
		r.prov.InjectPostFailure(ini, r.rng.IntN(2))
		r.postFail = true
	case 7: // CQ overrun
		r.overrunOK = true
		r.prov.InjectCQOverrun(r.ini.cq)
	case 8: // bogus remote invalidation: SEND_WITH_INV naming the wrong key
		r.bogusNext = true
	case 9: // invalidate behind a read: SEND_WITH_INV chained behind the target's READ
		r.fenceless = true
	case 10: // receive before send completion: receive completion overtakes the send completion
		r.deferSends = true
	case 11: // QP error mid-burst variant: consumer disconnect
		r.ini.conn.Disconnect()
	case 12: // completions lost in a flush
		if r.rng.IntN(2) == 0 {
			// rxe-like: CQ full during the flush, the rest dropped.
			r.lossy = r.rng.IntN(8)
			r.prov.InjectQPError(ini, r.rng.IntN(4))
		} else {
			// A CQ below CQDepth from the next connection on.
			r.nextCQ = rqDepth/2 + r.rng.IntN(sqDepth)
			r.broken = true
		}
	case 13: // failed registration: the next registration fails on the device
		r.regFailArm = 1 + r.rng.IntN(3)
	case 14: // wrong-key invalidation: the next LOCAL_INV names a wrong key
		r.wrongInvNext = true
	case 15: // posts before RTS: QP back to INIT
		r.preRTSN++
		r.resetToInit(r.rng.IntN(2) == 0)
	case 16: // stray with a wrapped key and its old va
		r.strayWrapped()
	}
}

// soakN is GOSRP_FRMR_SOAK's I/O count, or short; a malformed value
// fails the test rather than running the short form.
func soakN(t testing.TB, short int) int {
	return int(testenv.Int(t, "GOSRP_FRMR_SOAK", int64(short), 1))
}

// soakSeed is GOSRP_FRMR_SEED, or def (each run's own fixed seed).
func soakSeed(t testing.TB, def int64) int64 {
	return testenv.Int(t, "GOSRP_FRMR_SEED", def, math.MinInt64)
}

func runSoak(t *testing.T, profile string, mech Mechanism, seed int64, n int, faultRate float64) *rig {
	r := newRig(t, profile, mech, seed, mech == FRMR)
	steps := 0
	for r.done+r.failedIO < n {
		steps++
		if steps > 200*n {
			r.fatalf("no progress: %d steps, %d done, %d failed", steps, r.done, r.failedIO)
		}
		if r.rng.Float64() < faultRate {
			r.inject()
		}
		if r.deferSends && r.rng.IntN(4) == 0 {
			r.deferSends = false
		}
		r.step()
	}
	return r
}

// TestSoak is the randomized, seeded run: thousands of I/Os (set
// GOSRP_FRMR_SOAK) with the fault scenarios injected, invariants checked
// every step.
func TestSoak(t *testing.T) {
	n := soakN(t, 2000)
	if testing.Short() {
		n = 300
	}
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		for _, mech := range []Mechanism{FRMR, MW} {
			t.Run(profile+"/"+mech.String(), func(t *testing.T) {
				seed := soakSeed(t, int64(len(profile))*1000+int64(mech))
				r := runSoak(t, profile, mech, seed, n, 0.02)
				st := r.pool.Stats()
				t.Logf("seed %d: %d I/Os ok, %d failed, %d recoveries, %d strays (%d with a wrapped key), %d bogus invalidations, %d failed registrations (%d REG errors seen), %d wrong-key invalidations, %d posts before RTS, %d flush CQEs lost; stats %+v",
					seed, r.done, r.failedIO, r.recovers, r.strays, r.wrappedStrays, r.bogus, r.regFailInj, r.regFailSeen, r.wrongInv, r.preRTSN, r.lostCQEs, st)
			})
		}
	}
}
