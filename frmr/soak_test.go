package frmr

import (
	"os"
	"strconv"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// inject applies one random fault of frmr-semantics §8.
func (r *rig) inject() {
	ini, tgt := r.ini.qp, r.tgt.qp
	if r.f19 {
		return // the target of the F19 window is gone; let it play out
	}
	switch r.rng.IntN(17) {
	case 0: // F1, F2 (ib): QP to ERR mid-burst
		r.prov.InjectQPError(ini, r.rng.IntN(4))
	case 1: // F3: lost completion → deadline → teardown
		r.prov.InjectDropCQE(ini, r.rng.IntN(3))
	case 2: // F5, F7: stray WRITE with an old rkey
		if r.retiredN > 0 {
			k := r.retiredKeys[r.rng.IntN(min(r.retiredN, len(r.retiredKeys)))]
			r.stray(k.key, k.iova, 16)
		}
	case 3: // F6, rule 18: stray WRITE with a live rkey before invalidation
		for tag := range r.ios {
			x := &r.ios[tag]
			if x.state != ioPosted {
				continue
			}
			x.strayHit = true
			st := r.stray(x.reg.RKey(), x.reg.IOVA(), min(16, x.n))
			if x.dir == PeerReads && st == transport.StatusSuccess {
				r.fatalf("rule 18: WRITE through a REMOTE_READ registration succeeded")
			}
			break
		}
	case 4: // F8: duplicate request packets
		if r.rng.IntN(2) == 0 {
			r.prov.InjectDuplicate(ini, r.rng.IntN(3))
		} else {
			r.prov.InjectDuplicate(tgt, r.rng.IntN(3))
		}
	case 5: // F9: link cut (possibly during a target READ)
		r.prov.CutLink(tgt)
	case 6: // F10: post_send fails partway through a chain
		r.prov.InjectPostFailure(ini, r.rng.IntN(2))
		r.postFail = true
	case 7: // F12: CQ overrun
		r.overrunOK = true
		r.prov.InjectCQOverrun(r.ini.cq)
	case 8: // F15: SEND_WITH_INV naming the wrong key
		r.bogusNext = true
	case 9: // F16: SEND_WITH_INV chained behind the target's READ
		r.fenceless = true
	case 10: // F17: receive completion overtakes the send completion
		r.deferSends = true
	case 11: // F1 variant: consumer disconnect
		r.ini.conn.Disconnect()
	case 12: // F4: completions lost during a flush
		if r.rng.IntN(2) == 0 {
			// rxe-like: CQ full during the flush, the rest dropped.
			r.lossy = r.rng.IntN(8)
			r.prov.InjectQPError(ini, r.rng.IntN(4))
		} else {
			// A CQ below CQDepth from the next connection on.
			r.nextCQ = rqDepth/2 + r.rng.IntN(sqDepth)
			r.broken = true
		}
	case 13: // F13: the next registration fails on the device
		r.f13Arm = 1 + r.rng.IntN(3)
	case 14: // F14: the next LOCAL_INV names a wrong key
		r.f14Next = true
	case 15: // F19: QP back to INIT, posts before RTS
		r.f19n++
		r.resetToInit(r.rng.IntN(2) == 0)
	case 16: // F7: stray with a wrapped rkey and its old va
		r.strayWrapped()
	}
}

func soakN(short int) int {
	if v := os.Getenv("GOSRP_FRMR_SOAK"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return short
}

func soakSeed(def int64) int64 {
	if v := os.Getenv("GOSRP_FRMR_SEED"); v != "" {
		if n, err := strconv.ParseInt(v, 0, 64); err == nil {
			return n
		}
	}
	return def
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
// GOSRP_FRMR_SOAK) with F1–F20 injected, invariants checked every step.
func TestSoak(t *testing.T) {
	n := soakN(2000)
	if testing.Short() {
		n = 300
	}
	for _, profile := range []string{"strict", "ib", "iwarp", "rxe"} {
		for _, mech := range []Mechanism{FRMR, MW} {
			t.Run(profile+"/"+mech.String(), func(t *testing.T) {
				seed := soakSeed(int64(len(profile))*1000 + int64(mech))
				r := runSoak(t, profile, mech, seed, n, 0.02)
				st := r.pool.Stats()
				t.Logf("seed %d: %d I/Os ok, %d failed, %d recoveries, %d strays (%d F7 wrapped), %d bogus invalidations, F13 %d (%d REG errors seen), F14 %d, F19 %d, %d flush CQEs lost (F4); stats %+v",
					seed, r.done, r.failedIO, r.recovers, r.strays, r.f7, r.bogus, r.f13Inj, r.f13Seen, r.f14, r.f19n, r.lostCQEs, st)
			})
		}
	}
}
