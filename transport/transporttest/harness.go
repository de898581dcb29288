package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

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
