package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// writeSummary prints the pebble-style totals and the fio-style summary.
func writeSummary(w io.Writer, r *result) {
	o := r.o
	el := r.elapsed.Seconds()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "_elapsed___ops(total)_ops/sec(cum)__avg(us)__p50(us)__p95(us)__p99(us)_pMax(us)__optype")
	for _, op := range activeOps(o) {
		h := &r.ops[op].Lat
		fmt.Fprintf(w, "%8s %12d %12.1f %8.1f %8.1f %8.1f %8.1f %8.1f  %s\n", fmtElapsed(r.elapsed), h.Count(),
			float64(h.Count())/el, h.Mean()/1e3, us(h.Percentile(50)), us(h.Percentile(95)), us(h.Percentile(99)), us(h.Max()), opNames[op])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "bench: rw=%s bs=%s iodepth=%d numjobs=%d procs=%d size=%s runtime=%s ramp=%s target=%s volume=%s provider=%s wire=%s profile=%s mechanism=%s\n",
		o.RW, formatFioSize(o.BS), o.IODepth, o.NumJobs, o.Procs, formatFioSize(o.Size), o.Runtime, o.Ramp, r.target, o.Volume, o.Provider, o.Wire, o.Profile, o.Mechanism)
	if bp, ok := o.providerOptions()["busy_poll"]; ok {
		// How the CQ waiters wait decides QD1 latency and CPU per I/O.
		fmt.Fprintf(w, "  poll : busy_poll=%s\n", bp)
	}
	if r.interrupt {
		fmt.Fprintln(w, "  (interrupted: figures cover the time measured)")
	}
	for _, op := range activeOps(o) {
		h := &r.ops[op].Lat
		n := h.Count()
		bytes := float64(n) * float64(o.BS)
		fmt.Fprintf(w, "  %-5s: IOPS=%s, BW=%.1fMiB/s (%.1fMB/s)(%s/%dmsec)\n", opNames[op], fioCount(float64(n)/el),
			bytes/el/(1<<20), bytes/el/1e6, fioBytes(bytes), r.elapsed.Milliseconds())
		fmt.Fprintf(w, "    lat (usec): min=%.1f, avg=%.1f, stdev=%.1f, p50=%.1f, p99=%.1f, p99.9=%.1f, max=%.1f\n",
			us(h.Min()), h.Mean()/1e3, h.StdDev()/1e3, us(h.Percentile(50)), us(h.Percentile(99)), us(h.Percentile(99.9)), us(h.Max()))
		s, c := &r.ops[op].Slat, &r.ops[op].Clat
		fmt.Fprintf(w, "    slat avg=%.1fus, clat avg=%.1fus p99=%.1fus\n", s.Mean()/1e3, c.Mean()/1e3, us(c.Percentile(99)))
	}
	if h := &r.syncs; o.Fsync > 0 && o.writes() {
		fmt.Fprintf(w, "  sync : %d flushes (%.1f/s), one per %d writes; lat (usec): p50=%.1f, p99=%.1f, max=%.1f\n",
			h.Count(), float64(h.Count())/el, o.Fsync, us(h.Percentile(50)), us(h.Percentile(99)), us(h.Max()))
	}
	ios := r.totalIOs()
	perIO := func(d time.Duration) string {
		if ios == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fus/IO", float64(d.Nanoseconds())/float64(ios)/1e3)
	}
	fmt.Fprintf(w, "  cpu  : bench usr=%.2fs sys=%.2fs = %s, %.0f kIOPS per busy core",
		r.cpu.User.Seconds(), r.cpu.Sys.Seconds(), perIO(r.cpu.Total()), kiopsPerCore(ios, r.cpu.Total()))
	switch {
	case r.o.Embedded:
		fmt.Fprintf(w, " (initiator and target in this process)\n")
	case r.targetCPU != nil:
		fmt.Fprintf(w, "\n         target (pid %d) usr=%.2fs sys=%.2fs = %s; both: %s, %.0f kIOPS per busy core\n", r.targetPID,
			r.targetCPU.User.Seconds(), r.targetCPU.Sys.Seconds(), perIO(r.targetCPU.Total()),
			perIO(r.cpu.Total()+r.targetCPU.Total()), kiopsPerCore(ios, r.cpu.Total()+r.targetCPU.Total()))
	default:
		fmt.Fprintf(w, "\n         target: not local (or not found; see --target-pid)\n")
	}
	if ios > 0 {
		fmt.Fprintf(w, "  mem  : %.3f heap allocations per I/O (whole process, incl. the per-interval report)\n", float64(r.mallocs)/float64(ios))
	}
	fmt.Fprintf(w, "  paths: %d, failovers=%d", r.paths, r.failovers)
	if len(r.jobPaths) > 0 {
		j := r.gapJob()
		p := r.jobPaths[j]
		fmt.Fprintf(w, ", longest completion gap %.1fms (job %d, ended at %s)", float64(p.maxGap)/1e6, j, fmtElapsed(p.gapEnd))
	}
	fmt.Fprintln(w)
	if o.multipath() {
		fmt.Fprintf(w, "  frmr, conn: not reported through a Multipath (its paths' sessions keep them)\n")
	} else {
		writeFRMR(w, r)
	}
	if v := r.verify; v != nil {
		fmt.Fprintf(w, "  verify: %d blocks checked (%d zero, %d of an earlier run), %d mismatches\n",
			v.checked.Load(), v.zero.Load(), v.prior.Load(), v.mismatches.Load())
		for _, s := range v.reasons() {
			fmt.Fprintf(w, "    mismatch: %s\n", s)
		}
	}
}

// writeFRMR prints the sessions' FRMR pool and connection counters.
func writeFRMR(w io.Writer, r *result) {
	f := r.frmr
	fmt.Fprintf(w, "  frmr : pools=%d mrs=%d registrations=%d remote-inv=%d local-inv=%d (ok %d) bogus-inv=%d taints=%d replacements=%d rotations=%d post-failures=%d qp-errors=%d lost-completions=%d deadlines=%d\n",
		r.frmrPools, f.Size, f.Registrations, f.RemoteInvalidations, f.LocalInvalidations, f.LocalInvalidationsOK,
		f.BogusInvalidations, f.Taints, f.Replacements, f.Rotations, f.PostFailures, f.QPErrors, f.LostCompletions, f.Deadlines)
	fmt.Fprintf(w, "  conn : connections-lost=%d reconnects=%d\n", r.connLost, r.reconnects)
}

func kiopsPerCore(ios uint64, cpu time.Duration) float64 {
	if cpu <= 0 {
		return 0
	}
	return float64(ios) / cpu.Seconds() / 1e3
}

// fioCount formats a rate the way fio does: 950, 12.3k, 1.2M.
func fioCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func fioBytes(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2fGiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", b/(1<<20))
	}
	return fmt.Sprintf("%.0fKiB", b/(1<<10))
}

// fio's JSON output shape (fio --output-format=json), the fields tools
// read; gosrp's own figures are under "gosrp".
type fioOutput struct {
	FioVersion    string            `json:"fio version"`
	Timestamp     int64             `json:"timestamp"`
	TimestampMS   int64             `json:"timestamp_ms"`
	Time          string            `json:"time"`
	GlobalOptions map[string]string `json:"global options"`
	Jobs          []fioJob          `json:"jobs"`
	Gosrp         gosrpJSON         `json:"gosrp"`
}

type fioJob struct {
	JobName    string             `json:"jobname"`
	GroupID    int                `json:"groupid"`
	Error      int                `json:"error"`
	Eta        int                `json:"eta"`
	Elapsed    int64              `json:"elapsed"`
	JobOptions map[string]string  `json:"job options"`
	Read       fioIO              `json:"read"`
	Write      fioIO              `json:"write"`
	Trim       fioIO              `json:"trim"`
	Sync       fioSync            `json:"sync"`
	JobRuntime int64              `json:"job_runtime"`
	UsrCPU     float64            `json:"usr_cpu"`
	SysCPU     float64            `json:"sys_cpu"`
	Ctx        uint64             `json:"ctx"`
	Majf       uint64             `json:"majf"`
	Minf       uint64             `json:"minf"`
	LatencyNS  map[string]float64 `json:"latency_ns"`
	LatencyUS  map[string]float64 `json:"latency_us"`
	LatencyMS  map[string]float64 `json:"latency_ms"`
}

type fioIO struct {
	IOBytes     int64   `json:"io_bytes"`
	IOKBytes    int64   `json:"io_kbytes"`
	BWBytes     int64   `json:"bw_bytes"`
	BW          int64   `json:"bw"`
	IOPS        float64 `json:"iops"`
	Runtime     int64   `json:"runtime"`
	TotalIOs    uint64  `json:"total_ios"`
	ShortIOs    uint64  `json:"short_ios"`
	DropIOs     uint64  `json:"drop_ios"`
	SlatNS      fioLat  `json:"slat_ns"`
	ClatNS      fioLat  `json:"clat_ns"`
	LatNS       fioLat  `json:"lat_ns"`
	BWMin       int64   `json:"bw_min"`
	BWMax       int64   `json:"bw_max"`
	BWAgg       float64 `json:"bw_agg"`
	BWMean      float64 `json:"bw_mean"`
	BWDev       float64 `json:"bw_dev"`
	BWSamples   int     `json:"bw_samples"`
	IOPSMin     int64   `json:"iops_min"`
	IOPSMax     int64   `json:"iops_max"`
	IOPSMean    float64 `json:"iops_mean"`
	IOPSStddev  float64 `json:"iops_stddev"`
	IOPSSamples int     `json:"iops_samples"`
}

// fioSync is fio's sync section: the FLUSHes --fsync issued.
type fioSync struct {
	TotalIOs uint64 `json:"total_ios"`
	LatNS    fioLat `json:"lat_ns"`
}

type fioLat struct {
	Min        int64            `json:"min"`
	Max        int64            `json:"max"`
	Mean       float64          `json:"mean"`
	Stddev     float64          `json:"stddev"`
	N          uint64           `json:"N"`
	Percentile map[string]int64 `json:"percentile,omitempty"`
}

type gosrpJSON struct {
	Target        string   `json:"target"`
	Provider      string   `json:"provider"`
	Wire          string   `json:"wire"`
	Profile       string   `json:"profile"`
	Elapsed       float64  `json:"elapsed_s"`
	IOPS          float64  `json:"iops"`
	BWBytes       float64  `json:"bw_bytes"`
	CPUUser       float64  `json:"cpu_user_s"`
	CPUSys        float64  `json:"cpu_sys_s"`
	CPUPerIONS    float64  `json:"cpu_ns_per_io"`
	TargetPID     int      `json:"target_pid,omitempty"`
	TargetCPU     *float64 `json:"target_cpu_s,omitempty"`
	TargetPerIONS *float64 `json:"target_cpu_ns_per_io,omitempty"`
	Embedded      bool     `json:"embedded"`
	FRMR          frmrJSON `json:"frmr"`
	// ConnectionsLost and Reconnects sum the sessions' counters.
	ConnectionsLost uint64      `json:"connections_lost"`
	Reconnects      uint64      `json:"reconnects"`
	Verify          *verifyJSON `json:"verify,omitempty"`
	Interrupted     bool        `json:"interrupted,omitempty"`
	AllocsPerIO     float64     `json:"allocs_per_io"`
	// Paths counts the --target paths (1: one target, or embedded);
	// with more than one, each job drives an initiator.Multipath of
	// them, and the FRMR and connection counters above stay zero (its
	// paths' sessions keep them).
	Paths int `json:"paths"`
	// Failovers sums the jobs' MultipathVolume.Failovers.
	Failovers int `json:"failovers"`
	// MaxCompletionGapNS is the longest time, in nanoseconds, between
	// two consecutive completions of one job, the later one in the
	// measured phase: what a failover (or a target restart) cost.
	MaxCompletionGapNS int64 `json:"max_completion_gap_ns"`
	// JobPaths are the same per job, in the order of jobs.
	JobPaths []jobPathJSON `json:"job_paths"`
}

// jobPathJSON is what one job saw of its paths.
type jobPathJSON struct {
	// Path is the address its I/O went to at the end.
	Path               string `json:"path"`
	Failovers          int    `json:"failovers"`
	MaxCompletionGapNS int64  `json:"max_completion_gap_ns"`
	// MaxCompletionGapEnd is when the gap ended, in seconds from the
	// start of measuring, to be told from the store's own stalls.
	MaxCompletionGapEnd float64 `json:"max_completion_gap_end_s"`
}

// frmrJSON are the initiator's FRMR pool counters, summed over sessions
// and channels.
type frmrJSON struct {
	Pools                int    `json:"pools"`
	MRs                  int    `json:"mrs"`
	Registrations        uint64 `json:"registrations"`
	RemoteInvalidations  uint64 `json:"remote_invalidations"`
	LocalInvalidations   uint64 `json:"local_invalidations"`
	LocalInvalidationsOK uint64 `json:"local_invalidations_ok"`
	BogusInvalidations   uint64 `json:"bogus_invalidations"`
	Taints               uint64 `json:"taints"`
	Replacements         uint64 `json:"replacements"`
	PostFailures         uint64 `json:"post_failures"`
	QPErrors             uint64 `json:"qp_errors"`
	LostCompletions      uint64 `json:"lost_completions"`
	Rotations            uint64 `json:"rotations"`
	Deadlines            uint64 `json:"deadlines"`
}

type verifyJSON struct {
	Checked    uint64   `json:"checked"`
	Zero       uint64   `json:"zero"`
	Prior      uint64   `json:"prior_run"`
	Mismatches uint64   `json:"mismatches"`
	Reasons    []string `json:"reasons,omitempty"`
}

// fioPercentiles are the percentiles fio reports by default.
var fioPercentiles = []float64{1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}

func latJSON(h *Histogram, pct bool) fioLat {
	l := fioLat{Min: h.Min(), Max: h.Max(), Mean: h.Mean(), Stddev: h.StdDev(), N: h.Count()}
	if pct && h.Count() > 0 {
		l.Percentile = make(map[string]int64, len(fioPercentiles))
		for _, q := range fioPercentiles {
			l.Percentile[strconv.FormatFloat(q, 'f', 6, 64)] = h.Percentile(q)
		}
	}
	return l
}

func meanStd(xs []float64) (mn, mx, mean, sd float64) {
	if len(xs) == 0 {
		return 0, 0, 0, 0
	}
	mn, mx = math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		mn, mx = math.Min(mn, x), math.Max(mx, x)
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	if len(xs) > 1 {
		sd = math.Sqrt(sd / float64(len(xs)-1))
	} else {
		sd = 0
	}
	return
}

func ioJSON(r *result, op int, res *opResult, samples []float64, groupBW float64) fioIO {
	n := res.Lat.Count()
	el := r.elapsed.Seconds()
	bytes := int64(n) * r.o.BS
	io := fioIO{
		IOBytes: bytes, IOKBytes: bytes >> 10, TotalIOs: n, Runtime: r.elapsed.Milliseconds(),
		SlatNS: latJSON(&res.Slat, false), ClatNS: latJSON(&res.Clat, true), LatNS: latJSON(&res.Lat, false),
	}
	if el > 0 && n > 0 {
		io.IOPS = float64(n) / el
		io.BWBytes = int64(float64(bytes) / el)
		io.BW = io.BWBytes >> 10
	}
	if n == 0 {
		io.Runtime = 0
		return io
	}
	mn, mx, mean, sd := meanStd(samples)
	io.IOPSMin, io.IOPSMax, io.IOPSMean, io.IOPSStddev, io.IOPSSamples = int64(mn), int64(mx), mean, sd, len(samples)
	kib := float64(r.o.BS) / 1024
	io.BWMin, io.BWMax, io.BWMean, io.BWDev, io.BWSamples = int64(mn*kib), int64(mx*kib), mean*kib, sd*kib, len(samples)
	if groupBW > 0 {
		io.BWAgg = 100 * float64(io.BWBytes) / groupBW
	}
	return io
}

// latencyBuckets is fio's latency_{ns,us,ms} distribution: the percentage
// of I/Os whose latency is at most each bucket bound (and above the one
// before).
func latencyBuckets(h *Histogram) (ns, usm, ms map[string]float64) {
	ns, usm, ms = map[string]float64{}, map[string]float64{}, map[string]float64{}
	bounds := []int64{2, 4, 10, 20, 50, 100, 250, 500, 750, 1000}
	type bucket struct {
		m     map[string]float64
		key   string
		upper int64
	}
	var bs []bucket
	for _, unit := range []struct {
		m     map[string]float64
		scale int64
	}{{ns, 1}, {usm, 1e3}, {ms, 1e6}} {
		for _, b := range bounds {
			bs = append(bs, bucket{unit.m, strconv.FormatInt(b, 10), b * unit.scale})
		}
	}
	bs = append(bs, bucket{ms, "2000", 2e9}, bucket{ms, ">=2000", math.MaxInt64})
	for _, b := range bs {
		b.m[b.key] = 0
	}
	total := float64(h.Count())
	if total == 0 {
		return
	}
	h.Bins(func(hi int64, c uint64) {
		for _, b := range bs {
			if hi <= b.upper {
				b.m[b.key] += 100 * float64(c) / total
				return
			}
		}
	})
	return
}

// writeJSON writes the report in fio's JSON shape: one entry per job.
func writeJSON(w io.Writer, r *result) error {
	o := r.o
	now := time.Now()
	opts := map[string]string{
		"rw": o.RW, "bs": formatFioSize(o.BS), "iodepth": strconv.Itoa(o.IODepth), "numjobs": strconv.Itoa(o.NumJobs),
		"runtime": strconv.FormatInt(o.Runtime.Milliseconds(), 10) + "ms", "ramp_time": strconv.FormatInt(o.Ramp.Milliseconds(), 10) + "ms",
		"size": formatFioSize(o.Size), "offset": formatFioSize(o.Offset), "rwmixread": strconv.Itoa(o.RWMixRead),
		"ioengine": "gosrp", "time_based": "1",
	}
	if o.Verify {
		opts["verify"] = "crc32c"
	}
	out := fioOutput{
		FioVersion: "gosrp-bench", Timestamp: now.Unix(), TimestampMS: now.UnixMilli(), Time: now.Format(time.ANSIC),
		GlobalOptions: opts,
	}
	var groupBW [numOps]float64
	for op := range numOps {
		if r.elapsed > 0 {
			groupBW[op] = float64(r.ops[op].Lat.Count()) * float64(o.BS) / r.elapsed.Seconds()
		}
	}
	cpuPct := func(d time.Duration) float64 {
		if r.elapsed <= 0 {
			return 0
		}
		return 100 * d.Seconds() / r.elapsed.Seconds()
	}
	for ji := range r.jobs {
		j := fioJob{
			JobName: fmt.Sprintf("gosrp-%s-%d", o.RW, ji), Elapsed: int64(math.Round(r.elapsed.Seconds())),
			JobOptions: map[string]string{"name": fmt.Sprintf("gosrp-%s-%d", o.RW, ji)},
			JobRuntime: r.elapsed.Milliseconds(), UsrCPU: cpuPct(r.cpu.User), SysCPU: cpuPct(r.cpu.Sys),
		}
		var samples [numOps][]float64
		for _, s := range r.samples {
			if s.Dur <= 0 || ji >= len(s.Job) {
				continue
			}
			for op := range numOps {
				samples[op] = append(samples[op], float64(s.Job[ji][op])/s.Dur.Seconds())
			}
		}
		j.Read = ioJSON(r, opRead, &r.jobs[ji][opRead], samples[opRead], groupBW[opRead])
		j.Write = ioJSON(r, opWrite, &r.jobs[ji][opWrite], samples[opWrite], groupBW[opWrite])
		j.Sync = fioSync{TotalIOs: r.jobSyncs[ji].Count(), LatNS: latJSON(&r.jobSyncs[ji], true)}
		var all Histogram
		all.Merge(&r.jobs[ji][opRead].Lat)
		all.Merge(&r.jobs[ji][opWrite].Lat)
		j.LatencyNS, j.LatencyUS, j.LatencyMS = latencyBuckets(&all)
		out.Jobs = append(out.Jobs, j)
	}
	ios := r.totalIOs()
	g := gosrpJSON{
		Target: r.target, Provider: o.Provider, Wire: o.Wire, Profile: o.Profile, Elapsed: r.elapsed.Seconds(),
		CPUUser: r.cpu.User.Seconds(), CPUSys: r.cpu.Sys.Seconds(), Embedded: o.Embedded,
		FRMR: frmrJSON{Pools: r.frmrPools, MRs: r.frmr.Size, Registrations: r.frmr.Registrations,
			RemoteInvalidations: r.frmr.RemoteInvalidations, LocalInvalidations: r.frmr.LocalInvalidations,
			LocalInvalidationsOK: r.frmr.LocalInvalidationsOK, BogusInvalidations: r.frmr.BogusInvalidations,
			Taints: r.frmr.Taints, Replacements: r.frmr.Replacements, PostFailures: r.frmr.PostFailures,
			QPErrors: r.frmr.QPErrors, LostCompletions: r.frmr.LostCompletions, Rotations: r.frmr.Rotations,
			Deadlines: r.frmr.Deadlines},
		ConnectionsLost: r.connLost, Reconnects: r.reconnects,
		Interrupted: r.interrupt, Paths: r.paths, Failovers: r.failovers,
	}
	for _, p := range r.jobPaths {
		g.MaxCompletionGapNS = max(g.MaxCompletionGapNS, p.maxGap.Nanoseconds())
		g.JobPaths = append(g.JobPaths, jobPathJSON{Path: p.path, Failovers: p.failovers, MaxCompletionGapNS: p.maxGap.Nanoseconds(),
			MaxCompletionGapEnd: p.gapEnd.Seconds()})
	}
	if r.elapsed > 0 {
		g.IOPS = float64(ios) / r.elapsed.Seconds()
		g.BWBytes = g.IOPS * float64(o.BS)
	}
	if ios > 0 {
		g.AllocsPerIO = float64(r.mallocs) / float64(ios)
		g.CPUPerIONS = float64(r.cpu.Total().Nanoseconds()) / float64(ios)
	}
	if r.targetCPU != nil {
		g.TargetPID = r.targetPID
		t := r.targetCPU.Total().Seconds()
		g.TargetCPU = &t
		if ios > 0 {
			p := float64(r.targetCPU.Total().Nanoseconds()) / float64(ios)
			g.TargetPerIONS = &p
		}
	}
	if v := r.verify; v != nil {
		g.Verify = &verifyJSON{Checked: v.checked.Load(), Zero: v.zero.Load(), Prior: v.prior.Load(),
			Mismatches: v.mismatches.Load(), Reasons: v.reasons()}
	}
	out.Gosrp = g
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
