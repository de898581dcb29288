package initiator_test

import (
	"cmp"
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport/emu"
)

// gatewayRig is two gateways (targets) over one shared volume of a
// gatewaytest cluster, each on its own software NIC (tcp wire), and the
// initiator's NIC.
type gatewayRig struct {
	cl    *gatewaytest.Cluster
	addrs []string
	cats  []*gateway.Catalog
	tgts  []*target.Target
	stop  []func() // stop[i] kills gateway i: its NIC goes, with every connection
	ip    *emu.Provider
	// frozen[i] set: gateway i answers nothing, logins included, its
	// connections up (a SIGSTOPped srpd); only with rigOpts.freezable.
	frozen []atomic.Bool
	// wedged[i] set: gateway i's store hangs: the WRITE commands it
	// receives are never answered, while it answers everything else,
	// pings included; only with rigOpts.freezable.
	wedged []atomic.Bool
	// fastFail is the Multipaths' FastFail (dial); 200 ms unless set.
	fastFail time.Duration
	// ioTimeout and lossTimeout are the Multipaths' Config.IOTimeout
	// and LossTimeout: the defaults (30 s) and 10 s unless set.
	ioTimeout, lossTimeout time.Duration
	// nics[i] is gateway i's NIC; gates[i], with rigOpts.openWait,
	// holds its store's opens while shut.
	nics  []*emu.Provider
	gates []*openGate
}

func newGatewayRig(t *testing.T) *gatewayRig { return newGatewayRigOpts(t, rigOpts{}) }

// rigOpts vary a gatewayRig. freezable puts each gateway behind the
// hostile-peer kit, so that it can be frozen (frozen[i]); the kit
// allocates per post: not for the allocation tests. noNotices leaves
// the catalogs' state changes untold (no path notices), as a target
// that predates them; noFenceWatch hides the cluster's fence watch
// from the gateways (unwatched); portGroups gives gateway i ALUA target
// port group i+1 for SRP hosts; beforeActive, if set, is each gateway's
// gateway.Catalog.BeforeActive (i: the gateway).
type rigOpts struct {
	freezable, noNotices, noFenceWatch, portGroups bool
	beforeActive                                   func(i int, name string) error
	// openWait, if set, is the targets' OpenWait, and each gateway's
	// store opens through gates[i].
	openWait time.Duration
}

// unwatched is a gatewaytest client without its gateway.FenceWatcher, as
// the rbd store is: its gateway learns it was fenced at its next request.
type unwatched struct {
	block.Store
	block.SharedOpener
	block.LockBreaker
}

func newGatewayRigOpts(t *testing.T, o rigOpts) *gatewayRig {
	t.Helper()
	r := &gatewayRig{cl: gatewaytest.NewCluster(), frozen: make([]atomic.Bool, 2), wedged: make([]atomic.Bool, 2)}
	v, err := r.cl.Client().Create("vol0", 4<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	if r.ip, err = emu.New(emu.Config{Wire: emu.WireTCP}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ip.Close() })
	for i := range 2 {
		nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
		if err != nil {
			t.Fatal(err)
		}
		var st block.Store = r.cl.Client()
		if o.noFenceWatch {
			c := r.cl.Client()
			st = unwatched{c, c, c}
		}
		gate := &openGate{}
		if o.openWait > 0 {
			st = gatedClient{r.cl.Client(), gate}
		}
		cat := gateway.New(st)
		if o.beforeActive != nil {
			cat.BeforeActive(func(name string) error { return o.beforeActive(i, name) })
		}
		tcfg := target.Config{Name: "gw", Catalog: cat, OpenWait: o.openWait}
		if o.portGroups {
			tcfg.SRPPortGroup = uint16(i + 1)
		}
		tgt, err := target.New(tcfg)
		if err != nil {
			t.Fatal(err)
		}
		if !o.noNotices {
			// As srpd does: state changes reach the sessions as path notices.
			cat.OnStateChange(func(name string, s gateway.State) { gateway.Tell(tgt, name, s) })
		}
		ctx, cancel := context.WithCancel(context.Background())
		listen := nic.Listen
		if o.freezable {
			frozen, wedged := &r.frozen[i], &r.wedged[i]
			listen = targettest.Wrap(nic, targettest.Script{
				Respond: func(*targettest.Response) targettest.Action {
					if frozen.Load() {
						return targettest.Drop
					}
					return targettest.Pass
				},
				Swallow: func(iu []byte) bool {
					var c wire.Command
					return wedged.Load() && c.Decode(iu) == nil && c.Op == wire.OpWrite
				},
			}).Listen
		}
		l, err := listen(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- tgt.Serve(ctx, l) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				nic.Close()
				cancel()
				<-served
				l.Close()
			})
		}
		t.Cleanup(func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			tgt.Shutdown(sctx)
			stop()
		})
		t.Cleanup(gate.open) // before the shutdown above: its store must answer
		r.nics, r.gates = append(r.nics, nic), append(r.gates, gate)
		r.addrs = append(r.addrs, l.Addr())
		r.cats = append(r.cats, cat)
		r.tgts = append(r.tgts, tgt)
		r.stop = append(r.stop, stop)
	}
	return r
}

func (r *gatewayRig) dial(t *testing.T, name string) *initiator.Multipath {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := initiator.DialMultipath(ctx, initiator.MultipathConfig{
		Config: initiator.Config{Provider: r.ip, Name: name, IOTimeout: r.ioTimeout, LossTimeout: cmp.Or(r.lossTimeout, 10*time.Second)},
		Addrs:  r.addrs, FastFail: cmp.Or(r.fastFail, 200*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// open dials a Multipath of both gateways as "host" and opens vol0 on
// it; the test's cleanup closes both.
func (r *gatewayRig) open(t *testing.T, ctx context.Context) *initiator.MultipathVolume {
	t.Helper()
	mv, err := r.dial(t, "host").Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mv.Close() })
	return mv
}

// stampedWriters runs qd writers, each over blocks of its own, each
// write stamped with its block and a generation (pattern); it returns
// the generation each block's last acknowledged write carries, once
// stop is closed.
func stampedWriters(t *testing.T, mv *initiator.MultipathVolume, qd int, stop <-chan struct{}, acks *atomic.Int64) []uint32 {
	t.Helper()
	const perWriter = 16
	gens := make([]uint32, qd*perWriter)
	var wg sync.WaitGroup
	errs := make(chan error, qd)
	for w := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				lba := uint64(w*perWriter + n%perWriter)
				gen := gens[lba] + 1
				pattern(buf, lba, gen, 1)
				if _, err := mv.WriteAt(buf, int64(lba)*4096); err != nil {
					errs <- err
					return
				}
				gens[lba] = gen
				acks.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("write: %v", err) // not Fatal: it may run on a goroutine of its caller's
	}
	return gens
}

// verifyStamps reads every block back through mv and checks it holds
// the generation of its last acknowledged write.
func verifyStamps(t *testing.T, mv *initiator.MultipathVolume, gens []uint32) {
	t.Helper()
	buf := make([]byte, 4096)
	for lba, gen := range gens {
		if _, err := mv.ReadAt(buf, int64(lba)*4096); err != nil {
			t.Fatal(err)
		}
		if err := check(buf, uint64(lba), gen); err != nil {
			t.Error(err)
		}
	}
}

// waitAcks waits until n more writes were acknowledged; it ends the
// test if a writer failed it.
func waitAcks(t *testing.T, acks *atomic.Int64, n int64) {
	t.Helper()
	want := acks.Load() + n
	deadline := time.Now().Add(20 * time.Second)
	for acks.Load() < want {
		if t.Failed() {
			t.FailNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes acknowledged, waited for %d", acks.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMultipathFailover: QD8 stamped writes through the first gateway;
// its NIC dies (every connection with it, as a killed srpd's, and its
// address refuses connections); the writes go on through the second
// gateway, which took the volume over (its lock), well before FastFail
// (5 s here), and every acknowledged write reads back.
func TestMultipathFailover(t *testing.T) {
	r := newGatewayRig(t)
	// A killed gateway's address refuses the reconnect: the failover
	// does not wait for FastFail.
	r.fastFail = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	if mv.Path() != r.addrs[0] || r.cats[0].State("vol0") != gateway.Active {
		t.Fatalf("active path %s (gateway 0 %v), want the first", mv.Path(), r.cats[0].State("vol0"))
	}
	gens, took := writesThrough(t, mv, r.stop[0])
	t.Logf("kill → first write acknowledged through the other gateway: %v (FastFail %v)", took, r.fastFail)
	if took > r.fastFail/2 {
		t.Errorf("the failover took %v: it waited for FastFail (%v) although the dead gateway's address refuses connections", took, r.fastFail)
	}
	r.checkMoved(t, mv, gens)
}

// writesThrough runs QD8 stamped writers on mv, 200 writes, then fault,
// then 200 more once a failover happened; it returns the generations
// acknowledged and the time from the fault to the first write
// acknowledged after the failover.
func writesThrough(t *testing.T, mv *initiator.MultipathVolume, fault func()) ([]uint32, time.Duration) {
	t.Helper()
	var acks atomic.Int64
	stop := make(chan struct{})
	done := make(chan []uint32, 1)
	go func() { done <- stampedWriters(t, mv, 8, stop, &acks) }()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop) // the test failed: let the other writers go
		}
	}()
	waitAcks(t, &acks, 200)
	at := time.Now()
	fault()
	for mv.Failovers() == 0 && time.Since(at) < 40*time.Second && !t.Failed() {
		time.Sleep(time.Millisecond)
	}
	waitAcks(t, &acks, 1)
	took := time.Since(at)
	waitAcks(t, &acks, 200)
	close(stop)
	return <-done, took
}

// checkMoved checks that mv failed over once, to the second gateway,
// which serves the volume, and that every acknowledged write reads back.
func (r *gatewayRig) checkMoved(t *testing.T, mv *initiator.MultipathVolume, gens []uint32) {
	t.Helper()
	if mv.Path() != r.addrs[1] || mv.Failovers() != 1 || r.cats[1].State("vol0") != gateway.Active {
		t.Fatalf("after the fault: path %s, %d failovers, gateway 1 %v", mv.Path(), mv.Failovers(), r.cats[1].State("vol0"))
	}
	verifyStamps(t, mv, gens)
}

// TestMultipathWedgedGateway: QD8 stamped writes through the first
// gateway, whose store then hangs: it leaves every WRITE unanswered
// while it answers pings, so no keepalive finds it. Each write ends five
// connections with its I/O timeout (200 ms) and then fails over, the
// first gateway fenced by the takeover: the writes go on through the
// second gateway and every acknowledged write reads back. Before, the
// five timeouts failed the write with os.ErrDeadlineExceeded though a
// healthy path stood by. With both gateways wedged, a write and a
// submitted write fail with os.ErrDeadlineExceeded once LossTimeout
// (3 s) has passed, and do not hang.
func TestMultipathWedgedGateway(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{freezable: true})
	// FastFail well past five I/O timeouts, so that no connection
	// counts as lost before the five end (keepalive pings are answered).
	r.ioTimeout, r.lossTimeout, r.fastFail = 200*time.Millisecond, 3*time.Second, 5*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	defer func() { r.wedged[0].Store(false); r.wedged[1].Store(false) }()
	gens, took := writesThrough(t, mv, func() { r.wedged[0].Store(true) })
	t.Logf("wedge → first write acknowledged through the other gateway: %v", took)
	r.checkMoved(t, mv, gens)

	r.wedged[1].Store(true)
	done := make(chan *initiator.Request, 1)
	if err := mv.Submit(&initiator.Request{Op: initiator.OpWrite, Buf: make([]byte, 4096), Done: done}); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	_, err := mv.WriteAtContext(ctx, make([]byte, 4096), 4096)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write no gateway answers: %v, want os.ErrDeadlineExceeded", err)
	}
	if rq := <-done; !errors.Is(rq.Err, os.ErrDeadlineExceeded) {
		t.Fatalf("a submitted write no gateway answers: %v, want os.ErrDeadlineExceeded", rq.Err)
	}
	t.Logf("both wedged: failed after %v (%d failovers): %v", time.Since(at), mv.Failovers(), err)
}

// TestMultipathFrozenGateway: QD8 stamped writes through the first
// gateway, which then hangs with its connections up (it answers
// nothing, as a SIGSTOPped srpd). The paths' keepalive (Keepalive =
// FastFail, 200 ms) finds it, with IOTimeout at its 30 s default: the
// writes go on through the second gateway within a second, and every
// acknowledged write reads back. Without the keepalive they would wait
// the 30 s of IOTimeout.
func TestMultipathFrozenGateway(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{freezable: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	defer r.frozen[0].Store(false) // let the cleanup's shutdown finish
	gens, took := writesThrough(t, mv, func() { r.frozen[0].Store(true) })
	t.Logf("freeze → first write acknowledged through the other gateway: %v", took)
	// The keepalive, not IOTimeout, ended the frozen path's connection:
	// counted, not timed.
	if silent, timeout := initiator.LostBy(initiator.PathSession(mv, 0)); silent == 0 || timeout != 0 {
		t.Errorf("the frozen gateway's connection ended %d times by the keepalive and %d by IOTimeout; want the keepalive, before IOTimeout (30 s)", silent, timeout)
	}
	r.checkMoved(t, mv, gens)
}

// TestMultipathPathNotice: this host writes through the first gateway,
// then goes quiet; another host takes the volume over through the
// second, which fences the first. The first gateway hears of it from
// the cluster and tells this host's session in a path notice, and the
// volume fails over to the second at once, with no I/O of its own to
// fail; its next write goes there. Without the notice it would stay on
// the fenced path until that write was refused.
func TestMultipathPathNotice(t *testing.T) {
	r := newGatewayRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv, s2 := r.twoHosts(t, ctx)
	buf := make([]byte, 4096)
	taken := time.Now()
	v2, err := s2.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
	if err != nil || v2.Standby() {
		t.Fatalf("the other host's takeover: %v", err)
	}
	for mv.Failovers() == 0 && time.Since(taken) < 5*time.Second {
		time.Sleep(time.Millisecond)
	}
	t.Logf("takeover by another host → this host's volume failed over, without I/O: %v", time.Since(taken))
	if mv.Failovers() != 1 || mv.Path() != r.addrs[1] {
		t.Fatalf("%d failovers, path %s; want 1, the second gateway", mv.Failovers(), mv.Path())
	}
	pattern(buf, 1, 1, 1)
	if _, err := mv.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	if mv.Failovers() != 1 {
		t.Errorf("%d failovers after the write; want the one the notice made", mv.Failovers())
	}
	verifyStamps(t, mv, []uint32{1, 1})
}

// TestMultipathActiveNotice: as TestMultipathPathNotice, but the first
// gateway does not hear of its fencing (as an rbd gateway, until its
// next request): the second gateway's notice that it became active, to
// this host's standby handle there, moves the volume at once, with no
// I/O of its own. Without the standby handle nothing would tell it.
func TestMultipathActiveNotice(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{noFenceWatch: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv, s2 := r.twoHosts(t, ctx)
	taken := time.Now()
	v2, err := s2.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
	if err != nil || v2.Standby() {
		t.Fatalf("the other host's takeover: %v", err)
	}
	if r.cats[0].State("vol0") == gateway.Fenced {
		// Active until this host's handle there closes: it never
		// learns of the fencing without a request.
		t.Fatal("the first gateway heard of its fencing: the test proves nothing")
	}
	for mv.Failovers() == 0 && time.Since(taken) < 5*time.Second {
		time.Sleep(time.Millisecond)
	}
	t.Logf("takeover by another host → this host's volume followed, without I/O: %v", time.Since(taken))
	if mv.Failovers() != 1 || mv.Path() != r.addrs[1] {
		t.Fatalf("%d failovers, path %s; want 1, the second gateway", mv.Failovers(), mv.Path())
	}
	buf := make([]byte, 4096)
	pattern(buf, 1, 1, 1)
	if _, err := mv.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	verifyStamps(t, mv, []uint32{1, 1})
}

// twoHosts opens vol0 through a Multipath as "host", writes generation
// 1 of block 0 through it, and dials a plain session of "other" to the
// second gateway; the test's cleanup closes them.
func (r *gatewayRig) twoHosts(t *testing.T, ctx context.Context) (*initiator.MultipathVolume, *initiator.Session) {
	t.Helper()
	mv := r.open(t, ctx)
	buf := make([]byte, 4096)
	pattern(buf, 0, 1, 1)
	if _, err := mv.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	s2, err := initiator.Dial(ctx, initiator.Config{Provider: r.ip, Addr: r.addrs[1], Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	return mv, s2
}

// TestMultipathStandbyAnswer: another host takes the volume over through
// the second gateway, fencing the first, whose target sends no path
// notices (an older srpd); this host's next I/O on the first is
// answered standby, and it fails over to the second without an error
// reaching the caller.
func TestMultipathStandbyAnswer(t *testing.T) {
	r := newGatewayRigOpts(t, rigOpts{noNotices: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv, s2 := r.twoHosts(t, ctx)
	buf := make([]byte, 4096)

	// Another host's plain session on the second gateway: standby, its
	// I/O refused; then its takeover.
	v2, err := s2.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil || !v2.Standby() {
		t.Fatalf("open on the second gateway: standby %v, %v; want standby", v2 != nil && v2.Standby(), err)
	}
	if _, err := v2.ReadAt(buf, 0); !errors.Is(err, initiator.ErrStandby) {
		t.Fatalf("standby read: %v, want ErrStandby", err)
	}
	v3, err := s2.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
	if err != nil || v3.Standby() {
		t.Fatalf("takeover: %v", err)
	}
	if _, err := v3.ReadAt(buf, 0); err != nil || check(buf, 0, 1) != nil {
		t.Fatalf("read after the takeover: %v %v", err, check(buf, 0, 1))
	}

	pattern(buf, 1, 1, 1)
	if _, err := mv.WriteAt(buf, 4096); err != nil {
		t.Fatalf("write after the other host's takeover: %v", err)
	}
	// The first gateway was fenced; the failover closed this host's
	// handle there, its last, so it holds nothing of the volume.
	if mv.Failovers() != 1 || mv.Path() != r.addrs[1] || r.cats[0].State("vol0") == gateway.Active {
		t.Fatalf("%d failovers, path %s, gateway 0 %v; want 1, the second, not active", mv.Failovers(), mv.Path(), r.cats[0].State("vol0"))
	}
	verifyStamps(t, mv, []uint32{1, 1})
}

// TestMultipathSteadyStateAllocs: a Multipath volume's synchronous 4 KiB
// writes and reads, and its Submit, allocate nothing per I/O, the
// target's side included, as a plain Volume's do.
func TestMultipathSteadyStateAllocs(t *testing.T) {
	r := newGatewayRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	buf := make([]byte, 4096)
	done := make(chan *initiator.Request, 1)
	rq := &initiator.Request{Op: initiator.OpWrite, Buf: make([]byte, 4096), Offset: 8192, Done: done}
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"write", func() error { _, err := mv.WriteAtContext(ctx, buf, 4096); return err }},
		{"read", func() error { _, err := mv.ReadAtContext(ctx, buf, 4096); return err }},
		{"submit", func() error {
			if err := mv.Submit(rq); err != nil {
				return err
			}
			return (<-done).Err
		}},
	} {
		for range 100 {
			if err := op.f(); err != nil {
				t.Fatal(err)
			}
		}
		if a := testing.AllocsPerRun(500, func() { op.f() }); a > 0.1 {
			t.Errorf("multipath %s: %.2f allocations per I/O, want 0", op.name, a)
		}
	}
}

// TestMultipathDeadFirstPath: a Multipath whose first address answers
// nothing opens the volume on the second, active; one whose every
// address is dead fails to dial, saying so.
func TestMultipathDeadFirstPath(t *testing.T) {
	r := newGatewayRig(t)
	r.stop[0]()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := initiator.MultipathConfig{Config: initiator.Config{Provider: r.ip, Name: "host", ConnectTimeout: time.Second},
		Addrs: r.addrs}
	m, err := initiator.DialMultipath(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mv, err := m.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mv.Close()
	if mv.Path() != r.addrs[1] || r.cats[1].State("vol0") != gateway.Active || mv.Failovers() != 0 {
		t.Fatalf("path %s, gateway 1 %v, %d failovers; want the second, active, none", mv.Path(), r.cats[1].State("vol0"), mv.Failovers())
	}
	if _, err := mv.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	r.stop[1]()
	if _, err := initiator.DialMultipath(ctx, cfg); err == nil {
		t.Fatal("a multipath of dead addresses dialed")
	}
}

// TestMultipathSubmitFailover: asynchronous writes (Submit) at QD8, the
// active gateway killed among them: every request comes back without
// an error, the ones the dead path failed re-issued on the other, and
// every block reads back as its last acknowledged write.
func TestMultipathSubmitFailover(t *testing.T) {
	r := newGatewayRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mv := r.open(t, ctx)
	const qd, blocks, writes = 8, 64, 3000
	gens := make([]uint32, blocks)
	inflight := make([]bool, blocks)
	done := make(chan *initiator.Request, qd)
	next := 0
	submit := func(rq *initiator.Request) {
		for inflight[next%blocks] {
			next++
		}
		lba := next % blocks
		next++
		inflight[lba] = true
		pattern(rq.Buf, uint64(lba), gens[lba]+1, 1)
		rq.Op, rq.Offset, rq.Err = initiator.OpWrite, int64(lba)*4096, nil
		if err := mv.Submit(rq); err != nil {
			t.Fatal(err)
		}
	}
	for range qd {
		submit(&initiator.Request{Buf: make([]byte, 4096), Done: done})
	}
	for n := range writes {
		rq := <-done
		if rq.Err != nil {
			t.Fatalf("write %d: %v", n, rq.Err)
		}
		lba := int(rq.Offset / 4096)
		gens[lba]++
		inflight[lba] = false
		if n == writes/3 {
			r.stop[0]()
		}
		if n < writes-qd {
			submit(rq)
		}
	}
	if mv.Failovers() != 1 || mv.Path() != r.addrs[1] {
		t.Fatalf("%d failovers, path %s; want 1, the second", mv.Failovers(), mv.Path())
	}
	verifyStamps(t, mv, gens)
}
