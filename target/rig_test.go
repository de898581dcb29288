package target

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// env is one provider setting the tests run under.
type env struct{ wire, profile string }

func (e env) String() string { return e.wire + "/" + e.profile }

var envs = []env{{emu.WireLoop, "strict"}, {emu.WireLoop, "rxe"}, {emu.WireTCP, "strict"}, {emu.WireTCP, "rxe"},
	{emu.WireLoop, "ib"}, {emu.WireLoop, "iwarp"}}

func forEnvs(t *testing.T, f func(t *testing.T, e env)) {
	for _, e := range envs {
		t.Run(e.String(), func(t *testing.T) {
			t.Parallel()
			f(t, e)
		})
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("TARGET_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// storeCatalog serves a block store; names in ro are read-only.
type storeCatalog struct {
	store block.Store
	ro    map[string]bool
	// wrap, if set, wraps every opened volume (to slow or gate it).
	wrap func(Volume) Volume
	// opening, if set, is called first by every OpenVolume (to count
	// the opens, or hang one as a store that does not answer).
	opening func(name string)
	// openErr, if set, is asked after opening: an error it returns is
	// the open's (a store that answers, late, that it cannot).
	openErr func(name string) error
}

func (c *storeCatalog) List() ([]VolumeInfo, error) {
	l, err := c.store.List()
	if err != nil {
		return nil, err
	}
	out := make([]VolumeInfo, 0, len(l))
	snapper, _ := c.store.(block.Snapshotter)
	for _, v := range l {
		out = append(out, VolumeInfo{Name: v.Name, Size: v.Size, BlockSize: v.BlockSize, ReadOnly: c.ro[v.Name]})
		if snapper == nil {
			continue
		}
		snaps, err := snapper.Snapshots(v.Name)
		if err != nil {
			return nil, err
		}
		for _, s := range snaps {
			out = append(out, VolumeInfo{Name: v.Name + "@" + s.Name, Size: s.Size, BlockSize: s.BlockSize, ReadOnly: true})
		}
	}
	return out, nil
}

// OpenVolume opens VOL@SNAP as a snapshot, as cmd/srpd's catalog does.
func (c *storeCatalog) OpenVolume(name string) (Volume, error) {
	if c.opening != nil {
		c.opening(name)
	}
	if c.openErr != nil {
		if err := c.openErr(name); err != nil {
			return nil, err
		}
	}
	var v Volume
	var err error
	if vol, snap, ok := strings.Cut(name, "@"); ok {
		v, err = c.store.(block.Snapshotter).OpenSnapshot(vol, snap)
	} else {
		v, err = c.store.Open(name)
	}
	if err != nil {
		return nil, err
	}
	if c.wrap != nil {
		return c.wrap(v), nil
	}
	return v, nil
}

// gatedVolume blocks reads until the gate closes.
type gatedVolume struct {
	Volume
	gate    chan struct{}
	entered chan struct{}
}

func (g *gatedVolume) ReadAt(p []byte, off int64) (int, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.gate
	return g.Volume.ReadAt(p, off)
}

// gateReads wraps every volume the rig's catalog opens from now on in a
// gatedVolume: a READ signals entered (without blocking) and then waits
// until gate is closed.
func (r *rig) gateReads() (gate, entered chan struct{}) {
	gate, entered = make(chan struct{}), make(chan struct{}, 8)
	r.cat.wrap = func(v Volume) Volume { return &gatedVolume{Volume: v, gate: gate, entered: entered} }
	return gate, entered
}

func (g *gatedVolume) Close() error {
	if c, ok := g.Volume.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

const (
	volSize = 1 << 20
	bs      = 4096
)

// rig is a target serving a memory store over one emu provider.
type rig struct {
	p     *emu.Provider
	store *block.MemStore
	cat   *storeCatalog
	tgt   *Target
	addr  string
	serve chan error
	// offer, if set, is the READ credit the rig's clients ask for.
	offer *transport.ReadCredit
}

func newRig(t testing.TB, e env, cfg Config) *rig {
	t.Helper()
	p, err := emu.New(emu.Config{Wire: e.wire, Profile: e.profile, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{p: p, store: block.NewMemStore(), serve: make(chan error, 1)}
	for _, n := range []string{"vol0", "vol1", "ro"} {
		v, err := r.store.Create(n, volSize, bs)
		if err != nil {
			t.Fatal(err)
		}
		v.Close()
	}
	r.cat = &storeCatalog{store: r.store, ro: map[string]bool{"ro": true}}
	if cfg.Catalog == nil {
		cfg.Catalog = r.cat
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	if cfg.Credits == 0 {
		cfg.Credits = 8
	}
	if cfg.SRPCredits == 0 {
		cfg.SRPCredits = cfg.Credits // small buffers; TestSRPCredits sees the default
	}
	if cfg.MaxTransfer == 0 {
		cfg.MaxTransfer = 256 << 10
	}
	r.tgt, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Listen(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = l.Addr()
	go func() { r.serve <- r.tgt.Serve(context.Background(), l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.tgt.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-r.serve; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve returned %v, want ErrClosed", err)
		}
		p.Close()
		r.store.Close()
	})
	return r
}

// client is a scripted initiator built on the raw transport and wire.
type client struct {
	tb       testing.TB
	p        *emu.Provider
	pd       transport.PD
	cq       transport.CQ
	qp       transport.QP
	cm       transport.Conn
	arena    *transport.Arena
	mr       transport.MR
	wcs      [16]transport.WC
	sendN    int
	tag      uint64
	once     sync.Once
	tgtNonce []byte
	frmr     transport.FastRegMR
	frmrKey  transport.Key
}

const (
	cliRecvN    = 32
	cliSendOff  = cliRecvN * 4096
	cliSendN    = 32
	cliDataOff  = cliSendOff + cliSendN*4096
	cliDataSize = 2 << 20
)

func (r *rig) dial(tb testing.TB) *client {
	tb.Helper()
	c, err := r.dialHello(tb, wire.Hello{Version: wire.Version}.Encode())
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func (r *rig) dialHello(tb testing.TB, hello []byte) (*client, error) {
	tb.Helper()
	p := r.p
	d, err := p.OpenDevice("")
	if err != nil {
		tb.Fatal(err)
	}
	c := &client{tb: tb, p: p}
	if c.pd, err = d.AllocPD(); err != nil {
		tb.Fatal(err)
	}
	if c.cq, err = d.CreateCQ(1024); err != nil {
		tb.Fatal(err)
	}
	if c.qp, err = c.pd.CreateQP(transport.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 256, MaxRecvWR: cliRecvN,
		MaxSendSGE: 2, MaxRecvSGE: 1}); err != nil {
		tb.Fatal(err)
	}
	if c.arena, err = transport.NewArena(cliDataOff+cliDataSize, transport.ArenaOptions{}); err != nil {
		tb.Fatal(err)
	}
	if c.mr, err = c.pd.RegMR(c.arena, 0, c.arena.Len(), transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.close)
	if err := c.qp.Modify(transport.QPInit); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < cliRecvN; i++ {
		c.repost(i)
	}
	ep, err := p.Resolve(context.Background(), r.addr)
	if err != nil {
		tb.Fatal(err)
	}
	if r.offer != nil {
		ep.OfferReadCredit(*r.offer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.cm, err = ep.Connect(ctx, c.qp, hello)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *client) close() {
	c.once.Do(func() {
		if c.cm != nil {
			c.cm.Disconnect()
		}
		c.qp.Close()
		c.cq.Close()
		c.mr.Close()
		c.arena.Close()
		c.pd.Close()
	})
}

func (c *client) repost(i int) {
	sge := []transport.SGE{{Addr: c.mr.Addr() + uint64(i*4096), Length: 4096, LKey: c.mr.LKey()}}
	if _, err := c.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: sge}}); err != nil {
		c.tb.Fatalf("client repost: %v", err)
	}
}

// data returns the client's data buffer bytes [off, off+n).
func (c *client) data(off, n int) []byte { return c.arena.Bytes()[cliDataOff+off : cliDataOff+off+n] }

// desc describes client data [off, off+n) to the target.
func (c *client) desc(off, n int) wire.Descriptor {
	return wire.Descriptor{VA: c.mr.Addr() + uint64(cliDataOff+off), RKey: uint32(c.mr.RKey()), Len: uint32(n)}
}

// sendIU posts an IU in a SEND (signaled, not waited for), followed in
// the same SEND by the bytes extra describes, if any.
func (c *client) sendIU(b []byte, extra ...transport.SGE) error {
	slot := c.sendN % cliSendN
	c.sendN++
	off := cliSendOff + slot*4096
	n := copy(c.arena.Bytes()[off:off+4096], b)
	sgl := append([]transport.SGE{{Addr: c.mr.Addr() + uint64(off), Length: uint32(n), LKey: c.mr.LKey()}}, extra...)
	_, err := c.qp.PostSend([]transport.SendWR{{ID: 1 << 32, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: sgl}})
	return err
}

var errDisconnected = errors.New("client: connection ended")

// next waits for the next received IU; it returns errDisconnected when the
// connection ends first.
func (c *client) next(timeout time.Duration) ([]byte, transport.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		n, err := c.cq.Poll(c.wcs[:1])
		if err != nil {
			return nil, transport.WC{}, err
		}
		if n == 1 {
			wc := c.wcs[0]
			if wc.Status != transport.StatusSuccess {
				return nil, wc, fmt.Errorf("%w: %v", errDisconnected, &wc)
			}
			if wc.ID>>32 == 1 {
				continue // a send completion
			}
			i := int(wc.ID)
			b := append([]byte(nil), c.arena.Bytes()[i*4096:i*4096+int(wc.ByteLen)]...)
			c.repost(i)
			return b, wc, nil
		}
		if err := c.cq.Wait(ctx); err != nil {
			return nil, transport.WC{}, fmt.Errorf("client: waiting for an IU: %w", err)
		}
	}
}

func (c *client) mustNext() ([]byte, transport.WC) {
	c.tb.Helper()
	b, wc, err := c.next(10 * time.Second)
	if err != nil {
		c.tb.Fatal(err)
	}
	return b, wc
}

// expectDisconnect waits until the target ends the connection.
func (c *client) expectDisconnect() {
	c.tb.Helper()
	for {
		b, _, err := c.next(10 * time.Second)
		if errors.Is(err, errDisconnected) {
			return
		}
		if err != nil {
			c.tb.Fatalf("expected a disconnect: %v", err)
		}
		op, _ := wire.PeekOpcode(b)
		c.tb.Logf("IU %s while waiting for the disconnect", op)
	}
}

func (c *client) loginRequest(ini string) wire.LoginRequest {
	return wire.LoginRequest{Version: wire.Version, Initiator: ini, Credits: 8, MaxIU: wire.MaxCommandLen,
		MaxRecvIU: 4096, MaxTransfer: 1 << 20, MaxDesc: wire.MaxDescriptors, RemoteInvalidate: true, MaxImmediate: 2048,
		Nonce: []byte("0123456789abcdef0123456789abcdef")}
}

func (c *client) send(op wire.Opcode, v any) {
	c.tb.Helper()
	b, err := wire.EncodeControl(nil, op, v)
	if err != nil {
		c.tb.Fatal(err)
	}
	if err := c.sendIU(b); err != nil {
		c.tb.Fatal(err)
	}
}

// loginWith sends req, answers a challenge with secret, and returns the
// final IU's opcode and bytes.
func (c *client) loginWith(req wire.LoginRequest, secret []byte) (wire.Opcode, []byte) {
	c.tb.Helper()
	c.send(wire.OpLogin, &req)
	for {
		b, _ := c.mustNext()
		op, _ := wire.PeekOpcode(b)
		if op != wire.OpLoginChallenge {
			return op, b
		}
		var ch wire.LoginChallenge
		if err := wire.DecodeControl(b, op, &ch); err != nil {
			c.tb.Fatal(err)
		}
		if ch.Method != "hmac-sha256" || len(ch.Nonce) != 32 {
			c.tb.Fatalf("challenge %+v", ch)
		}
		c.tgtNonce = ch.Nonce
		c.send(wire.OpLoginProof, &wire.LoginProof{Proof: wire.LoginProofFor(secret, "initiator", req.Initiator, req.Target, req.Nonce, ch.Nonce)})
	}
}

func (c *client) login(ini string) wire.LoginResponse {
	c.tb.Helper()
	op, b := c.loginWith(c.loginRequest(ini), nil)
	var rsp wire.LoginResponse
	if op != wire.OpLoginResponse {
		c.tb.Fatalf("login answered %s", op)
	}
	if err := wire.DecodeControl(b, op, &rsp); err != nil {
		c.tb.Fatal(err)
	}
	return rsp
}

func (c *client) control(req wire.ControlRequest) wire.ControlResponse {
	c.tb.Helper()
	c.tag++
	req.Tag = c.tag
	c.send(wire.OpControl, &req)
	b, _ := c.mustNext()
	var rsp wire.ControlResponse
	if err := wire.DecodeControl(b, wire.OpControlResp, &rsp); err != nil {
		c.tb.Fatal(err)
	}
	if rsp.Tag != req.Tag || rsp.Credits != 1 {
		c.tb.Fatalf("control response tag %d credits %d, want tag %d credits 1", rsp.Tag, rsp.Credits, req.Tag)
	}
	return rsp
}

func (c *client) open(name string, ro bool) uint32 {
	c.tb.Helper()
	rsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: name, ReadOnly: ro})
	if rsp.Error != "" || rsp.Handle == 0 {
		c.tb.Fatalf("open %s: %+v", name, rsp)
	}
	return rsp.Handle
}

// postCommand sends a command without waiting.
func (c *client) postCommand(cmd *wire.Command) {
	c.tb.Helper()
	c.tag++
	cmd.Tag = c.tag
	var b [wire.MaxCommandLen]byte
	n, err := cmd.Encode(b[:])
	if err != nil {
		c.tb.Fatal(err)
	}
	if err := c.sendIU(b[:n]); err != nil {
		c.tb.Fatal(err)
	}
}

func (c *client) readResponse() (wire.Response, transport.WC) {
	c.tb.Helper()
	b, wc := c.mustNext()
	var rsp wire.Response
	if err := rsp.Decode(b); err != nil {
		c.tb.Fatalf("response: %v (%x)", err, b)
	}
	if rsp.Credits != 1 {
		c.tb.Fatalf("response returns %d credits", rsp.Credits)
	}
	return rsp, wc
}

// do runs one command and returns its response.
func (c *client) do(cmd wire.Command) (wire.Response, transport.WC) {
	c.tb.Helper()
	c.postCommand(&cmd)
	rsp, wc := c.readResponse()
	if rsp.Tag != cmd.Tag {
		c.tb.Fatalf("response tag %d, want %d", rsp.Tag, cmd.Tag)
	}
	return rsp, wc
}

// io builds a READ or WRITE of n bytes at volume offset off using client
// data at doff, split into ndesc descriptors.
func (c *client) io(op wire.Op, h uint32, off uint64, doff, n, ndesc int) wire.Command {
	cmd := wire.Command{Op: op, Volume: h, Offset: off, Length: uint32(n), NDesc: ndesc}
	per := n / ndesc
	for i := 0; i < ndesc; i++ {
		l := per
		if i == ndesc-1 {
			l = n - per*(ndesc-1)
		}
		cmd.Desc[i] = c.desc(doff+i*per, l)
	}
	return cmd
}

func expectGood(tb testing.TB, rsp wire.Response) {
	tb.Helper()
	if rsp.Status != wire.StatusGood {
		tb.Fatalf("response %s sense %s, want GOOD", statusName(rsp.Status), rsp.Sense)
	}
}

func expectSense(tb testing.TB, rsp wire.Response, sense wire.Sense) {
	tb.Helper()
	if rsp.Status != wire.StatusError || rsp.Sense != sense {
		tb.Fatalf("response %s sense %q, want ERROR %q", statusName(rsp.Status), rsp.Sense, sense)
	}
}

func statusName(s wire.Status) string {
	switch s {
	case wire.StatusGood:
		return "GOOD"
	case wire.StatusError:
		return "ERROR"
	case wire.StatusBusy:
		return "BUSY"
	}
	return fmt.Sprint(uint8(s))
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
	return b
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
