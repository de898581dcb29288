package target

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gosrp/gosrp/internal/logsink"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// memMarks is a DirtyMarks in memory that counts its calls; failMark
// makes the next MarkDirty fail.
type memMarks struct {
	mu            sync.Mutex
	dirty         map[string]bool
	marks, clears int
	failMark      bool
}

func newMemMarks(dirty ...string) *memMarks {
	m := &memMarks{dirty: map[string]bool{}}
	for _, n := range dirty {
		m.dirty[n] = true
	}
	return m
}

func (m *memMarks) DirtyVolumes() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n := range m.dirty {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func (m *memMarks) MarkDirty(v string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failMark {
		m.failMark = false
		return fmt.Errorf("write the mark: %w", syscall.ENOSPC)
	}
	m.marks++
	m.dirty[v] = true
	return nil
}

func (m *memMarks) ClearDirty(v string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clears++
	delete(m.dirty, v)
	return nil
}

func (m *memMarks) state() (dirty bool, marks, clears int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dirty["vol0"], m.marks, m.clears
}

// TestVolMark: the mark is written once before the first write after a
// flush, however many writes wait for it; a flush clears it only if it
// covered every write (none running when it began, none begun since);
// a failed mark fails the write and the next write tries again.
func TestVolMark(t *testing.T) {
	st := newMemMarks()
	m := &volMark{store: st, name: "vol0"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.beforeWrite(); err != nil {
				t.Error(err)
				return
			}
			m.afterWrite()
		}()
	}
	wg.Wait()
	if d, marks, _ := st.state(); !d || marks != 1 {
		t.Fatalf("after 8 concurrent writes: dirty %v, %d marks; want dirty, 1 mark", d, marks)
	}

	// A write running when the flush began is not covered.
	m.beforeWrite()
	f := m.flushStart()
	m.afterWrite()
	m.flushed(f)
	if d, _, clears := st.state(); !d || clears != 0 {
		t.Fatalf("a flush that began under a running write cleared the mark (dirty %v, %d clears)", d, clears)
	}
	// A write begun during the flush is not covered either.
	f = m.flushStart()
	m.beforeWrite()
	m.afterWrite()
	m.flushed(f)
	if d, _, _ := st.state(); !d {
		t.Fatal("a flush cleared the mark of a write begun during it")
	}
	// An idle flush with nothing begun since clears it.
	f = m.flushStart()
	m.flushed(f)
	if d, _, clears := st.state(); d || clears != 1 {
		t.Fatalf("an idle flush left dirty %v, %d clears; want clean, 1", d, clears)
	}

	st.failMark = true
	if err := m.beforeWrite(); err == nil {
		t.Fatal("a write ran although its mark could not be written")
	}
	if err := m.beforeWrite(); err != nil {
		t.Fatalf("the write after a failed mark: %v", err)
	}
	m.afterWrite()
	if d, marks, _ := st.state(); !d || marks != 2 {
		t.Fatalf("after the retried mark: dirty %v, %d marks; want dirty, 2", d, marks)
	}
}

// TestVolMarkVolatile: a memory volume's mark (an Immediate volume's,
// volMark.volatile) is written before its first write as any other's,
// but no flush clears it: a restart loses what was flushed too.
func TestVolMarkVolatile(t *testing.T) {
	st := newMemMarks()
	var d dirtyTable
	if err := d.load(st); err != nil {
		t.Fatal(err)
	}
	m := d.mark("vol0", true)
	if err := m.beforeWrite(); err != nil {
		t.Fatal(err)
	}
	m.afterWrite()
	m.flushed(m.flushStart())
	if dirty, marks, clears := st.state(); !dirty || marks != 1 || clears != 0 {
		t.Fatalf("a memory volume after a write and an idle flush: dirty %v, %d marks, %d clears; want dirty, 1, 0", dirty, marks, clears)
	}
	if d.mark("vol0", false) != m || !m.volatile {
		t.Fatal("the volume's mark is not shared, or forgot it is volatile")
	}
}

// TestSRPWriteCacheLost: an SRP session's write to a volume whose I/O is
// not immediate marks it dirty before it is answered, SYNCHRONIZE CACHE
// clears the mark; a target started with the volume marked tells each
// I_T nexus once: POWER ON OCCURRED on its first command, then WRITE
// ERROR on its next SYNCHRONIZE CACHE, so the host's fsync sees the
// loss; once for the nexus, on whichever of its channels asks first. A
// mark that meets
// a full disk fails its write with SPACE ALLOCATION FAILED. Another nexus is
// told too; the same one logging in after it was told is not.
func TestSRPWriteCacheLost(t *testing.T) {
	e := srpEnvs[0]
	lun := scsi.EncodeLUN(lunVol0)
	write := func(c *srpClient) srp.Rsp {
		copy(c.data(0, bs), pattern(bs, 5))
		return c.do(c.out(srp.Cmd{LUN: lun, CDB: rw10(0x2A, 0, 1, false)}, 0, bs))
	}
	syncCache := srpCmd(lunVol0, 0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	tur := srpCmd(lunVol0, 0x00, 0, 0, 0, 0, 0)

	st := newMemMarks()
	r := newRig(t, e, Config{DirtyMarks: st})
	r.cat.wrap = func(v Volume) Volume { return struct{ Volume }{v} } // not immediate
	c, err := r.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	// A full disk under the mark fails the write as a full store does
	// (SPACE ALLOCATION FAILED), before any byte of it lands; the next
	// write tries the mark again.
	st.mu.Lock()
	st.failMark = true
	st.mu.Unlock()
	c.checkSense("WRITE(10) whose mark meets a full disk", write(c), scsi.SenseSpaceAllocFailed)
	c.good("WRITE(10)", write(c), 0)
	if d, marks, _ := st.state(); !d || marks != 1 {
		t.Fatalf("after an SRP write: dirty %v, %d marks; want dirty, 1", d, marks)
	}
	c.good("SYNCHRONIZE CACHE", c.do(syncCache), 0)
	if d, _, clears := st.state(); d || clears != 1 {
		t.Fatalf("after SYNCHRONIZE CACHE: dirty %v, %d clears; want clean, 1", d, clears)
	}
	c.good("WRITE(10) after the flush", write(c), 0)
	c.logout()
	if d, marks, _ := st.state(); !d || marks != 2 {
		t.Fatalf("after the next write: dirty %v, %d marks; want dirty, 2", d, marks)
	}

	// The target restarts with vol0 still marked, and says so in its log.
	var logs logsink.Buffer
	r2 := newRig(t, e, Config{DirtyMarks: st, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	r2.cat.wrap = r.cat.wrap
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "acknowledged writes not flushed") || !strings.Contains(l, "volume=vol0") {
		t.Errorf("a target started with vol0 marked logged no warning naming it:\n%s", l)
	}
	c2, err := r2.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	// Two channels of the nexus share what it is owed (SAM-5 5.14: per
	// I_T nexus): the unit attention goes to whichever channel asks
	// first, the WRITE ERROR to the first flush on either, each once.
	multi := srpLoginReq(1)
	multi.Flags = srp.MultiChanMulti | srp.ImmediateRequested
	c2b, err := r2.srpDial(t, multi)
	if err != nil {
		t.Fatal(err)
	}
	c2b.checkSense("first command after the restart, on the second channel", c2b.do(tur), scsi.SensePowerOn)
	c2.good("the first channel's first command", c2.do(tur), 0)
	c2.checkSense("SYNCHRONIZE CACHE after the loss", c2.do(syncCache), scsi.SenseCacheLost)
	c2.good("SYNCHRONIZE CACHE, the loss reported", c2.do(syncCache), 0)
	c2b.good("the second channel's SYNCHRONIZE CACHE", c2b.do(syncCache), 0)
	c2b.logout()
	c2.logout()

	c3, err := r2.srpDial(t, srpLoginReq(1))
	if err != nil {
		t.Fatal(err)
	}
	c3.good("the same I_T nexus logging in again", c3.do(tur), 0)
	c3.logout()
	c4, err := r2.srpDial(t, srpLoginReq(2))
	if err != nil {
		t.Fatal(err)
	}
	c4.checkSense("another I_T nexus", c4.do(tur), scsi.SensePowerOn)
	c4.logout()
}
