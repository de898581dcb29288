package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// ---- arenas and memory ----------------------------------------------------

// newArena maps size bytes. When the provider came from Run, the arena is
// unmapped after the provider is closed (the provider may address it until
// then); otherwise when the test ends.
func newArena(t *testing.T, p transport.Provider, size int) *transport.Arena {
	t.Helper()
	a, err := transport.NewArena(size, transport.ArenaOptions{})
	if err != nil {
		t.Fatalf("NewArena(%d): %v", size, err)
	}
	if o, ok := owners.Load(p); ok {
		own := o.(*owned)
		own.mu.Lock()
		own.arenas = append(own.arenas, a)
		own.mu.Unlock()
	} else {
		t.Cleanup(func() { a.Close() })
	}
	return a
}

// buf is an arena with one regular MR over all of it.
type buf struct {
	a  *transport.Arena
	mr transport.MR
}

func newBuf(t *testing.T, p transport.Provider, pd transport.PD, size int, acc transport.Access) buf {
	t.Helper()
	a := newArena(t, p, size)
	return buf{a: a, mr: regMR(t, pd, a, 0, a.Len(), acc)}
}

func regMR(t *testing.T, pd transport.PD, a *transport.Arena, off, n int, acc transport.Access) transport.MR {
	t.Helper()
	mr, err := pd.RegMR(a, off, n, acc)
	if err != nil {
		t.Fatalf("RegMR(off %d, len %d, %v): %v", off, n, acc, err)
	}
	t.Cleanup(func() { mr.Close() })
	return mr
}

// sge addresses [off, off+n) of the buffer through its MR's lkey.
func (b buf) sge(off, n int) transport.SGE {
	return transport.SGE{Addr: b.a.Addr() + uint64(off), Length: uint32(n), LKey: b.mr.LKey()}
}

func (b buf) addr(off int) uint64 { return b.a.Addr() + uint64(off) }

func (b buf) bytes(off, n int) []byte { return b.a.Bytes()[off : off+n] }

// fill writes a pattern derived from seed, different for every seed and
// position.
func fill(b []byte, seed uint32) {
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func pattern(n int, seed uint32) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// checkBytes reports the first difference between got and want.
func checkBytes(t *testing.T, what string, got, want []byte) bool {
	t.Helper()
	if bytes.Equal(got, want) {
		return true
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return false
	}
	i := 0
	for got[i] == want[i] {
		i++
	}
	diff := 0
	for j := range got {
		if got[j] != want[j] {
			diff++
		}
	}
	t.Errorf("%s: %d of %d bytes differ, first at offset %d: got %#02x, want %#02x", what, diff, len(got), i, got[i], want[i])
	return false
}

// ---- connected pairs --------------------------------------------------------

// side is one end of a connection: its own PD, a send CQ, a receive CQ and
// an RC QP.
type side struct {
	name     string
	dev      transport.Device
	attr     transport.DeviceAttr
	pd       transport.PD
	ownPD    bool
	scq, rcq transport.CQ
	qp       transport.QP
	conn     transport.Conn
	peerData []byte // private data the peer sent
	// reqCredit is the READ credit the connection request offered (the
	// passive side only).
	reqCredit transport.ReadCredit
}

type pairConfig struct {
	sendWR, recvWR int
	cqDepth        int
	signalAll      bool
	connectData    []byte
	acceptData     []byte
	// pdA and pdB, if set, are used instead of fresh PDs (and not closed).
	pdA, pdB transport.PD
	// offer, if set, is the READ credit A asks for (OfferReadCredit).
	offer *transport.ReadCredit
}

type pair struct {
	p    transport.Provider
	a, b *side
}

func (c *pairConfig) qpConfig(attr transport.DeviceAttr, scq, rcq transport.CQ) transport.QPConfig {
	sge := min(4, max(attr.MaxSGE, 1))
	return transport.QPConfig{
		SendCQ:     scq,
		RecvCQ:     rcq,
		MaxSendWR:  c.sendWR,
		MaxRecvWR:  c.recvWR,
		MaxSendSGE: sge,
		MaxRecvSGE: sge,
		MaxInline:  min(64, attr.MaxInline),
		SignalAll:  c.signalAll,
	}
}

func (c *pairConfig) defaults(attr transport.DeviceAttr) {
	if c.sendWR == 0 {
		c.sendWR = 64
	}
	if c.recvWR == 0 {
		c.recvWR = 64
	}
	if attr.MaxQPWR > 0 {
		c.sendWR = min(c.sendWR, attr.MaxQPWR)
		c.recvWR = min(c.recvWR, attr.MaxQPWR)
	}
	if c.cqDepth == 0 {
		// Room for a full flush of either queue plus a drain marker
		// (docs/registration.md#cq-sizing).
		c.cqDepth = max(c.sendWR, c.recvWR) + 8
	}
	if attr.MaxCQE > 0 {
		c.cqDepth = min(c.cqDepth, attr.MaxCQE)
	}
}

// newSide creates PD (unless given), CQs and a QP in RESET on dev.
func newSide(name string, dev transport.Device, pd transport.PD, cfg pairConfig) (*side, error) {
	s := &side{name: name, dev: dev, attr: dev.Attr(), pd: pd}
	cfg.defaults(s.attr)
	var err error
	if s.pd == nil {
		if s.pd, err = dev.AllocPD(); err != nil {
			return nil, fmt.Errorf("%s: AllocPD: %w", name, err)
		}
		s.ownPD = true
	}
	if s.scq, err = dev.CreateCQ(cfg.cqDepth); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: CreateCQ(%d): %w", name, cfg.cqDepth, err)
	}
	if s.rcq, err = dev.CreateCQ(cfg.cqDepth); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: CreateCQ(%d): %w", name, cfg.cqDepth, err)
	}
	if s.qp, err = s.pd.CreateQP(cfg.qpConfig(s.attr, s.scq, s.rcq)); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: CreateQP: %w", name, err)
	}
	return s, nil
}

func (s *side) close() {
	if s.qp != nil {
		s.qp.Close()
	}
	if s.scq != nil {
		s.scq.Close()
	}
	if s.rcq != nil {
		s.rcq.Close()
	}
	if s.ownPD && s.pd != nil {
		s.pd.Close()
	}
}

// connectPair connects two fresh QPs on p: A actively, B passively.
func connectPair(t *testing.T, p transport.Provider, cfg pairConfig) *pair {
	t.Helper()
	pr, err := tryConnectPair(t, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

func tryConnectPair(t *testing.T, p transport.Provider, cfg pairConfig) (*pair, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	l, err := p.Listen(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("Listen(\"\"): %w", err)
	}
	t.Cleanup(func() { l.Close() })

	type result struct {
		s   *side
		err error
	}
	ch := make(chan result, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			ch <- result{err: fmt.Errorf("Listener.Accept: %w", err)}
			return
		}
		s, err := newSide("B", req.Device(), cfg.pdB, cfg)
		if err != nil {
			req.Reject(nil)
			ch <- result{err: err}
			return
		}
		s.peerData = req.PrivateData()
		s.reqCredit = req.ReadCredit()
		conn, err := req.Accept(ctx, s.qp, cfg.acceptData)
		if err != nil {
			s.close()
			ch <- result{err: fmt.Errorf("ConnRequest.Accept: %w", err)}
			return
		}
		s.conn = conn
		ch <- result{s: s}
	}()

	a, aerr := func() (*side, error) {
		ep, err := p.Resolve(ctx, l.Addr())
		if err != nil {
			return nil, fmt.Errorf("Resolve(%q): %w", l.Addr(), err)
		}
		s, err := newSide("A", ep.Device(), cfg.pdA, cfg)
		if err != nil {
			ep.Close()
			return nil, err
		}
		if cfg.offer != nil {
			ep.OfferReadCredit(*cfg.offer)
		}
		conn, err := ep.Connect(ctx, s.qp, cfg.connectData)
		if err != nil {
			ep.Close()
			s.close()
			return nil, fmt.Errorf("Endpoint.Connect: %w", err)
		}
		s.conn = conn
		s.peerData = conn.PrivateData()
		return s, nil
	}()
	if aerr != nil {
		cancel()
	}
	r := <-ch
	if aerr != nil || r.err != nil {
		if a != nil {
			a.close()
		}
		if r.s != nil {
			r.s.close()
		}
		return nil, errors.Join(aerr, r.err)
	}
	t.Cleanup(a.close)
	t.Cleanup(r.s.close)
	if st := a.qp.State(); st != transport.QPRTS {
		t.Errorf("active QP after Connect is %v, want RTS", st)
	}
	if st := r.s.qp.State(); st != transport.QPRTS {
		t.Errorf("passive QP after Accept is %v, want RTS", st)
	}
	return &pair{p: p, a: a, b: r.s}, nil
}

// openDevice opens the default device.
func openDevice(t *testing.T, p transport.Provider) transport.Device {
	t.Helper()
	dev, err := p.OpenDevice("")
	if err != nil {
		t.Fatalf("OpenDevice(\"\"): %v", err)
	}
	return dev
}

// allocPD allocates a protection domain on dev, closed when the test ends.
func allocPD(t *testing.T, dev transport.Device) transport.PD {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	return pd
}

// createCQ creates a CQ of depth entries on dev, closed when the test ends.
func createCQ(t *testing.T, dev transport.Device, depth int) transport.CQ {
	t.Helper()
	cq, err := dev.CreateCQ(depth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq.Close() })
	return cq
}

// quirks of the device the provider opens by default.
func deviceAttr(t *testing.T, p transport.Provider) transport.DeviceAttr {
	t.Helper()
	return openDevice(t, p).Attr()
}

func needCaps(t *testing.T, attr transport.DeviceAttr, caps transport.Capability) {
	t.Helper()
	if !attr.Caps.Has(caps) {
		t.Skipf("device %q lacks %v (has %v)", attr.Name, caps&^attr.Caps, attr.Caps)
	}
}

// ---- posting and completions ------------------------------------------------

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

// sentinelID marks receives posted only to observe a flush.
const sentinelID = 0x5e7_1e1

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

// noEventWait is how long expectNoEvent watches for an event that must not
// come. Events a device raises for an error are queued by the time its
// completion is polled, so a short wait suffices.
const noEventWait = 300 * time.Millisecond

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
