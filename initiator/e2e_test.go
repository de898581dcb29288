package initiator_test

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/servetest"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

var seedFlag = flag.Int64("e2e.seed", 0, "seed for the randomized end-to-end tests (0: from the clock)")

func testSeed(t *testing.T) int64 {
	s := *seedFlag
	if s == 0 {
		s = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay with -e2e.seed=%d)", s, s)
	return s
}

// rig is a target serving one memory-backed volume and a provider for
// initiators, on one software NIC (loop wire) or two (tcp wire).
type rig struct {
	tp, ip *emu.Provider
	tgt    *target.Target
	addr   string
	store  block.Store
}

func newRig(t testing.TB, cfg emu.Config, volSize int64, tcfg target.Config) *rig {
	t.Helper()
	tp, err := emu.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ip := tp
	if cfg.Wire == emu.WireTCP {
		if ip, err = emu.New(cfg); err != nil {
			t.Fatal(err)
		}
	}
	st := block.NewMemStore()
	if _, err := st.Create("vol0", volSize, 4096); err != nil {
		t.Fatal(err)
	}
	tcfg.Catalog = storecatalog.Catalog{Store: st}
	if tcfg.Name == "" {
		tcfg.Name = "test-target"
	}
	tgt, err := target.New(tcfg)
	if err != nil {
		t.Fatal(err)
	}
	closeIP := func() error {
		if ip != tp {
			return ip.Close()
		}
		return nil
	}
	addr := serve(t, tgt, tp.Listen, closeIP, tp.Close, st.Close)
	return &rig{tp: tp, ip: ip, tgt: tgt, addr: addr, store: st}
}

// serve runs tgt until the test ends (servetest.Serve).
func serve(t testing.TB, tgt *target.Target, listen func(context.Context, string) (transport.Listener, error), closers ...func() error) string {
	t.Helper()
	return servetest.Serve(t, tgt, listen, closers...)
}

func (r *rig) dial(t testing.TB, cfg initiator.Config) *initiator.Session {
	t.Helper()
	cfg.Provider, cfg.Addr = r.ip, r.addr
	if cfg.Name == "" {
		cfg.Name = "test-initiator"
	}
	return dial(t, cfg)
}

// dial dials with cfg (servetest.Dial).
func dial(t testing.TB, cfg initiator.Config) *initiator.Session {
	t.Helper()
	return servetest.Dial(t, cfg)
}

// dialVol0 is dial, then the opening of vol0.
func dialVol0(t testing.TB, cfg initiator.Config) (*initiator.Session, *initiator.Volume) {
	t.Helper()
	s := dial(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s, openVol0(t, ctx, s)
}

// openVol0 opens vol0 on s read-write, and fails the test if it cannot.
func openVol0(t testing.TB, ctx context.Context, s *initiator.Session) *initiator.Volume {
	t.Helper()
	return openNamed(t, ctx, s, "vol0")
}

// openNamed opens the volume named name on s read-write, and fails the
// test if it cannot.
func openNamed(t testing.TB, ctx context.Context, s *initiator.Session, name string) *initiator.Volume {
	t.Helper()
	v, err := s.Open(ctx, name, initiator.OpenOptions{})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return v
}

// pattern fills a block with its LBA, a write generation and a checksum,
// so a misplaced, stale or torn block is recognised.
func pattern(b []byte, lba uint64, gen uint32, seed uint64) {
	binary.LittleEndian.PutUint64(b[0:], lba)
	binary.LittleEndian.PutUint32(b[8:], gen)
	x := seed ^ lba*0x9e3779b97f4a7c15 ^ uint64(gen)<<32
	for i := 16; i+8 <= len(b)-4; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.ChecksumIEEE(b[:len(b)-4]))
}

// check verifies a block against the generation the model expects.
func check(b []byte, lba uint64, gen uint32) error {
	if gen == 0 {
		for i, c := range b {
			if c != 0 {
				return fmt.Errorf("lba %d: never written but byte %d is %#x", lba, i, c)
			}
		}
		return nil
	}
	if crc32.ChecksumIEEE(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("lba %d: torn or corrupt block (checksum)", lba)
	}
	if got := binary.LittleEndian.Uint64(b); got != lba {
		return fmt.Errorf("lba %d: holds block %d", lba, got)
	}
	if got := binary.LittleEndian.Uint32(b[8:]); got != gen {
		return fmt.Errorf("lba %d: generation %d, want %d", lba, got, gen)
	}
	return nil
}

// workload runs random reads and writes of 1..8 blocks at queue depth qd
// against v, checking every read against a model of acknowledged writes.
// Blocks with a write in flight are locked so reads see a definite
// generation. It returns the model.
func workload(t *testing.T, v *initiator.Volume, seed int64, qd, ops int) []uint32 {
	t.Helper()
	const bs = 4096
	nblocks := int(v.Size() / bs)
	gens := make([]uint32, nblocks)
	locks := make([]sync.Mutex, nblocks)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errc := make(chan error, qd)
	for w := 0; w < qd; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			buf := make([]byte, 8*bs)
			for i := 0; i < ops/qd; i++ {
				n := 1 + rng.IntN(8)
				lba := rng.IntN(nblocks - n + 1)
				for k := lba; k < lba+n; k++ {
					locks[k].Lock()
				}
				b := buf[:n*bs]
				var err error
				if rng.IntN(2) == 0 {
					mu.Lock()
					g := make([]uint32, n)
					for k := range g {
						gens[lba+k]++
						g[k] = gens[lba+k]
					}
					mu.Unlock()
					for k := 0; k < n; k++ {
						pattern(b[k*bs:(k+1)*bs], uint64(lba+k), g[k], uint64(seed))
					}
					_, err = v.WriteAt(b, int64(lba)*bs)
				} else {
					if _, err = v.ReadAt(b, int64(lba)*bs); err == nil {
						mu.Lock()
						for k := 0; k < n && err == nil; k++ {
							err = check(b[k*bs:(k+1)*bs], uint64(lba+k), gens[lba+k])
						}
						mu.Unlock()
					}
				}
				for k := lba; k < lba+n; k++ {
					locks[k].Unlock()
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d op %d: %w", w, i, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("seed %d: %v", seed, err)
	}
	return gens
}

// verifyAll reads the whole volume back and checks it against the model.
func verifyAll(t *testing.T, v *initiator.Volume, gens []uint32, seed int64) {
	t.Helper()
	const bs = 4096
	buf := make([]byte, 64*bs)
	for lba := 0; lba < len(gens); lba += 64 {
		n := min(64, len(gens)-lba)
		if _, err := v.ReadAt(buf[:n*bs], int64(lba)*bs); err != nil {
			t.Fatalf("seed %d: read back %d: %v", seed, lba, err)
		}
		for k := 0; k < n; k++ {
			if err := check(buf[k*bs:(k+1)*bs], uint64(lba+k), gens[lba+k]); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
	}
}

func TestEndToEnd(t *testing.T) {
	for _, prof := range emu.Profiles() {
		for _, wire := range emu.Wires() {
			t.Run("profile="+prof+"/wire="+wire, func(t *testing.T) {
				seed := testSeed(t)
				r := newRig(t, emu.Config{Profile: prof, Wire: wire, Seed: seed, RetryTimeout: 200 * time.Millisecond}, 16<<20, target.Config{})
				s := r.dial(t, initiator.Config{Credits: 32, Channels: 2})
				ctx := context.Background()
				vols, err := s.Volumes(ctx)
				if err != nil || len(vols) != 1 || vols[0].Name != "vol0" || vols[0].Size != 16<<20 {
					t.Fatalf("volumes %+v, %v", vols, err)
				}
				v := openVol0(t, ctx, s)
				gens := workload(t, v, seed, 32, 2000)
				if err := v.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				verifyAll(t, v, gens, seed)
				st := s.Stats()
				if st.Read.Errors+st.Write.Errors != 0 || st.ConnectionsLost != 0 {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	}
}

func TestUnalignedAndCommands(t *testing.T) {
	r := newRig(t, emu.Config{Seed: 1}, 4<<20, target.Config{})
	s := r.dial(t, initiator.Config{})
	ctx := context.Background()
	v := openVol0(t, ctx, s)
	// Unaligned write spanning three blocks, then read back unaligned.
	msg := []byte("gosrp writes any alignment; the initiator reads, merges and writes whole blocks")
	data := make([]byte, 9000)
	for i := range data {
		data[i] = msg[i%len(msg)]
	}
	if _, err := v.WriteAt(data, 1000); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data)+200)
	if _, err := v.ReadAt(got, 900); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if got[i] != 0 {
			t.Fatalf("byte %d before the write is %#x", 900+i, got[i])
		}
	}
	if string(got[100:100+len(data)]) != string(data) {
		t.Fatal("unaligned write/read mismatch")
	}
	// Discard and write-zeroes read back as zeros.
	if err := v.Discard(ctx, 0, 8192); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(ctx, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	z := make([]byte, 12288)
	if _, err := v.ReadAt(z, 0); err != nil {
		t.Fatal(err)
	}
	for i, c := range z {
		if c != 0 {
			t.Fatalf("byte %d is %#x after discard/write-zeroes", i, c)
		}
	}
	// FUA write, flush.
	if _, err := v.WriteAtFUA(ctx, data[:4096], 4<<20-4096); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Out of range is refused locally; the target never sees it.
	if _, err := v.WriteAt(data[:4096], 4<<20); !errors.Is(err, initiator.ErrInvalid) {
		t.Fatalf("write past the end: %v", err)
	}
	if err := v.Discard(ctx, 1, 4096); !errors.Is(err, initiator.ErrInvalid) {
		t.Fatalf("misaligned discard: %v", err)
	}
	// A large read is split at MaxTransfer and lands in order.
	big := make([]byte, 3<<20)
	if _, err := v.ReadAt(big, 0); err != nil {
		t.Fatal(err)
	}
	// A read-only open refuses writes.
	ro, err := s.Open(ctx, "vol0", initiator.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.WriteAt(data[:4096], 0); !errors.Is(err, initiator.ErrReadOnly) {
		t.Fatalf("write to read-only: %v", err)
	}
	if _, err := s.Open(ctx, "nope", initiator.OpenOptions{}); err == nil {
		t.Fatal("opened a volume that does not exist")
	}
}

// protocol is one of the initiator's protocols against the target's
// personality that speaks it.
type protocol struct {
	name string
	cfg  initiator.Config
	tcfg target.Config
	vol  string
}

// protocols are the initiator's two protocols, each against the
// target's personality that speaks it: what to add to the initiator's and
// the target's configurations, and the name vol0 goes by.
var protocols = []protocol{
	{"gosrp", initiator.Config{}, target.Config{}, "vol0"},
	{"srp", initiator.Config{Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort}, target.Config{SRPTargetPortID: srpPort}, "lun0"},
}

// TestFaults injects transport faults (QP errors, link cuts, lost and
// corrupted completions) at random while a workload runs, in gosrp's
// protocol and in T10 SRP: the session reconnects, re-issues what had
// not completed, and every acknowledged write is present afterwards.
// Over two channels: in SRP a channel's loss then has the first log in
// again with SINGLE before it does (srpFence).
func TestFaults(t *testing.T) {
	for _, proto := range protocols {
		for _, prof := range emu.Profiles() {
			for _, wire := range emu.Wires() {
				t.Run("protocol="+proto.name+"/profile="+prof+"/wire="+wire, func(t *testing.T) {
					seed := testSeed(t)
					f := emu.Faults{QPError: 0.002, LinkCut: 0.001, Duplicate: 0.01, CorruptCQE: 0.001}
					r := newRig(t, emu.Config{Profile: prof, Wire: wire, Seed: seed, Faults: f}, 8<<20, proto.tcfg)
					cfg := proto.cfg
					cfg.Credits, cfg.IOTimeout, cfg.ConnectTimeout, cfg.LossTimeout = 16, 2*time.Second, 2*time.Second, 30*time.Second
					cfg.Channels = 2
					s := r.dial(t, cfg)
					v := openNamed(t, context.Background(), s, proto.vol)
					gens := workload(t, v, seed, 16, 1500)
					verifyAll(t, v, gens, seed)
					t.Logf("connections lost %d, reconnects %d, emu %+v", s.Stats().ConnectionsLost, s.Stats().Reconnects, r.ip.Counters())
				})
			}
		}
	}
}

var _ = transport.ErrClosed

// TestStrayOldKeyWrites plays a buggy or malicious target: while a
// verified workload runs, the target's QPs issue RDMA WRITEs of garbage
// through keys one generation older than those the initiator's MRs hold.
// Every stray must fail with REM_ACCESS_ERR (the key is no longer valid on
// the initiator's device), the session must recover from the connection
// errors that follow, and no acknowledged write may be lost or altered:
// in gosrp's protocol and in T10 SRP, where the initiator's LOCAL_INV
// alone ends each key.
func TestStrayOldKeyWrites(t *testing.T) {
	for _, proto := range protocols {
		for _, prof := range emu.Profiles() {
			t.Run("protocol="+proto.name+"/profile="+prof+"/wire=tcp", func(t *testing.T) { testStrayOldKeyWrites(t, proto.cfg, proto.tcfg, proto.vol, prof) })
		}
	}
}

func testStrayOldKeyWrites(t *testing.T, cfg initiator.Config, tcfg target.Config, vol, prof string) {
	seed := testSeed(t)
	r := newRig(t, emu.Config{Profile: prof, Wire: emu.WireTCP, Seed: seed, RetryTimeout: 200 * time.Millisecond}, 8<<20, tcfg)
	cfg.Credits, cfg.IOTimeout, cfg.ConnectTimeout = 16, 2*time.Second, 2*time.Second
	s := r.dial(t, cfg)
	v := openNamed(t, context.Background(), s, vol)
	stop := make(chan struct{})
	strays := make(chan int, 1)
	go func() {
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		garbage := make([]byte, 4096)
		for i := range garbage {
			garbage[i] = 0xEE
		}
		n := 0
		defer func() { strays <- n }()
		// A bounded number of strays, each after the session has
		// recovered from the previous one, so the workload always
		// makes progress (under -race too).
		for n < 25 {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if s.Stats().Reconnects < uint64(n) {
				continue
			}
			qps := r.tp.QPs()
			var objs []uint32
			for _, kind := range []string{"frmr", "mw"} {
				objs = append(objs, r.ip.MemObjects(kind)...)
			}
			if len(qps) == 0 || len(objs) == 0 {
				continue
			}
			info, ok := r.ip.MRInfo(objs[rng.IntN(len(objs))])
			if !ok || info.Key.Variant() == 0 {
				continue
			}
			stale := transport.MakeKey(info.Key.Index(), info.Key.Variant()-1)
			st, err := r.tp.InjectStray(qps[rng.IntN(len(qps))], transport.OpRDMAWrite, stale, info.IOVA, garbage[:min(len(garbage), int(max(info.Len, 1)))])
			if err != nil {
				continue // the QP was not connected (between reconnects)
			}
			if st == transport.StatusSuccess {
				t.Errorf("stray WRITE through stale key %s succeeded", stale)
			}
			n++
		}
		<-stop
	}()
	gens := workload(t, v, seed, 16, 1500)
	close(stop)
	n := <-strays
	verifyAll(t, v, gens, seed)
	t.Logf("%d strays, %d connections lost, initiator NIC %+v", n, s.Stats().ConnectionsLost, r.ip.Counters())
}

// TestImmediateWrites: a write of up to Config.ImmediateData bytes travels
// inside its command and registers no memory; a larger write, a read, and
// every write with immediate data turned off register an MR each. The data
// reads back the same either way.
func TestImmediateWrites(t *testing.T) {
	const n = 10 // of each size
	for _, tc := range []struct {
		name string
		imm  int
		regs int // reads, plus writes of 4, 8 and 16 KiB above the limit
	}{
		{"default", 0, n + n},
		{"4KiB", 4096, n + 2*n},
		{"off", -1, n + 3*n},
	} {
		for _, w := range []string{emu.WireLoop, emu.WireShm} {
			t.Run(tc.name+"/wire="+w, func(t *testing.T) {
				r := newRig(t, emu.Config{Wire: w, Seed: 1}, 4<<20, target.Config{})
				s := r.dial(t, initiator.Config{ImmediateData: tc.imm})
				ctx := context.Background()
				v := openVol0(t, ctx, s)
				const bs = 4096
				buf := make([]byte, 4*bs)
				got := make([]byte, 4*bs)
				lba := 0
				for _, size := range []int{bs, 2 * bs, 4 * bs} {
					for i := 0; i < n; i++ {
						for k := 0; k < size/bs; k++ {
							pattern(buf[k*bs:(k+1)*bs], uint64(lba+k), 1, 9)
						}
						if _, err := v.WriteAt(buf[:size], int64(lba)*bs); err != nil {
							t.Fatal(err)
						}
						lba += size / bs
					}
				}
				for i := 0; i < n; i++ {
					if _, err := v.ReadAt(got[:bs], int64(i)*bs); err != nil {
						t.Fatal(err)
					}
				}
				gens := make([]uint32, 4<<20/bs)
				for i := 0; i < lba; i++ {
					gens[i] = 1
				}
				verifyAll(t, v, gens, 9)
				// The pools' counters are published once a tick.
				regs := func() int {
					total := 0
					for _, p := range s.Stats().FRMR {
						total += int(p.Registrations)
					}
					return total
				}
				want := tc.regs + 4<<20/bs/64 // verifyAll's 256 KiB reads
				deadline := time.Now().Add(10 * time.Second)
				for regs() != want && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if got := regs(); got != want {
					t.Fatalf("%d registrations, want %d", got, want)
				}
			})
		}
	}
}
