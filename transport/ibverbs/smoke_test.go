//go:build linux && cgo && ibverbs

package ibverbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// These tests need an RDMA device; they run in the rxe VM through
// test/rxe/run.sh and skip elsewhere.

const regionSize = 64 << 10

func newProvider(t *testing.T) *Provider {
	t.Helper()
	return newProviderOpts(t, nil)
}

// newProviderOpts is newProvider with provider options.
func newProviderOpts(t *testing.T, opts transport.Options) *Provider {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	names, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Skip("no RDMA device: ibv_get_device_list returned none (run test/rxe/run.sh for the rxe VM)")
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// side is one end of a loopback connection.
type side struct {
	qp   *QP
	cq   *CQ
	mr   *MR
	off  int // offset of the side's region in the arena
	conn transport.Conn
}

func (s *side) addr(off int) uint64 { return s.mr.Addr() + uint64(off) }

type pair struct {
	p     *Provider
	d     *Device
	pd    *PD
	arena *transport.Arena
	a, b  side // a: active (Connect), b: passive (Accept)
	mws   []*MW
}

func (pr *pair) buf(s *side, off, n int) []byte {
	return pr.arena.Bytes()[s.off+off : s.off+off+n]
}

// newPair connects two RC QPs on one device through rdma_cm.
func newPair(t *testing.T, p *Provider) *pair {
	t.Helper()
	return newPairHook(t, p, nil)
}

// newPairHook is newPair with a hook run on the QPs before connecting.
func newPairHook(t *testing.T, p *Provider, hook func(*pair)) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dv, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	d := dv.(*Device)
	pd0, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	pr := &pair{p: p, d: d, pd: pd0.(*PD)}
	pr.arena, err = transport.NewArena(2*regionSize, transport.ArenaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead | transport.AccessMWBind
	for i, s := range []*side{&pr.a, &pr.b} {
		s.off = i * regionSize
		mr, err := pr.pd.RegMR(pr.arena, s.off, regionSize, all)
		if err != nil {
			t.Fatal(err)
		}
		s.mr = mr.(*MR)
		cq, err := d.CreateCQ(64)
		if err != nil {
			t.Fatal(err)
		}
		s.cq = cq.(*CQ)
		qp, err := pr.pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInline: 64})
		if err != nil {
			t.Fatal(err)
		}
		s.qp = qp.(*QP)
	}
	t.Cleanup(pr.close)
	if hook != nil {
		hook(pr)
	}
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	var aerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, err := l.Accept(ctx)
		if err != nil {
			aerr = err
			return
		}
		if req.Device() != transport.Device(d) {
			aerr = fmt.Errorf("request arrived on %v, want the shared device %s", req.Device(), d.name)
			req.Reject(nil)
			return
		}
		if !bytes.HasPrefix(req.PrivateData(), []byte("hello")) {
			aerr = fmt.Errorf("request private data %q", req.PrivateData())
		}
		pr.b.conn, err = req.Accept(ctx, pr.b.qp, []byte("welcome"))
		if err != nil {
			aerr = err
		}
	}()
	ep, err := p.Resolve(ctx, l.Addr())
	if err != nil {
		t.Fatalf("resolve %s: %v", l.Addr(), err)
	}
	if ep.Device() != transport.Device(d) {
		t.Fatalf("endpoint device %v is not the shared device", ep.Device())
	}
	pr.a.conn, err = ep.Connect(ctx, pr.a.qp, []byte("hello"))
	wg.Wait()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if aerr != nil {
		t.Fatalf("accept: %v", aerr)
	}
	if !bytes.HasPrefix(pr.a.conn.PrivateData(), []byte("welcome")) {
		t.Fatalf("accept private data %q", pr.a.conn.PrivateData())
	}
	for _, s := range []*side{&pr.a, &pr.b} {
		if st := s.qp.State(); st != transport.QPRTS {
			t.Fatalf("QP %d in %s after connect", s.qp.Num(), st)
		}
	}
	return pr
}

func (pr *pair) close() {
	for _, s := range []*side{&pr.a, &pr.b} {
		if s.conn != nil {
			s.conn.Disconnect()
		}
	}
	for _, w := range pr.mws {
		w.Close()
	}
	for _, s := range []*side{&pr.a, &pr.b} {
		s.qp.Close()
		s.cq.Close()
		s.mr.Close()
	}
	pr.pd.Close()
	pr.arena.Close()
}

// waitWC returns the next completion of cq or fails after 20 s.
func waitWC(t *testing.T, cq transport.CQ) transport.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wcs [1]transport.WC
	for {
		n, err := cq.Poll(wcs[:])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		if n == 1 {
			return wcs[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("wait for a completion: %v", err)
		}
	}
}

// noWC checks that cq stays empty for d.
func noWC(cq transport.CQ, d time.Duration) (transport.WC, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wcs [1]transport.WC
	for {
		if n, _ := cq.Poll(wcs[:]); n == 1 {
			return wcs[0], false
		}
		if cq.Wait(ctx) != nil {
			return transport.WC{}, true
		}
	}
}

func post(t *testing.T, qp transport.QP, wrs ...transport.SendWR) {
	t.Helper()
	if n, err := qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("post send: %d of %d: %v", n, len(wrs), err)
	}
}

func postRecv(t *testing.T, s *side, id uint64, off, n int) {
	t.Helper()
	wr := transport.RecvWR{ID: id, SGL: []transport.SGE{{Addr: s.addr(off), Length: uint32(n), LKey: s.mr.LKey()}}}
	if k, err := s.qp.PostRecv([]transport.RecvWR{wr}); err != nil || k != 1 {
		t.Fatalf("post recv: %d: %v", k, err)
	}
}

func expect(t *testing.T, wc transport.WC, id uint64, st transport.Status) {
	t.Helper()
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion %v, want id %#x status %s", &wc, id, st)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestSmokeDevice(t *testing.T) {
	p := newProvider(t)
	names, _ := p.Devices()
	dv, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.OpenDevice(names[0])
	if err != nil || again != dv {
		t.Fatalf("second open returned %v, %v; want the same Device", again, err)
	}
	a := dv.Attr()
	t.Logf("devices %v; %s vendor %s fw %q caps %s mtu %d maxQP %d maxWR %d maxSGE %d maxCQE %d maxMR %d maxMW %d inline %d quirks %+v",
		names, a.Name, a.Vendor, a.FWVer, a.Caps, a.PortMTU, a.MaxQP, a.MaxQPWR, a.MaxSGE, a.MaxCQE, a.MaxMR, a.MaxMW, a.MaxInline, a.Quirks)
	if a.Caps.Has(transport.CapFastRegMR) {
		t.Error("CapFastRegMR reported; user space has no REG_MR")
	}
	pd, err := dv.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	if _, err := pd.AllocFastRegMR(16); !errors.Is(err, transport.ErrUnsupported) {
		t.Errorf("AllocFastRegMR: %v, want ErrUnsupported", err)
	}
	if strings.HasPrefix(a.Name, "rxe") {
		if !a.Caps.Has(transport.CapMemWindow2 | transport.CapLocalInv | transport.CapSendWithInv) {
			t.Errorf("rxe caps %s, want MW_TYPE_2|LOCAL_INV|SEND_WITH_INV", a.Caps)
		}
		if a.Quirks.LocalOpErrStatus != transport.StatusLocQPOpErr {
			t.Errorf("rxe LocalOpErrStatus %s", a.Quirks.LocalOpErrStatus)
		}
	}
	if err := dv.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Errorf("device close with a PD alive: %v, want ErrBusy", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := dv.NextEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("NextEvent on a quiet device: %v", err)
	}
}

func TestSmokeWriteReadSend(t *testing.T) {
	p := newProvider(t)
	pr := newPair(t, p)
	a, b := &pr.a, &pr.b
	const n = 4096
	src := pr.buf(a, 0, n)
	fill(src, 1)
	// RDMA WRITE a[0:4K] -> b[8K:12K]
	post(t, a.qp, transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: n, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(8192), RKey: b.mr.RKey()})
	wc := waitWC(t, a.cq)
	expect(t, wc, 1, transport.StatusSuccess)
	if wc.Opcode != transport.WCRDMAWrite || wc.QPNum != a.qp.Num() {
		t.Fatalf("write completion %v", &wc)
	}
	if !bytes.Equal(pr.buf(b, 8192, n), src) {
		t.Fatal("RDMA WRITE data differs")
	}
	// RDMA READ b[8K:12K] -> a[16K:20K]
	post(t, a.qp, transport.SendWR{ID: 2, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(16384), Length: n, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(8192), RKey: b.mr.RKey()})
	wc = waitWC(t, a.cq)
	expect(t, wc, 2, transport.StatusSuccess)
	if wc.Opcode != transport.WCRDMARead || wc.ByteLen != n {
		t.Fatalf("read completion %v", &wc)
	}
	if !bytes.Equal(pr.buf(a, 16384, n), src) {
		t.Fatal("RDMA READ data differs")
	}
	// SEND with immediate, two SGEs, b receives
	postRecv(t, b, 10, 32768, 8192)
	fill(pr.buf(a, 4096, 100), 9)
	post(t, a.qp, transport.SendWR{ID: 3, Opcode: transport.OpSendWithImm, Flags: transport.FlagSignaled, Imm: 0xdeadbeef,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 1000, LKey: a.mr.LKey()}, {Addr: a.addr(4096), Length: 100, LKey: a.mr.LKey()}}})
	expect(t, waitWC(t, a.cq), 3, transport.StatusSuccess)
	wc = waitWC(t, b.cq)
	expect(t, wc, 10, transport.StatusSuccess)
	if wc.Opcode != transport.WCRecv || wc.ByteLen != 1100 || wc.Flags != transport.WCWithImm || wc.Imm != 0xdeadbeef {
		t.Fatalf("recv completion %v", &wc)
	}
	got := pr.buf(b, 32768, 1100)
	if !bytes.Equal(got[:1000], src[:1000]) || !bytes.Equal(got[1000:], pr.buf(a, 4096, 100)) {
		t.Fatal("SEND data differs")
	}
	// inline SEND
	postRecv(t, b, 11, 32768, 64)
	post(t, a.qp, transport.SendWR{ID: 4, Opcode: transport.OpSend, Flags: transport.FlagSignaled | transport.FlagInline,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 32}}})
	expect(t, waitWC(t, a.cq), 4, transport.StatusSuccess)
	expect(t, waitWC(t, b.cq), 11, transport.StatusSuccess)
	// RDMA WRITE with immediate consumes a receive
	postRecv(t, b, 12, 0, 0)
	post(t, a.qp, transport.SendWR{ID: 5, Opcode: transport.OpRDMAWriteWithImm, Flags: transport.FlagSignaled, Imm: 7,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(40000), RKey: b.mr.RKey()})
	expect(t, waitWC(t, a.cq), 5, transport.StatusSuccess)
	wc = waitWC(t, b.cq)
	expect(t, wc, 12, transport.StatusSuccess)
	if wc.Opcode != transport.WCRecvRDMAWithImm || wc.Imm != 7 || wc.Flags&transport.WCWithImm == 0 {
		t.Fatalf("write-with-imm receive %v", &wc)
	}
	// REG_MR is refused at post, nothing posted
	if n, err := a.qp.PostSend([]transport.SendWR{{ID: 6, Opcode: transport.OpRegMR}}); n != 0 || !errors.Is(err, transport.ErrUnsupported) {
		t.Fatalf("REG_MR post: %d, %v", n, err)
	}
	// bad_wr: the second of three has too many SGEs
	sge := transport.SGE{Addr: a.addr(0), Length: 8, LKey: a.mr.LKey()}
	tooMany := make([]transport.SGE, a.qp.sSGE+1) // the device may round MaxSendSGE up
	for i := range tooMany {
		tooMany[i] = sge
	}
	n2, err := a.qp.PostSend([]transport.SendWR{
		{ID: 7, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled, SGL: []transport.SGE{sge}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
		{ID: 8, Opcode: transport.OpRDMAWrite, SGL: tooMany, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
		{ID: 9, Opcode: transport.OpRDMAWrite, SGL: []transport.SGE{sge}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
	})
	if n2 != 1 || !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("partial post: %d, %v; want 1, ErrInvalidArgument", n2, err)
	}
	expect(t, waitWC(t, a.cq), 7, transport.StatusSuccess)
	// Disconnect: the peer sees Done
	a.conn.Disconnect()
	select {
	case <-b.conn.Done():
		if !errors.Is(b.conn.Err(), transport.ErrDisconnected) {
			t.Fatalf("peer Err %v", b.conn.Err())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("peer did not see the disconnect")
	}
	if st := a.qp.State(); st != transport.QPErr {
		t.Fatalf("local QP after Disconnect in %s", st)
	}
}

// bind binds a fresh window over b's region [off, off+n) on b's QP and
// returns it and its key.
func (pr *pair) bind(t *testing.T, off, n int, id uint64) (*MW, transport.Key) {
	t.Helper()
	w, err := pr.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	mw := w.(*MW)
	pr.mws = append(pr.mws, mw)
	key := mw.Key().Bump()
	post(t, pr.b.qp, transport.SendWR{ID: id, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled,
		Bind: transport.BindWR{MW: mw, Key: key, MR: pr.b.mr, Addr: pr.b.addr(off), Length: uint64(n),
			Access: transport.AccessRemoteWrite | transport.AccessRemoteRead | transport.AccessLocalWrite}})
	wc := waitWC(t, pr.b.cq)
	expect(t, wc, id, transport.StatusSuccess)
	if wc.Opcode != transport.WCBindMW {
		t.Fatalf("bind completion %v", &wc)
	}
	return mw, key
}

func TestSmokeMemoryWindow(t *testing.T) {
	p := newProvider(t)
	pr := newPair(t, p)
	a, b := &pr.a, &pr.b
	if !pr.d.attr.Caps.Has(transport.CapMemWindow2 | transport.CapSendWithInv) {
		t.Skipf("device caps %s", pr.d.attr.Caps)
	}
	_, key := pr.bind(t, 4096, 8192, 100)
	// a writes through the window
	fill(pr.buf(a, 0, 4096), 3)
	post(t, a.qp, transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 4096, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(4096), RKey: key})
	expect(t, waitWC(t, a.cq), 1, transport.StatusSuccess)
	if !bytes.Equal(pr.buf(b, 4096, 4096), pr.buf(a, 0, 4096)) {
		t.Fatal("write through window: data differs")
	}
	// a answers with SEND_WITH_INV naming the window's key
	postRecv(t, b, 200, 32768, 256)
	post(t, a.qp, transport.SendWR{ID: 2, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: key,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 16, LKey: a.mr.LKey()}}})
	expect(t, waitWC(t, a.cq), 2, transport.StatusSuccess)
	wc := waitWC(t, b.cq)
	t.Logf("SEND_WITH_INV receive: %v, wc_flags from the library %#x", &wc, b.cq.lastRawFlags)
	expect(t, wc, 200, transport.StatusSuccess)
	if wc.Flags&transport.WCWithInv == 0 || wc.InvalidatedKey != key {
		t.Fatalf("receive %v: want WITH_INV of %s", &wc, key)
	}
	// the old rkey no longer works
	post(t, a.qp, transport.SendWR{ID: 3, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(4096), RKey: key})
	expect(t, waitWC(t, a.cq), 3, transport.StatusRemAccessErr)
}

func TestSmokeLocalInvalidate(t *testing.T) {
	p := newProvider(t)
	pr := newPair(t, p)
	a, b := &pr.a, &pr.b
	if !pr.d.attr.Caps.Has(transport.CapMemWindow2 | transport.CapLocalInv) {
		t.Skipf("device caps %s", pr.d.attr.Caps)
	}
	mw, key := pr.bind(t, 0, 4096, 100)
	post(t, a.qp, transport.SendWR{ID: 1, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 4096, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(0), RKey: key})
	expect(t, waitWC(t, a.cq), 1, transport.StatusSuccess)
	post(t, b.qp, transport.SendWR{ID: 101, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key})
	wc := waitWC(t, b.cq)
	expect(t, wc, 101, transport.StatusSuccess)
	if wc.Opcode != transport.WCLocalInv {
		t.Fatalf("LOCAL_INV completion %v", &wc)
	}
	// rebind with the next key: works, the old key does not
	key2 := key.Bump()
	post(t, b.qp, transport.SendWR{ID: 102, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled,
		Bind: transport.BindWR{MW: mw, Key: key2, MR: b.mr, Addr: b.addr(0), Length: 4096, Access: transport.AccessRemoteRead}})
	expect(t, waitWC(t, b.cq), 102, transport.StatusSuccess)
	post(t, a.qp, transport.SendWR{ID: 2, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(0), RKey: key2})
	expect(t, waitWC(t, a.cq), 2, transport.StatusSuccess)
	post(t, a.qp, transport.SendWR{ID: 3, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}, RemoteAddr: b.addr(0), RKey: key})
	expect(t, waitWC(t, a.cq), 3, transport.StatusRemAccessErr)
}

func TestSmokeWaitCancel(t *testing.T) {
	p := newProvider(t)
	dv, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dv.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Wait took %v", d)
	}
	done := make(chan error, 1)
	go func() { done <- cq.Wait(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Wait")
	}
}

// Posting and polling do not allocate.
func TestSmokeNoAlloc(t *testing.T) {
	p := newProvider(t)
	pr := newPair(t, p)
	a, b := &pr.a, &pr.b
	wrs := []transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: a.addr(0), Length: 64, LKey: a.mr.LKey()}}}}
	rwrs := []transport.RecvWR{{ID: 2, SGL: []transport.SGE{{Addr: b.addr(0), Length: 64, LKey: b.mr.LKey()}}}}
	wcs := make([]transport.WC, 4)
	pollOne := func(cq *CQ) {
		for {
			n, err := cq.Poll(wcs)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				if wcs[0].Status != transport.StatusSuccess {
					t.Fatalf("completion %v", &wcs[0])
				}
				return
			}
		}
	}
	cycle := func() {
		if n, err := b.qp.PostRecv(rwrs); n != 1 || err != nil {
			t.Fatalf("post recv: %d %v", n, err)
		}
		if n, err := a.qp.PostSend(wrs); n != 1 || err != nil {
			t.Fatalf("post: %d %v", n, err)
		}
		pollOne(a.cq)
		pollOne(b.cq)
	}
	cycle()
	if allocs := testing.AllocsPerRun(50, cycle); allocs != 0 {
		t.Errorf("%v allocations per post+poll+post-recv cycle, want 0", allocs)
	}
}
