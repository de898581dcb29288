package block

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/stretchr/testify/require"
)

// The crash test: a child process (this test binary re-executed) writes a
// seeded pattern to a pebble volume from several goroutines and logs each
// request to a side file before issuing it ("I") and after it returns
// ("A"); the parent SIGKILLs it at a random point, reopens the store and
// checks every block against the log. See checkCrash for the rules.

const (
	crashBlocks   = 256 // volume size in 4 KiB blocks
	crashStripe   = 16  // blocks per ownership stripe
	crashWriters  = 4   // goroutines; writer g owns stripes s with s%crashWriters == g
	crashPhase1   = 40  // single-writer ops before the snapshot
	crashChildEnv = "GOSRP_CRASH_CHILD"
)

func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	iters := int(testenv.Int(t, "GOSRP_CRASH_ITERS", 3, 1))
	seed := seedFrom(t, "GOSRP_CRASH_SEED")
	for i := 0; i < iters; i++ {
		s := seed + int64(i)
		t.Logf("iteration %d: seed=%d (replay with GOSRP_CRASH_SEED=%d GOSRP_CRASH_ITERS=1)", i, s, s)
		runCrash(t, s)
		if t.Failed() {
			return
		}
	}
}

// crashContent is the content write op id puts in block blk: a header
// naming both, then bytes derived from them, so a block proves which write
// it came from and that it is whole.
func crashContent(seed int64, id, blk int64) []byte {
	p := make([]byte, 4096)
	binary.LittleEndian.PutUint64(p[0:], uint64(id))
	binary.LittleEndian.PutUint64(p[8:], uint64(blk))
	r := rand.New(rand.NewPCG(uint64(seed)^uint64(id)<<20, uint64(blk)))
	for i := 16; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], r.Uint64())
	}
	return p
}

func runCrash(t *testing.T, seed int64) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	s, err := OpenPebbleStore(store, nil)
	require.NoError(t, err)
	v, err := s.Create("crash", crashBlocks*4096, 4096)
	require.NoError(t, err)
	require.NoError(t, v.Close())
	require.NoError(t, s.Close())

	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	killAfter := 1 + rng.IntN(2000) // log records before the kill
	logPath := filepath.Join(dir, "log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d", crashChildEnv, store, logPath, seed))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("child exited before the kill: %v\n%s", err, out.String())
		default:
		}
		if countLines(logPath) >= killAfter || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond) // polling, not a timing assertion
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	<-exited
	checkCrash(t, seed, store, logPath)
}

func countLines(path string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte{'\n'})
}

// TestCrashChild is the child side; it runs only when re-executed by TestCrash.
func TestCrashChild(t *testing.T) {
	arg := os.Getenv(crashChildEnv)
	if arg == "" {
		t.Skip("child of TestCrash only")
	}
	parts := strings.Split(arg, ",")
	seed, _ := strconv.ParseInt(parts[2], 10, 64)
	// A small memtable makes WAL rotations and flushes happen in the run.
	s, err := OpenPebbleStore(parts[0], &PebbleOptions{MemTableSize: 1 << 20})
	if err != nil {
		panic(err)
	}
	v, err := s.Open("crash")
	if err != nil {
		panic(err)
	}
	lf, err := os.OpenFile(parts[1], os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	var logMu sync.Mutex
	logf := func(format string, a ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		if _, err := lf.WriteString(fmt.Sprintf(format, a...) + "\n"); err != nil {
			panic(err)
		}
	}
	var nextID atomic.Int64
	// run issues one random op by writer g.
	run := func(rng *rand.Rand, g int) {
		id := nextID.Add(1)
		stripes := crashBlocks / crashStripe / crashWriters
		stripe := int64((rng.IntN(stripes)*crashWriters + g) * crashStripe)
		first := stripe + rng.Int64N(crashStripe)
		n := 1 + rng.Int64N(min(4, stripe+crashStripe-first))
		switch op := rng.IntN(100); {
		case op < 60, op < 80: // write, FUA write
			kind := "W"
			if op >= 60 {
				kind = "U"
			}
			p := make([]byte, 0, n*4096)
			for b := first; b < first+n; b++ {
				p = append(p, crashContent(seed, id, b)...)
			}
			logf("I %d %s %d %d", id, kind, first, n)
			if kind == "U" {
				_, err = v.WriteAtFUA(p, first*4096)
			} else {
				_, err = v.WriteAt(p, first*4096)
			}
		case op < 90:
			logf("I %d D %d %d", id, first, n)
			err = v.Discard(first*4096, n*4096)
		default:
			logf("I %d F 0 0", id)
			err = v.Flush()
		}
		if err != nil {
			panic(err)
		}
		logf("A %d", id)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	for i := 0; i < crashPhase1; i++ {
		run(rng, rng.IntN(crashWriters))
	}
	id := nextID.Add(1)
	logf("I %d S 0 0", id)
	if _, err := s.Snapshot("crash", "snap"); err != nil {
		panic(err)
	}
	logf("A %d", id)
	var wg sync.WaitGroup
	for g := 0; g < crashWriters; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(10+g)))
			for {
				run(rng, g)
			}
		}()
	}
	wg.Wait()
}

// crashOp is one logged request.
type crashOp struct {
	id       int64
	kind     byte // W write, U FUA write, D discard, F flush, S snapshot
	first, n int64
	acked    bool
	durable  bool
	issuedAt int // line number of the issue record
	ackedAt  int
}

// checkCrash reopens the store and checks, for every block: its content is
// whole (never torn) and comes from a write issued for that block, or is
// zero; it is not older than the newest durable request on the block
// (durable: a FUA write that returned, or a request that returned before
// a Flush or the snapshot was issued and that one returned); and a
// multi-block write is all-or-nothing. The snapshot, if taken, must hold
// exactly the state before it, and the volume's metadata must be intact.
func checkCrash(t *testing.T, seed int64, store, logPath string) {
	ops := map[int64]*crashOp{}
	var order []*crashOp // by issue line
	f, err := os.Open(logPath)
	require.NoError(t, err)
	sc := bufio.NewScanner(f)
	line := 0
	var barriers []*crashOp // acked flushes and snapshots
	for sc.Scan() {
		line++
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 5 && fs[0] == "I":
			op := &crashOp{kind: fs[2][0], issuedAt: line}
			op.id, _ = strconv.ParseInt(fs[1], 10, 64)
			op.first, _ = strconv.ParseInt(fs[3], 10, 64)
			op.n, _ = strconv.ParseInt(fs[4], 10, 64)
			ops[op.id] = op
			order = append(order, op)
		case len(fs) == 2 && fs[0] == "A":
			id, _ := strconv.ParseInt(fs[1], 10, 64)
			if op := ops[id]; op != nil {
				op.acked, op.ackedAt = true, line
				if op.kind == 'F' || op.kind == 'S' {
					barriers = append(barriers, op)
				}
				if op.kind == 'U' || op.kind == 'S' || op.kind == 'F' {
					op.durable = true
				}
			}
		}
		// A torn last line (killed mid-write) is ignored.
	}
	require.NoError(t, f.Close())
	for _, b := range barriers {
		for _, op := range order {
			if op.acked && op.ackedAt < b.issuedAt {
				op.durable = true
			}
		}
	}
	t.Logf("log: %d lines, %d requests, %d durable barriers", line, len(order), len(barriers))

	s, err := OpenPebbleStore(store, nil)
	require.NoError(t, err, "reopen after crash")
	defer s.Close()
	infos, err := s.List()
	require.NoError(t, err)
	require.Equal(t, []VolumeInfo{{Name: "crash", Size: crashBlocks * 4096, BlockSize: 4096, Created: infos[0].Created, Generation: infos[0].Generation,
		Identity: volumeIdentity("crash", "", infos[0].Created.UnixNano())}}, infos)

	// Per block: the requests touching it, in issue order. Requests on one
	// block come from one writer, so issue order is execution order.
	perBlock := make([][]*crashOp, crashBlocks)
	var snapOp *crashOp
	for _, op := range order {
		if op.kind == 'S' {
			snapOp = op
		}
		for b := op.first; b < op.first+op.n; b++ {
			perBlock[b] = append(perBlock[b], op)
		}
	}
	v, err := s.Open("crash")
	require.NoError(t, err)
	defer v.Close()
	img := make([]byte, crashBlocks*4096)
	_, err = v.ReadAt(img, 0)
	require.NoError(t, err)
	found := make([]int, crashBlocks) // index in perBlock[b] of the state found; -1 initial
	for b := int64(0); b < crashBlocks; b++ {
		found[b] = stateIndex(t, seed, b, img[b*4096:(b+1)*4096], perBlock[b], ops)
		minIdx := -1
		for i, op := range perBlock[b] {
			if op.durable {
				minIdx = i
			}
		}
		if found[b] < minIdx {
			t.Fatalf("block %d: holds state %d but request %d (%c) was durable at index %d: lost durable write",
				b, found[b], perBlock[b][minIdx].id, perBlock[b][minIdx].kind, minIdx)
		}
	}
	// Multi-block writes are atomic.
	for b := int64(0); b < crashBlocks; b++ {
		if found[b] < 0 {
			continue
		}
		w := perBlock[b][found[b]]
		if w.kind != 'W' && w.kind != 'U' {
			continue
		}
		for ob := w.first; ob < w.first+w.n; ob++ {
			idx := -1
			for i, op := range perBlock[ob] {
				if op == w {
					idx = i
				}
			}
			if found[ob] < idx {
				t.Fatalf("write %d over blocks %d+%d is torn: block %d has it, block %d has an older state", w.id, w.first, w.n, b, ob)
			}
		}
	}
	// The snapshot holds exactly the phase-1 state.
	snaps, err := s.Snapshots("crash")
	require.NoError(t, err)
	if snapOp != nil && snapOp.acked {
		require.Len(t, snaps, 1, "acknowledged snapshot lost")
	}
	if snapOp == nil {
		require.Empty(t, snaps)
	}
	if len(snaps) == 1 {
		sv, err := s.OpenSnapshot("crash", "snap")
		require.NoError(t, err)
		defer sv.Close()
		want := make([]byte, crashBlocks*4096)
		for _, op := range order {
			if op.id >= snapOp.id {
				break
			}
			for b := op.first; b < op.first+op.n; b++ {
				switch op.kind {
				case 'W', 'U':
					copy(want[b*4096:], crashContent(seed, op.id, b))
				case 'D':
					clear(want[b*4096 : (b+1)*4096])
				}
			}
		}
		got := make([]byte, len(want))
		_, err = sv.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "snapshot content differs from the state before it")
	}
}

// stateIndex identifies the content of block b: the index in ops of the
// write it came from, or for zeros the latest discard (-1 if none).
func stateIndex(t *testing.T, seed, b int64, got []byte, ops []*crashOp, all map[int64]*crashOp) int {
	if bytes.Equal(got, make([]byte, len(got))) {
		idx := -1
		for i, op := range ops {
			if op.kind == 'D' {
				idx = i
			}
		}
		return idx
	}
	id := int64(binary.LittleEndian.Uint64(got[0:]))
	hb := int64(binary.LittleEndian.Uint64(got[8:]))
	if hb != b || all[id] == nil {
		t.Fatalf("block %d: header says write %d block %d, not a write issued for this block", b, id, hb)
	}
	if !bytes.Equal(got, crashContent(seed, id, b)) {
		t.Fatalf("block %d: torn: header of write %d but the content differs", b, id)
	}
	for i, op := range ops {
		if op.id == id && (op.kind == 'W' || op.kind == 'U') {
			return i
		}
	}
	t.Fatalf("block %d: content of request %d, which did not write this block", b, id)
	return 0
}
