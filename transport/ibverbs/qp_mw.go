//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"github.com/gosrp/gosrp/transport"
)

// The provider's view of the windows bound through a QP: rolled back for
// sends never given to the device, made unsure when a send fails or is
// flushed, counted before the QP is destroyed, and invalidations rxe
// would mishandle rewritten so they fail as on a strict device.

// undoWindows restores the windows changed by slots [from, to), latest
// first so that the earliest state wins: requests that were never given
// to the device (ibv_post_send's bad_wr and those after it). A window
// doubted meanwhile (by another QP's failure) stays unsure. Caller holds
// ringMu.
func (q *QP) undoWindows(from, to uint32) {
	q.eachWindowSlot(from, to, func(e *sendSlot) {
		w := e.w
		was := w.unsure
		w.winState = e.before
		if was && !w.unsure {
			w.unsure = true
		} else if w.unsure && !was {
			q.d.doubted.Add(1)
		}
	})
}

// eachWindowSlot calls f under winMu for each slot of [from, to) that
// changed a window, latest first, then forgets the slot's window. Caller
// holds ringMu.
func (q *QP) eachWindowSlot(from, to uint32, f func(e *sendSlot)) {
	if from == to {
		return
	}
	locked := false
	for s := to; s != from; {
		s--
		e := &q.sring[s&q.smask]
		if e.w == nil {
			continue
		}
		if !locked {
			q.d.winMu.Lock()
			locked = true
		}
		f(e)
		e.w = nil
	}
	if locked {
		q.d.winMu.Unlock()
	}
}

// doubtWindows makes unsure the windows changed by slots [from, to):
// requests that failed or were flushed, or whose QP was reset. Restoring
// the state from before them (undoWindows) would assume they never
// executed, and on rxe a flushed request may have: from Linux 6.10 its
// completer, once the requester has moved the QP to ERR, flushes the
// whole send queue, requests the requester had already carried out
// included (transport.Quirks.LocalErrFlushed). A window so restored to
// "bound" that the device holds FREE let a SEND_WITH_INV through, and
// rxe's receiver dereferenced the FREE window's NULL QP and panicked the
// 6.12 guest (the faults run of TestRXEEndToEnd, 2 runs in 6). An unsure
// window has every invalidation naming its index refused
// (trackInvalidate) until a BIND_MW of it posted since completes
// successfully (windowsConfirmed), or it is deallocated. Its key is the
// one from before the requests, latest first so that the earliest wins,
// the device's if they did not execute (always so on 6.1): a BIND_MW
// names it to rxe as the window's current key (ibv_mw.rkey), and if the
// guess is wrong the bind fails, which the consumer takes as it takes
// any failed bind. Caller holds ringMu.
func (q *QP) doubtWindows(from, to uint32) {
	q.eachWindowSlot(from, to, func(e *sendSlot) {
		w := e.w
		if !w.unsure {
			w.unsure = true
			q.d.doubted.Add(1)
		}
		w.doubts++
		bqp := e.before.bqp
		if e.bind {
			bqp = q // it may hold q (windowsHeld)
		}
		w.cur, w.bqp, w.bound = e.before.cur, bqp, false
	})
}

// windowsConfirmed takes the successful completion of slots [from, to):
// a BIND_MW posted after its window was last doubted has bound it, so
// the window's state is known again. Caller holds ringMu.
func (q *QP) windowsConfirmed(from, to uint32) {
	for s := from; s != to; s++ {
		e := &q.sring[s&q.smask]
		if !e.bind {
			continue
		}
		q.d.winMu.Lock()
		if w := e.w; w != nil && w.unsure && w.doubts == e.doubts {
			w.unsure = false
			q.d.doubted.Add(-1)
		}
		q.d.winMu.Unlock()
		e.bind = false
	}
}

// windowsHeld counts the windows that, as far as posts and polled
// completions tell, are bound through q. On rxe each holds a reference
// on q (rxe_do_bind_mw) that only an invalidation or the window's
// deallocation drops, and ibv_destroy_qp waits for it (~50 s in the test
// VM), then warns in __rxe_cleanup.
func (q *QP) windowsHeld() int {
	q.d.winMu.RLock()
	defer q.d.winMu.RUnlock()
	n := 0
	for _, w := range q.d.windows {
		if (w.bound || w.unsure) && w.bqp == q {
			n++
		}
	}
	return n
}

// invalidKey names no object on rxe: index 0 is never allocated, so a
// LOCAL_INV of it fails with LOC_QP_OP_ERR (rxe_invalidate_mr: no MR).
const invalidKey = 0

// trackInvalidate applies a LOCAL_INV (or, on a loopback connection, a
// SEND_WITH_INV whose key names a window of this device) in entry i (ring
// slot slot) to the provider's view of its windows.
//
// On rxe it rewrites the invalidation of a window that a strict device
// refuses to name invalidKey, so that it fails as on a strict device
// (LOCAL_INV: LOC_QP_OP_ERR; SEND_WITH_INV: REM_INV_REQ_ERR at the
// receiver) with the consumer's wr_id and the QP in ERR:
//   - a FREE window: rxe (Linux 6.1 and 6.12) dereferences the window's
//     NULL QP in rxe_do_invalidate_mw and panics the kernel;
//   - an unsure window (doubtWindows), under any key: it may be FREE;
//   - a window bound on another QP, or of another PD: rxe invalidates it.
func (q *QP) trackInvalidate(i int, slot uint32, k transport.Key, send bool) {
	d := q.d
	d.winMu.Lock()
	defer d.winMu.Unlock()
	w := d.windows[k.Index()]
	if w == nil || !w.unsure && k != w.cur {
		// Not a window, or a key the device refuses on the key compare
		// before it looks at the state: harmless. An unsure window's
		// device key is not known.
		return
	}
	refuse := !w.bound || w.unsure
	if !send && (w.pd != q.pd || (w.bqp != nil && w.bqp != q)) {
		refuse = true
	}
	if refuse {
		if d.guardFreeInv {
			q.swr[i].inv_rkey = invalidKey
		}
		return
	}
	q.sring[slot].w, q.sring[slot].before = w, w.winState
	w.bound = false
}
