// Command bench measures a gosrp target's IOPS, bandwidth and latency in
// fio's vocabulary, over the asynchronous initiator API with registered
// buffers (no allocation per I/O).
//
//	go run ./bench --rw randread --bs 4k --iodepth 32 --runtime 5s   # embedded, loop wire, memory backend
//	go run ./bench --target 127.0.0.1:4420 --volume vol0 --rw randrw --verify
//
// Run 'go run ./bench --help' for every flag.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/gosrp/gosrp/internal/cli"
)

const benchLong = `bench measures IOPS, bandwidth and latency of a gosrp target the way fio
does: --rw, --bs, --iodepth, --numjobs, --runtime, --ramp, --size,
--rwmixread, --verify.

Without --target it runs a target in this process (--embedded) with a
--backend memory, pebble or file volume, on the loop wire unless --wire
says tcp or shm (then the target gets its own software NIC, as a peer
would). With --target HOST:PORT it benchmarks a running srpd.

Each of the --numjobs jobs is a goroutine with its own session (its own
connection, FRMR pool and credits, like a fio job's own file descriptor)
that keeps --iodepth requests in flight through the asynchronous Submit
API, on buffers registered once (Session.AllocBuffer): the I/O path does
not allocate. Offsets are uniform random over the region (fio's
norandommap) or sequential, each job starting at its share of the region.
Latency is from submit to completion; slat is the time inside Submit and
clat the rest.

Once a --interval it prints a table row per operation (ops/s in the
interval and cumulative, p50/p95/p99/max); at the end the totals, fio-style
IOPS and bandwidth lines, latency percentiles, CPU seconds per I/O (this
process by getrusage; the target's from /proc when it runs on this host)
and the initiator's FRMR counters. --output-format json writes fio's JSON
shape (jobs[].read.iops, bw_bytes, clat_ns.percentile, ...) instead.

--verify writes blocks carrying their LBA, a generation, a run ID and a
CRC-32C, and checks every read against the generation last written;
blocks never written by this run must read as zeros (or as an intact
block of an earlier run). Mismatches are counted and reported, and make
the exit status 1. --verify-state FILE saves what the run knew of every
block when it ended (generation acknowledged, submitted, covered by a
successful FLUSH), for a check of the volume after a target crash.

--target more than once names gateways of one shared volume (srpd
processes over one RBD image): each job then drives an
initiator.Multipath of them through MultipathVolume.Submit, which fails
over when the active gateway dies or turns standby and re-issues what
it had in flight, as a fio job through dm-multipath would see it. Its
buffers are plain memory (each path's session bounces them through
registered buffers of its own), and still nothing is allocated per I/O.
The report gives the paths, the failovers of all jobs and the longest
time between two consecutive completions of a job: what a failover cost.
--protocol srp takes a single --target.

--fsync N issues a FLUSH after every N writes and one more when a job
ends. A target restart that lost acknowledged writes fails the next FLUSH
unless --replay-buffer gives each session a replay buffer, which re-issues
them.

Exit status: 0 success, 1 failure (one line on stderr), 2 usage.`

func rootCommand(o *Options, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:     "bench",
		Short:    "measure a gosrp target in fio's terms",
		Long:     benchLong,
		SetFlags: o.register,
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("unexpected argument %q (bench takes only flags)", args[0])
			}
			return run(ctx, o, stdout, stderr)
		},
	}
}

// run checks the options, runs the benchmark and writes the reports.
func run(ctx context.Context, o *Options, stdout, stderr io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	o.applyProcs()
	out := stdout
	if o.Output != "" {
		f, err := os.Create(o.Output)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	bw := bufio.NewWriter(out)
	defer bw.Flush()
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	table := io.Writer(bw)
	if o.OutFormat == "json" {
		table = stderr
	}
	// Rows appear as they are measured.
	table = flushWriter{table}
	r, err := runBench(ctx, o, table, stderr)
	if err != nil {
		return err
	}
	if o.OutFormat == "json" {
		if err := writeJSON(bw, r); err != nil {
			return err
		}
	} else {
		writeSummary(bw, r)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if o.Plot != "" {
		f, err := os.Create(o.Plot)
		if err != nil {
			return err
		}
		if err := writePlot(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if r.verify != nil && r.verify.mismatches.Load() > 0 {
		msg := fmt.Sprintf("verify: %d of %d blocks read did not match", r.verify.mismatches.Load(), r.verify.checked.Load())
		if rs := r.verify.reasons(); len(rs) > 0 {
			msg += "; first: " + rs[0]
		}
		return fmt.Errorf("%s", msg)
	}
	return nil
}

// flushWriter flushes a bufio.Writer after every write.
type flushWriter struct{ w io.Writer }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if b, ok := f.w.(*bufio.Writer); ok && err == nil {
		err = b.Flush()
	}
	return n, err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := cli.Execute(ctx, rootCommand(defaultOptions(), os.Stdout, os.Stderr), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cliExecute is cli.Execute (a variable so tests share main's wiring).
var cliExecute = cli.Execute
