package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestDeleteVolumeCrash: a pebble srpd SIGKILLed at any moment of
// 'srpd volume delete' leaves every volume either wholly there or wholly
// gone, and the store opens again.
//
// Each round, the volumes of four slots hold random data written and
// flushed through the initiator, some with a snapshot taken under a
// later overwrite (two layers, two records). 'srpd volume delete' runs
// on most of them at once (with --snapshots on some that have one, and
// without it on others, which must be refused), and srpd is SIGKILLed,
// then started again on the same data directory. The kill comes at one
// of these points, each once in every six rounds (in a seeded order),
// the commands reaching srpd through an adminTap on their --socket,
// which sees each DELETE pass:
//
//   - at the k-th DELETE request, before srpd has it;
//   - while srpd serves it: within the time srpd took over one of the
//     deletes it has answered so far, drawn at random, after srpd was
//     handed it;
//   - at its answer, before the command has it;
//   - after the command was handed its answer;
//   - after every command has returned;
//   - or, through srpd's own socket, 0-40 ms after the commands start
//     (most then find srpd gone and run offline on the data directory,
//     the admin commands' fallback).
//
// After every kill:
//
//   - srpd starts: the store opens, and lists its volumes and snapshots;
//   - a volume still listed has its size, its snapshots, and its data and
//     each snapshot's data byte for byte, as before the delete;
//   - a volume not listed was being deleted, not by a delete refused for
//     its snapshots, and none of its snapshots is listed either;
//   - a delete that exited 0, or whose success srpd sent (the tap saw a
//     2xx answer) before it was killed, left its volume gone: srpd
//     answers only once the delete's batch is synced;
//   - a name that is gone can be created again, and the new volume
//     reads zeros from end to end: nothing of the old one's layers shows
//     through.
//
// PebbleStore.delete makes all of a delete (the volume's record, its
// snapshots' records, and the range deletions of the layers nothing else
// reads) one batch under the store lock, applied with a sync; a delete
// split in two batches (the layers and snapshot records, then the
// volume's record) failed 4 of 5 runs of 16 rounds (a volume listed with
// its data or its snapshots gone). A failure names its round and seed;
// replaying the seed replays the same volumes, deletes and kill points,
// though not the exact interleaving of the timed kills. GOSRP_DELETE_CRASH=N runs N
// rounds (default 16), GOSRP_DELETE_CRASH_SEED=S replays a run.
func TestDeleteVolumeCrash(t *testing.T) {
	srpd, _ := e2etest.Binaries(t)
	rounds := int(testenv.Int(t, "GOSRP_DELETE_CRASH", 16, 1))
	seed := testenv.Seed(t, "GOSRP_DELETE_CRASH_SEED")
	rng := rand.New(rand.NewPCG(uint64(seed), 0xde1e7e))
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := e2etest.FreeAddr(t)
	start := func() *e2etest.Daemon {
		t.Helper()
		return e2etest.StartDaemon(t, srpd, data, addr, "", "--no-default-volume")
	}
	d := start()
	tap := newAdminTap(t, filepath.Join(dir, "tap.sock"), filepath.Join(data, admin.SocketName))
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	m := &deleteModel{srpd: srpd, data: data, addr: addr, rng: rng}
	for i := range 4 {
		m.vols = append(m.vols, &modelVolume{name: "v" + strconv.Itoa(i)})
	}
	tally := deleteTally{points: map[string]int{}}
	var mu sync.Mutex // guards served and the runs' answers, which the tap's hook sets
	// served are how long srpd took over the deletes it answered, from
	// the request to the answer; a kill while srpd serves one comes
	// within one of them, drawn at random.
	served := []time.Duration{3 * time.Millisecond}
	// The kill points (0: timed, 1: after every delete returned, 2-5: the
	// tap's points), each once in every six rounds, in a seeded order.
	var cycle []int
	began := time.Now()
	for round := range rounds {
		desc := fmt.Sprintf("round %d (seed %d)", round, seed)
		m.prepare(t, ctx, desc, round)

		// The deletes: most slots, each its own 'srpd volume delete'.
		var runs []*deleteRun
		byName := map[string]*deleteRun{}
		for _, v := range m.vols {
			if rng.IntN(5) == 0 {
				continue // a bystander: must come through untouched
			}
			dr := &deleteRun{vol: v, withSnaps: len(v.snaps) > 0 && rng.IntN(3) != 0}
			dr.args = []string{"volume", "delete", "--data", data, v.name}
			if dr.withSnaps {
				dr.args = append(dr.args, "--snapshots")
			}
			runs = append(runs, dr)
			byName[v.name] = dr
		}
		if len(runs) == 0 {
			continue
		}
		// Where the kill comes (see the doc comment).
		if len(cycle) == 0 {
			cycle = rng.Perm(6)
		}
		mode := cycle[0]
		cycle = cycle[1:]
		k := 1 + rng.IntN(len(runs))
		point := tapPoint(max(mode-2, 0))
		mu.Lock()
		serveFor := time.Duration(rng.Int64N(int64(served[rng.IntN(len(served))])*6/5 + 1))
		mu.Unlock()
		timed := time.Duration(rng.IntN(40_000)) * time.Microsecond
		var where, kill string
		switch {
		case mode == 0:
			where, kill = "timed", fmt.Sprintf("%v after the commands started, through srpd's socket", timed)
		case mode == 1:
			where, kill = "after every delete returned", "after every delete returned"
		case point == tapServing:
			where, kill = point.String(), fmt.Sprintf("%v into srpd serving DELETE %d of %d", serveFor, k, len(runs))
		default:
			where, kill = point.String(), fmt.Sprintf("%s of DELETE %d of %d", point, k, len(runs))
		}
		desc += ": kill " + kill

		fired, killed := make(chan struct{}), make(chan struct{})
		sentAt := map[int]time.Time{} // when each DELETE came to the tap
		tap.setHook(func(ev tapEvent) (cut bool) {
			mu.Lock()
			switch ev.point {
			case tapRequest:
				// Not at tapServing: the answer may come before the
				// request side's goroutine gets there.
				sentAt[ev.seq] = time.Now()
			case tapAnswer:
				if dr := byName[ev.volume]; dr != nil {
					dr.answer = ev.status
				}
				if at, ok := sentAt[ev.seq]; ok {
					served = append(served, time.Since(at))
				}
			}
			mu.Unlock()
			if mode < 2 || ev.seq != k || ev.point != point {
				return false
			}
			close(fired)
			if point != tapRequest && point != tapAnswer {
				return false
			}
			// The bytes wait for the kill, and never pass: srpd does not
			// see the request, or the command its answer.
			select {
			case <-killed:
			case <-time.After(time.Minute):
			}
			return true
		})
		for _, dr := range runs {
			if mode >= 2 {
				dr.args = append(dr.args, "--socket", tap.path)
			}
			dr.p = e2etest.StartProc(t, srpd, dr.args...)
		}
		allDone := make(chan struct{})
		go func() {
			for _, dr := range runs {
				<-dr.p.Exited()
			}
			close(allDone)
		}()
		switch mode {
		case 0:
			time.Sleep(timed) // the moment of the kill, not a wait for an outcome
		case 1:
			<-allDone
		default:
			select {
			case <-fired:
				if point == tapServing {
					time.Sleep(serveFor) // as above
				}
			case <-allDone:
				for _, dr := range runs {
					dr.code, dr.out = dr.p.ExitCode(), strings.TrimSpace(dr.p.Output())
				}
				t.Fatalf("%s: every delete returned before DELETE %d reached that point:\n%s", desc, k, runSummary(runs))
			}
		}
		for _, dr := range runs {
			select {
			case <-dr.p.Exited():
				dr.beforeKill = true
			default:
			}
		}
		d.Kill(t)
		close(killed)
		for _, dr := range runs {
			// srpd is gone: each command has its answer, a cut
			// connection, or runs offline on the data directory, which
			// it must release before srpd starts again.
			dr.p.Wait(t, time.Minute, desc)
			dr.code, dr.out = dr.p.ExitCode(), strings.TrimSpace(dr.p.Output())
		}
		tap.setHook(nil)
		mu.Lock()
		for _, dr := range runs {
			dr.answered = dr.answer
		}
		mu.Unlock()
		d = start()
		m.check(t, ctx, desc, runs, &tally)
		tally.points[where]++
		t.Logf("%s: %s", desc, runSummary(runs))
	}
	// The names the last round took are reusable too, and read zeros.
	m.prepare(t, ctx, fmt.Sprintf("after round %d (seed %d)", rounds-1, seed), rounds)
	mu.Lock()
	slices.Sort(served)
	t.Logf("%d rounds in %v (seed %d), srpd served a delete in %v (median of %d); %s", rounds, time.Since(began).Round(time.Millisecond), seed,
		served[len(served)/2].Round(time.Microsecond), len(served), tally)
	mu.Unlock()
	if code := d.Stop(t); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM:\n%s", code, d.Log())
	}
}

// modelVolume is what a slot's volume holds, as the test wrote it.
type modelVolume struct {
	name  string
	size  int64             // 0: the volume does not exist
	data  []byte            // its content
	snaps map[string][]byte // its snapshots' contents, by name
}

// deleteModel is the test's knowledge of srpd's volumes.
type deleteModel struct {
	srpd, data, addr string
	rng              *rand.Rand
	vols             []*modelVolume
}

// deleteRun is one 'srpd volume delete' of a round.
type deleteRun struct {
	vol        *modelVolume
	withSnaps  bool
	hadSnaps   bool
	args       []string
	p          *e2etest.Proc
	beforeKill bool // it had exited when srpd was killed
	answer     int  // the HTTP status of srpd's answer to it, as the tap saw it (0: none); set by the tap's hook
	answered   int  // answer, read once srpd is dead
	code       int
	out        string
	gone       bool // the volume was gone after the restart
}

// deleteTally counts the kill points the rounds hit and how the deletes
// ended.
type deleteTally struct {
	points                                                      map[string]int
	ackedBefore, ackedAfter, cutAnswered, cutCommitted, cutKept int
	refusedSnaps, untouched                                     int
}

func (c deleteTally) String() string {
	var pts []string
	for _, p := range slices.Sorted(maps.Keys(c.points)) {
		pts = append(pts, fmt.Sprintf("%s %d", p, c.points[p]))
	}
	return fmt.Sprintf("kill points: %s; deletes: %d exited 0 before the kill, %d exited 0 after it (answer in flight, or offline), "+
		"%d answered 2xx but cut before the command had it (volume gone), %d cut after their commit with no answer (volume gone), "+
		"%d cut before it (volume whole), %d refused for snapshots (volume whole); %d bystanders whole",
		strings.Join(pts, ", "), c.ackedBefore, c.ackedAfter, c.cutAnswered, c.cutCommitted, c.cutKept, c.refusedSnaps, c.untouched)
}

// runSummary says in one line how each delete of a round ended.
func runSummary(runs []*deleteRun) string {
	var parts []string
	for _, dr := range runs {
		s := fmt.Sprintf("%s exit %d", dr.vol.name, dr.code)
		if dr.withSnaps {
			s += " (--snapshots)"
		}
		if dr.beforeKill {
			s += " before the kill"
		}
		if dr.gone {
			s += ", gone"
		} else {
			s += ", whole"
		}
		if dr.code != 0 {
			s += ": " + e2etest.LastLine(dr.out)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// session logs in to srpd over an emu NIC of its own; the function it
// returns closes both (so does the test's end, if it comes first).
func (m *deleteModel) session(t *testing.T, ctx context.Context) (*initiator.Session, func()) {
	t.Helper()
	prov, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	s, err := initiator.Dial(ctx, initiator.Config{Provider: prov, Addr: m.addr, Name: "delete-checker", LossTimeout: 5 * time.Second})
	if err != nil {
		prov.Close()
		t.Fatalf("log in to srpd: %v", err)
	}
	done := sync.OnceFunc(func() { s.Close(); prov.Close() })
	t.Cleanup(done)
	return s, done
}

// read reads the whole of name (a volume or VOLUME@SNAPSHOT) of size
// bytes; the volume is closed again, so that a delete does not find it
// busy.
func read(t *testing.T, ctx context.Context, s *initiator.Session, name string, size int64) []byte {
	t.Helper()
	v, err := s.Open(ctx, name, initiator.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer v.Close()
	if v.Size() != size {
		t.Fatalf("%s: the initiator sees %d bytes, want %d", name, v.Size(), size)
	}
	buf := make([]byte, size)
	if _, err := v.ReadAtContext(ctx, buf, 0); err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return buf
}

// firstDiff is the offset of the first byte where got and want differ.
func firstDiff(got, want []byte) int {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return i
}

// writeChunks writes n random 64 KiB chunks at random block-aligned
// offsets of v, and the last block, into v and the model's copy; then
// flushes, so that a SIGKILL cannot take them.
func (m *deleteModel) writeChunks(t *testing.T, ctx context.Context, v *initiator.Volume, mv *modelVolume, n int) {
	t.Helper()
	const chunk = 64 << 10
	offs := []int64{mv.size - 4096}
	for range n {
		offs = append(offs, m.rng.Int64N((mv.size-chunk)/4096+1)*4096)
	}
	for _, off := range offs {
		end := min(off+chunk, mv.size)
		p := mv.data[off:end]
		for i := range p {
			p[i] = byte(m.rng.Uint32())
		}
		if _, err := v.WriteAtContext(ctx, p, off); err != nil {
			t.Fatalf("write %s at %d: %v", mv.name, off, err)
		}
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush %s: %v", mv.name, err)
	}
}

// prepare gives every slot a volume with fresh data for the round: a
// slot whose volume is gone gets a new one of the same name, which must
// read zeros (nothing of the deleted one), then data and, every other
// time, a snapshot under an overwrite; a slot whose volume is there gets
// a few more chunks.
func (m *deleteModel) prepare(t *testing.T, ctx context.Context, desc string, round int) {
	t.Helper()
	s, done := m.session(t, ctx)
	defer done()
	for _, mv := range m.vols {
		fresh := mv.size == 0
		if fresh {
			mv.size = int64(4+4*m.rng.IntN(2)) << 20 // 4 or 8 MiB
			e2etest.MustRun(t, m.srpd, "volume", "create", "--data", m.data, "--size", strconv.FormatInt(mv.size, 10), mv.name)
			got := read(t, ctx, s, mv.name, mv.size)
			if i := firstDiff(got, make([]byte, mv.size)); i < len(got) {
				t.Fatalf("%s: volume %s created again after its delete reads non-zero at byte %d: the deleted volume's data shows through",
					desc, mv.name, i)
			}
			mv.data, mv.snaps = got, map[string][]byte{}
		}
		v, err := s.Open(ctx, mv.name, initiator.OpenOptions{})
		if err != nil {
			t.Fatalf("%s: open %s: %v", desc, mv.name, err)
		}
		m.writeChunks(t, ctx, v, mv, 8)
		if fresh && m.rng.IntN(2) == 0 {
			snap := "s" + strconv.Itoa(round)
			e2etest.MustRun(t, m.srpd, "snapshot", "create", "--data", m.data, mv.name, snap)
			mv.snaps[snap] = slices.Clone(mv.data)
			m.writeChunks(t, ctx, v, mv, 4) // the volume now differs from its snapshot
		}
		if err := v.Close(); err != nil {
			t.Fatalf("%s: close %s: %v", desc, mv.name, err)
		}
	}
}

// check compares what the restarted srpd lists and serves with the model
// and the deletes' outcomes, updates the model, and counts the outcomes.
func (m *deleteModel) check(t *testing.T, ctx context.Context, desc string, runs []*deleteRun, tally *deleteTally) {
	t.Helper()
	var vols []admin.Volume
	var snaps []admin.Snapshot
	for _, q := range []struct {
		args []string
		into any
	}{{[]string{"volume", "list"}, &vols}, {[]string{"snapshot", "list"}, &snaps}} {
		r := e2etest.MustRun(t, m.srpd, append(q.args, "--data", m.data, "--json")...)
		if err := json.Unmarshal([]byte(r.Stdout), q.into); err != nil {
			t.Fatalf("%s: srpd %s --json: %v\n%s", desc, strings.Join(q.args, " "), err, r.Stdout)
		}
	}
	listed := map[string]admin.Volume{}
	for _, v := range vols {
		listed[v.Name] = v
	}
	snapsOf := map[string][]string{}
	for _, x := range snaps {
		snapsOf[x.Volume] = append(snapsOf[x.Volume], x.Name)
	}
	runOf := map[*modelVolume]*deleteRun{}
	for _, dr := range runs {
		dr.hadSnaps = len(dr.vol.snaps) > 0
		runOf[dr.vol] = dr
	}
	s, done := m.session(t, ctx)
	defer done()
	for _, mv := range m.vols {
		dr := runOf[mv]
		lv, present := listed[mv.name]
		delete(listed, mv.name)
		if !present {
			switch {
			case dr == nil:
				t.Fatalf("%s: volume %s vanished, and nobody deleted it", desc, mv.name)
			case dr.hadSnaps && !dr.withSnaps:
				t.Fatalf("%s: volume %s, which has snapshots, is gone after a delete without --snapshots (exit %d: %s)",
					desc, mv.name, dr.code, dr.out)
			case len(snapsOf[mv.name]) > 0:
				t.Fatalf("%s: volume %s is gone but its snapshots %v are listed", desc, mv.name, snapsOf[mv.name])
			}
			dr.gone = true
			mv.size, mv.data, mv.snaps = 0, nil, nil
			continue
		}
		if dr != nil && dr.code == 0 {
			t.Fatalf("%s: 'srpd %s' exited 0, but after the kill and restart volume %s is still listed: an acknowledged delete was lost",
				desc, strings.Join(dr.args, " "), mv.name)
		}
		if dr != nil && dr.answered/100 == 2 {
			t.Fatalf("%s: srpd answered %d to the delete of %s before it was killed, but after the restart the volume is still listed: a delete answered before it was durable",
				desc, dr.answered, mv.name)
		}
		wantSnaps := slices.Sorted(func(yield func(string) bool) {
			for k := range mv.snaps {
				if !yield(k) {
					return
				}
			}
		})
		gotSnaps := slices.Sorted(slices.Values(snapsOf[mv.name]))
		if lv.Size != mv.size || lv.Snapshots != len(mv.snaps) || !slices.Equal(gotSnaps, wantSnaps) {
			t.Fatalf("%s: volume %s is listed with %d bytes and snapshots %v (count %d), want %d bytes and %v: a partial delete",
				desc, mv.name, lv.Size, gotSnaps, lv.Snapshots, mv.size, wantSnaps)
		}
		if got := read(t, ctx, s, mv.name, mv.size); !bytes.Equal(got, mv.data) {
			t.Fatalf("%s: volume %s is listed but its data differs from byte %d on: a partial delete", desc, mv.name, firstDiff(got, mv.data))
		}
		for _, x := range wantSnaps {
			name := mv.name + "@" + x
			if got := read(t, ctx, s, name, mv.size); !bytes.Equal(got, mv.snaps[x]) {
				t.Fatalf("%s: snapshot %s is listed but its data differs from byte %d on: a partial delete", desc, name, firstDiff(got, mv.snaps[x]))
			}
		}
	}
	for name := range listed {
		t.Fatalf("%s: srpd lists a volume %q that the test never made", desc, name)
	}
	for _, mv := range m.vols {
		dr := runOf[mv]
		switch {
		case dr == nil:
			tally.untouched++
		case dr.code == 0 && dr.beforeKill:
			tally.ackedBefore++
		case dr.code == 0:
			tally.ackedAfter++
		case dr.gone && dr.answered/100 == 2:
			tally.cutAnswered++
		case dr.gone:
			tally.cutCommitted++
		case dr.hadSnaps && !dr.withSnaps && strings.Contains(dr.out, "has snapshots"):
			tally.refusedSnaps++
		default:
			tally.cutKept++
		}
	}
}
