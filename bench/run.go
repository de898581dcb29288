package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/clock"
)

// prefill reports whether the region is written before the run.
func (o *Options) prefill() bool {
	if o.Prefill.set {
		return o.Prefill.v
	}
	return o.Embedded && o.reads()
}

// sample is one report interval of the measured phase.
type sample struct {
	T    time.Duration // end of the interval, from the start of measuring
	Dur  time.Duration
	Ops  [numOps]uint64
	P50  [numOps]int64
	P95  [numOps]int64
	P99  [numOps]int64
	PMax [numOps]int64
	Job  [][numOps]uint64 // per job
}

// opResult are the measured totals of one operation.
type opResult struct {
	Slat, Clat, Lat Histogram
}

// result is everything a report needs.
type result struct {
	o         *Options
	started   time.Time
	elapsed   time.Duration // measured phase
	ops       [numOps]opResult
	jobs      [][numOps]opResult
	syncs     Histogram   // --fsync FLUSH latencies, all jobs
	jobSyncs  []Histogram // the same per job
	samples   []sample
	cpu       cpuTimes
	targetPID int
	targetCPU *cpuTimes
	frmr      frmr.Stats
	frmrPools int
	// connLost and reconnects sum the sessions' counters: a clean run
	// over a healthy device has none.
	connLost, reconnects uint64
	verify               *verifyState
	volSize              int64
	blockSize            int
	target               string
	interrupt            bool
	targetNote           string
	mallocs              uint64 // heap allocations of the whole process while measuring
	// paths counts the --target paths (1 for one target or embedded);
	// failovers sums the jobs' Multipath failovers; jobPaths are each
	// job's.
	paths     int
	failovers int
	jobPaths  []jobPath
}

// jobPath is what a job saw of its paths: its volume's failovers, the
// path its I/O went to at the end, and the longest time between two of
// its consecutive completions in the measured phase (what a failover
// cost it), with when it ended (from the start of measuring), so that
// it can be told from a stall of the store.
type jobPath struct {
	failovers int
	path      string
	maxGap    time.Duration
	gapEnd    time.Duration
}

// gapJob is the job whose completion gap was the longest (0 when none
// was measured).
func (r *result) gapJob() int {
	job := 0
	for i, p := range r.jobPaths {
		if p.maxGap > r.jobPaths[job].maxGap {
			job = i
		}
	}
	return job
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

func (r *result) totalIOs() uint64 {
	var n uint64
	for i := range r.ops {
		n += r.ops[i].Lat.Count()
	}
	return n
}

// benchLogger sends warnings of the NIC, target and initiator to stderr.
func benchLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runBench sets up, runs and reports one benchmark. Table rows go to
// table as they are measured; the report is written by the caller.
func runBench(ctx context.Context, o *Options, table, msg io.Writer) (*result, error) {
	log := benchLogger(msg)
	if o.Seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		o.Seed = binary.LittleEndian.Uint64(b[:])
	}
	var secret []byte
	if o.SecretFile != "" {
		b, err := os.ReadFile(o.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		secret = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	ip, err := openProvider(o, log)
	if err != nil {
		return nil, err
	}
	defer ip.Close()

	res := &result{o: o, target: o.Target}
	addr := o.Target
	if o.Embedded {
		if o.BS%block.DefaultBlockSize != 0 {
			return nil, cli.Usagef("--bs %s is not a multiple of the embedded volume's %d-byte blocks", formatFioSize(o.BS), block.DefaultBlockSize)
		}
		if o.Size == 0 {
			o.Size = 1 << 30 / o.BS * o.BS
		}
		if o.Size%o.BS != 0 {
			return nil, cli.Usagef("--size %s is not a multiple of --bs %s", formatFioSize(o.Size), formatFioSize(o.BS))
		}
		e, err := startEmbedded(o, ip, log)
		if err != nil {
			return nil, err
		}
		defer func() {
			if e.tp != ip {
				defer e.tp.Close()
			}
			e.close()
		}()
		addr = e.addr
		res.target = "embedded " + o.Backend + " on " + addr
		res.targetNote = "in this process"
	} else {
		res.targetPID = o.TargetPID
		switch {
		case o.multipath():
			// No target's CPU unless --target-pid names one: the
			// first path's process goes idle at a failover.
			res.target = strings.Join(o.Targets, ",")
		case res.targetPID == 0:
			res.targetPID = findTargetPID(addr, o.Wire)
		}
	}

	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conns := make([]*conn, 0, o.NumJobs)
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	for i := 0; i < o.NumJobs; i++ {
		c, err := dialJob(dctx, o, i, ip, addr, secret, log)
		if errors.Is(err, errNoVolume) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("job %d: connect to %s: %w", i, res.target, err)
		}
		conns = append(conns, c)
	}
	v0, s0 := conns[0].vol, conns[0].s
	res.volSize, res.blockSize = v0.Size(), v0.BlockSize()
	switch {
	case o.BS%int64(v0.BlockSize()) != 0:
		return nil, cli.Usagef("--bs %s is not a multiple of the volume's %d-byte blocks", formatFioSize(o.BS), v0.BlockSize())
	case s0 != nil && o.BS > int64(s0.MaxTransfer()):
		// A Multipath does not say; a --bs its paths refuse fails
		// the first I/O, naming the limit.
		return nil, cli.Usagef("--bs %s exceeds the %d bytes one command carries here (the target's limit, and one registration of the NIC)", formatFioSize(o.BS), s0.MaxTransfer())
	case o.Offset >= v0.Size():
		return nil, cli.Usagef("--offset %s is beyond the end of the %s volume", formatFioSize(o.Offset), formatFioSize(v0.Size()))
	}
	if o.Size == 0 {
		o.Size = (v0.Size() - o.Offset) / o.BS * o.BS
	}
	if o.Size%o.BS != 0 {
		return nil, cli.Usagef("--size %s is not a multiple of --bs %s", formatFioSize(o.Size), formatFioSize(o.BS))
	}
	if o.Offset+o.Size > v0.Size() {
		return nil, cli.Usagef("--offset + --size (%s) is beyond the end of the %s volume", formatFioSize(o.Offset+o.Size), formatFioSize(v0.Size()))
	}
	if v0.ReadOnly() && o.writes() {
		return nil, fmt.Errorf("volume %s is read-only", o.Volume)
	}
	nblocks := o.Size / o.BS
	if nblocks == 0 {
		return nil, cli.Usagef("--size is smaller than --bs")
	}
	if o.Verify {
		if inflight := int64(o.NumJobs * o.IODepth); nblocks < 2*inflight {
			return nil, cli.Usagef("--verify needs at least 2 × numjobs × iodepth = %d blocks in the region, have %d", 2*inflight, nblocks)
		}
		res.verify = newVerifyState(nblocks, o.Offset/o.BS, o.Seed)
		if o.StateFile != "" {
			res.verify.record()
		}
	}
	if o.prefill() {
		if err := prefill(ctx, o, ip, addr, secret, res.verify, log, msg); err != nil {
			return nil, err
		}
	}

	var phase atomic.Int32
	stopCh := make(chan struct{})
	var stopOnce sync.Once
	var firstErr atomic.Pointer[error]
	abort := func(err error) {
		firstErr.CompareAndSwap(nil, &err)
		phase.Store(phaseStop)
		stopOnce.Do(func() { close(stopCh) })
	}
	// With --number_ios the measured phase ends when the last job has
	// done its count.
	var left atomic.Int32
	left.Store(int32(o.NumJobs))
	finished := func() {
		if left.Add(-1) == 0 {
			stopOnce.Do(func() { close(stopCh) })
		}
	}
	jobs := make([]*job, o.NumJobs)
	for i := range jobs {
		if jobs[i], err = newJob(ctx, i, o, conns[i], res.verify, &phase, uint64(nblocks), o.Seed, abort, finished); err != nil {
			return nil, err
		}
	}
	if o.Ramp == 0 {
		phase.Store(phaseMeasure)
	}
	var wg sync.WaitGroup
	res.started = time.Now()
	cpu0 := selfCPU()
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.run()
		}()
	}
	var tcpu0 cpuTimes
	tcpuOK := false
	if res.targetPID != 0 {
		tcpu0, err = procCPU(res.targetPID)
		tcpuOK = err == nil
	}
	if o.Ramp > 0 {
		select {
		case <-time.After(o.Ramp):
		case <-stopCh:
		case <-ctx.Done():
			res.interrupt = true
		}
		cpu0 = selfCPU()
		if res.targetPID != 0 {
			tcpu0, err = procCPU(res.targetPID)
			tcpuOK = err == nil
		}
	}
	m0 := mallocs()
	phase.CompareAndSwap(phaseRamp, phaseMeasure)
	measureStart, measureNanos := time.Now(), clock.Nanos()

	// The reporter: every interval, take each job's interval histograms.
	spare := make([][numOps]*Histogram, len(jobs))
	for i := range spare {
		for op := range spare[i] {
			spare[i][op] = new(Histogram)
		}
	}
	var cum [numOps]Histogram
	var tick [numOps]Histogram
	ops := activeOps(o)
	rows := 0
	last := measureStart
	collect := func(now time.Time) {
		s := sample{T: now.Sub(measureStart), Dur: now.Sub(last), Job: make([][numOps]uint64, len(jobs))}
		last = now
		for op := range tick {
			tick[op].Reset()
		}
		for ji, j := range jobs {
			for op := range numOps {
				h := j.interval[op].swap(spare[ji][op])
				s.Job[ji][op] = h.Count()
				tick[op].Merge(h)
				h.Reset()
				spare[ji][op] = h
			}
		}
		for op := range numOps {
			cum[op].Merge(&tick[op])
			s.Ops[op] = tick[op].Count()
			s.P50[op], s.P95[op], s.P99[op], s.PMax[op] = tick[op].Percentile(50), tick[op].Percentile(95), tick[op].Percentile(99), tick[op].Max()
		}
		if s.Dur <= 0 {
			return
		}
		res.samples = append(res.samples, s)
		for _, op := range ops {
			if rows%20 == 0 {
				fmt.Fprintln(table, "____optype__elapsed__ops/sec(inst)___ops/sec(cum)__p50(us)__p95(us)__p99(us)_pMax(us)")
			}
			rows++
			el := s.T.Seconds()
			fmt.Fprintf(table, "%10s %8s %14.1f %14.1f %8.1f %8.1f %8.1f %8.1f\n", opNames[op], fmtElapsed(s.T),
				float64(s.Ops[op])/s.Dur.Seconds(), float64(cum[op].Count())/el,
				us(s.P50[op]), us(s.P95[op]), us(s.P99[op]), us(s.PMax[op]))
		}
	}
	if phase.Load() == phaseMeasure && !res.interrupt {
		ticker := time.NewTicker(o.Interval)
		end := time.NewTimer(o.Runtime)
	loop:
		for {
			select {
			case now := <-ticker.C:
				collect(now)
			case <-end.C:
				break loop
			case <-stopCh:
				break loop
			case <-ctx.Done():
				res.interrupt = true
				break loop
			}
		}
		ticker.Stop()
		end.Stop()
	}
	phase.Store(phaseStop)
	stopOnce.Do(func() { close(stopCh) })
	measureEnd := time.Now()
	res.cpu = selfCPU().sub(cpu0)
	res.mallocs = mallocs() - m0
	if tcpuOK {
		if t1, err := procCPU(res.targetPID); err == nil {
			d := t1.sub(tcpu0)
			res.targetCPU = &d
		}
	}
	res.elapsed = measureEnd.Sub(measureStart)
	if measureEnd.Sub(last) > o.Interval/20 {
		collect(measureEnd)
	}
	wg.Wait()
	if o.StateFile != "" {
		if err := res.verify.save(o.StateFile, o.BS); err != nil {
			return nil, err
		}
	}
	if p := firstErr.Load(); p != nil {
		return nil, *p
	}
	res.jobs = make([][numOps]opResult, len(jobs))
	res.jobSyncs = make([]Histogram, len(jobs))
	for ji, j := range jobs {
		res.jobSyncs[ji] = j.syncLat
		res.syncs.Merge(&j.syncLat)
		for op := range numOps {
			res.jobs[ji][op].Slat = j.slat[op]
			res.jobs[ji][op].Clat = j.clat[op]
			res.jobs[ji][op].Lat = j.lat[op]
			res.ops[op].Slat.Merge(&j.slat[op])
			res.ops[op].Clat.Merge(&j.clat[op])
			res.ops[op].Lat.Merge(&j.lat[op])
		}
	}
	// The sessions publish their pools' counters on a 100 ms tick.
	time.Sleep(120 * time.Millisecond)
	res.paths = max(1, len(o.Targets))
	res.jobPaths = make([]jobPath, len(jobs))
	for ji, c := range conns {
		res.jobPaths[ji] = jobPath{failovers: c.failovers(), path: c.path(addr), maxGap: jobs[ji].maxGap}
		if jobs[ji].maxGap > 0 {
			res.jobPaths[ji].gapEnd = time.Duration(jobs[ji].gapEnd - measureNanos)
		}
		res.failovers += res.jobPaths[ji].failovers
		if c.s == nil {
			continue // a Multipath keeps its paths' sessions to itself
		}
		st := c.s.Stats()
		for _, f := range st.FRMR {
			res.frmr = addFRMR(res.frmr, f)
			res.frmrPools++
		}
		res.connLost += st.ConnectionsLost
		res.reconnects += st.Reconnects
	}
	return res, nil
}

func activeOps(o *Options) []int {
	var ops []int
	if o.reads() {
		ops = append(ops, opRead)
	}
	if o.writes() {
		ops = append(ops, opWrite)
	}
	return ops
}

func addFRMR(a, b frmr.Stats) frmr.Stats {
	a.Size += b.Size
	a.Free += b.Free
	a.InUse += b.InUse
	a.Tainted += b.Tainted
	a.Retiring += b.Retiring
	a.Outstanding += b.Outstanding
	a.Registrations += b.Registrations
	a.LocalInvalidations += b.LocalInvalidations
	a.LocalInvalidationsOK += b.LocalInvalidationsOK
	a.RemoteInvalidations += b.RemoteInvalidations
	a.BogusInvalidations += b.BogusInvalidations
	a.Taints += b.Taints
	a.Replacements += b.Replacements
	a.Deadlines += b.Deadlines
	a.LostCompletions += b.LostCompletions
	a.Rotations += b.Rotations
	a.PostFailures += b.PostFailures
	a.QPErrors += b.QPErrors
	return a
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

func fmtElapsed(d time.Duration) string {
	if d >= 10*time.Second || d%time.Second < 50*time.Millisecond || d%time.Second > 950*time.Millisecond {
		return fmt.Sprintf("%.0fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
