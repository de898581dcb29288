//go:build linux && cgo && ibverbs

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"github.com/gosrp/gosrp/transport"
)

// The provider's view of the windows bound through a QP: rolled back when
// a send fails, counted before the QP is destroyed, and invalidations
// rxe would mishandle rewritten so they fail as on a strict device.

// rollbackWindows restores the windows changed by outstanding sends from
// slot from on, latest first so that the earliest state wins. Caller
// holds ringMu.
func (q *QP) rollbackWindows(from uint32) {
	q.undoWindows(from, q.shead)
}

// undoWindows restores the windows changed by slots [from, to). Caller
// holds ringMu.
func (q *QP) undoWindows(from, to uint32) {
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
		e.w.winState = e.before
		e.w = nil
	}
	if locked {
		q.d.winMu.Unlock()
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
		if w.bound && w.bqp == q {
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
//   - a FREE window: rxe (Linux 6.1) dereferences the window's NULL QP in
//     rxe_do_invalidate_mw and panics the kernel;
//   - a window bound on another QP, or of another PD: rxe invalidates it.
func (q *QP) trackInvalidate(i int, slot uint32, k transport.Key, send bool) {
	d := q.d
	d.winMu.Lock()
	defer d.winMu.Unlock()
	w := d.windows[k.Index()]
	if w == nil || k != w.cur {
		// Not a window, or a key the device refuses on the key compare
		// before it looks at the state: harmless.
		return
	}
	refuse := !w.bound
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
