package transporttest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

func postSend(t *testing.T, qp transport.QP, wrs ...transport.SendWR) {
	t.Helper()
	n, err := qp.PostSend(wrs)
	if err != nil || n != len(wrs) {
		t.Fatalf("PostSend of %d WRs (first %v) on QP %d in %v: accepted %d, err %v", len(wrs), wrs[0].Opcode, qp.Num(), qp.State(), n, err)
	}
}

func postRecv(t *testing.T, qp transport.QP, wrs ...transport.RecvWR) {
	t.Helper()
	n, err := qp.PostRecv(wrs)
	if err != nil || n != len(wrs) {
		t.Fatalf("PostRecv of %d WRs on QP %d in %v: accepted %d, err %v", len(wrs), qp.Num(), qp.State(), n, err)
	}
}

// pollN collects exactly n completions (fewer on error or timeout).
func pollN(cq transport.CQ, n int, timeout time.Duration) ([]transport.WC, error) {
	out := make([]transport.WC, 0, n)
	if n == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	buf := make([]transport.WC, n)
	for {
		k, err := cq.Poll(buf[:n-len(out)])
		out = append(out, buf[:k]...)
		if err != nil {
			return out, err
		}
		if len(out) == n {
			return out, nil
		}
		if k > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			// One last poll: the completion may have raced the deadline.
			k, perr := cq.Poll(buf[:n-len(out)])
			out = append(out, buf[:k]...)
			if perr != nil {
				return out, perr
			}
			if len(out) == n {
				return out, nil
			}
			return out, fmt.Errorf("CQ.Wait: %w", err)
		}
	}
}

// waitWC waits up to timeout for exactly n completions on cq.
func waitWC(t *testing.T, cq transport.CQ, n int, timeout time.Duration) []transport.WC {
	t.Helper()
	wcs, err := pollN(cq, n, timeout)
	if err != nil {
		t.Fatalf("waiting %v for %d completions: %v; got %d: %s", timeout, n, err, len(wcs), fmtWCs(wcs))
	}
	return wcs
}

// expectNoWC asserts the CQ holds nothing now. It is only meaningful after a
// completion that, by ordering, comes after everything that could be there.
func expectNoWC(t *testing.T, cq transport.CQ, why string) {
	t.Helper()
	var buf [8]transport.WC
	n, err := cq.Poll(buf[:])
	if err != nil {
		t.Errorf("%s: Poll: %v", why, err)
		return
	}
	if n > 0 {
		t.Errorf("%s: unexpected completions %s", why, fmtWCs(buf[:n]))
	}
}

func fmtWCs(wcs []transport.WC) string {
	var sb strings.Builder
	sb.WriteString("[")
	for i := range wcs {
		if i > 0 {
			sb.WriteString(" ")
		}
		sb.WriteString(wcs[i].String())
	}
	sb.WriteString("]")
	return sb.String()
}

// checkWC checks the fields every completion must get right: ID, status and
// QP number (on an error these are the only meaningful fields,
// ibv_poll_cq(3)).
func checkWC(t *testing.T, wc transport.WC, id uint64, qp transport.QP, status ...transport.Status) bool {
	t.Helper()
	ok := true
	if wc.ID != id {
		t.Errorf("completion %s: ID %#x, want %#x", wc.String(), wc.ID, id)
		ok = false
	}
	if !slices.Contains(status, wc.Status) {
		t.Errorf("completion %s (ID %#x): status %v, want %v", wc.String(), id, wc.Status, statusList(status))
		ok = false
	}
	if wc.QPNum != qp.Num() {
		t.Errorf("completion %s (ID %#x): QPNum %d, want %d", wc.String(), id, wc.QPNum, qp.Num())
		ok = false
	}
	return ok
}

// localFail is what a WR that fails at the requester must complete with:
// one of want, or WR_FLUSH_ERR alone on a device that reports such a
// failure as a flush (Quirks.LocalErrFlushed).
func localFail(q transport.Quirks, want ...transport.Status) []transport.Status {
	if q.LocalErrFlushed {
		return []transport.Status{transport.StatusWRFlushErr}
	}
	return want
}

// checkOK checks a successful completion including its opcode.
func checkOK(t *testing.T, wc transport.WC, id uint64, qp transport.QP, op transport.WCOpcode) bool {
	t.Helper()
	if !checkWC(t, wc, id, qp, transport.StatusSuccess) {
		return false
	}
	if wc.Opcode != op {
		t.Errorf("completion %s: opcode %v, want %v", wc.String(), wc.Opcode, op)
		return false
	}
	return true
}

func statusList(s []transport.Status) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = x.String()
	}
	return strings.Join(parts, " or ")
}

// do posts one WR signaled on s and waits for its completion.
func (s *side) do(t *testing.T, wr transport.SendWR) transport.WC {
	t.Helper()
	wr.Flags |= transport.FlagSignaled
	postSend(t, s.qp, wr)
	return waitWC(t, s.scq, 1, Timeout)[0]
}

// doOK posts one WR signaled and requires success with the given opcode.
func (s *side) doOK(t *testing.T, wr transport.SendWR, op transport.WCOpcode) {
	t.Helper()
	wc := s.do(t, wr)
	if !checkOK(t, wc, wr.ID, s.qp, op) {
		t.FailNow()
	}
}

func writeWR(id uint64, src transport.SGE, raddr uint64, rkey transport.Key) transport.SendWR {
	return transport.SendWR{ID: id, Opcode: transport.OpRDMAWrite, SGL: []transport.SGE{src}, RemoteAddr: raddr, RKey: rkey}
}

func readWR(id uint64, dst transport.SGE, raddr uint64, rkey transport.Key) transport.SendWR {
	return transport.SendWR{ID: id, Opcode: transport.OpRDMARead, SGL: []transport.SGE{dst}, RemoteAddr: raddr, RKey: rkey}
}

func sendWR(id uint64, sgl ...transport.SGE) transport.SendWR {
	return transport.SendWR{ID: id, Opcode: transport.OpSend, SGL: sgl}
}

func recvWR(id uint64, sgl ...transport.SGE) transport.RecvWR {
	return transport.RecvWR{ID: id, SGL: sgl}
}

// armSentinel posts a receive on s whose flush later proves s's QP went to
// ERR.
func (s *side) armSentinel(t *testing.T, b buf, off int) {
	t.Helper()
	postRecv(t, s.qp, recvWR(sentinelID, b.sge(off, 64)))
}

// expectErrState waits for the sentinel receive to flush and checks the QP is
// in ERR (docs/verbs.md#errors-and-flushes: an error moves the QP to ERR and
// flushes both queues).
func (s *side) expectErrState(t *testing.T, why string) {
	t.Helper()
	wcs, err := pollN(s.rcq, 1, Timeout)
	if err != nil {
		t.Errorf("%s: %s QP did not flush its posted receive (QP state %v): %v", why, s.name, s.qp.State(), err)
		return
	}
	checkWC(t, wcs[0], sentinelID, s.qp, transport.StatusWRFlushErr)
	if st := s.qp.State(); st != transport.QPErr {
		t.Errorf("%s: %s QP in %v, want ERR", why, s.name, st)
	}
}

// waitEvent reads device events until match accepts one or the timeout.
func waitEvent(t *testing.T, dev transport.Device, timeout time.Duration, match func(transport.AsyncEvent) bool) (transport.AsyncEvent, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var seen []string
	for {
		ev, err := dev.NextEvent(ctx)
		if err != nil {
			t.Logf("events seen while waiting: %v (stopped: %v)", seen, err)
			return transport.AsyncEvent{}, false
		}
		if match(ev) {
			return ev, true
		}
		seen = append(seen, fmt.Sprintf("%v qp=%d %q", ev.Type, ev.QPNum, ev.Reason))
	}
}

// expectNoEvent fails the test if an event match accepts arrives within
// noEventWait.
func expectNoEvent(t *testing.T, dev transport.Device, what string, match func(transport.AsyncEvent) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), noEventWait)
	defer cancel()
	for {
		ev, err := dev.NextEvent(ctx)
		if err != nil {
			return
		}
		if match(ev) {
			t.Errorf("unexpected event %v qp=%d %q: %s", ev.Type, ev.QPNum, ev.Reason, what)
			return
		}
	}
}

// waitClosed waits for ch to close.
func waitClosed(ch <-chan struct{}, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// noEventWait is how long expectNoEvent watches for an event that must not
// come. Events a device raises for an error are queued by the time its
// completion is polled, so a short wait suffices.
const noEventWait = 300 * time.Millisecond

// sentinelID marks receives posted only to observe a flush.
const sentinelID = 0x5e7_1e1
