package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
)

// Options are the parsed flags of one run.
type Options struct {
	RW        string // randread, randwrite, randrw, read, write
	BS        int64
	IODepth   int
	NumJobs   int
	Procs     int // GOMAXPROCS; procsAuto: --numjobs with --target, else the Go default
	Runtime   time.Duration
	Ramp      time.Duration
	Size      int64 // 0: the volume's size (or 1 GiB embedded)
	Offset    int64
	RWMixRead int
	Verify    bool
	Fsync     int    // FLUSH after every Fsync writes (0: never)
	ReplayBuf int64  // each job's session's initiator.Config.ReplayBuffer (0: none)
	StateFile string // --verify-state: file for the verify state at the end ("": none)
	// NumberIOs stops each job after that many I/Os of the measured
	// phase (FLUSHes count), as fio's number_ios; the run ends when every
	// job has, or at Runtime (0: no limit).
	NumberIOs  int64
	Prefill    triBool
	Seed       uint64
	OutFormat  string // normal, json
	Output     string // file for the report ("": stdout)
	Plot       string
	CPUProfile string
	// Target is the first --target (the only one, but for a multipath
	// run); Targets are all of them, in order: with more than one, each
	// job drives an initiator.Multipath of those gateways.
	Target  string
	Targets []string
	// FastFail is the Multipaths' MultipathConfig.FastFail (0: its
	// default).
	FastFail time.Duration
	// Timeout is the initiators' ConnectTimeout and LossTimeout (0:
	// theirs): how long a job waits for a target that is unreachable or
	// lost before its I/O fails, as srpc's --timeout.
	Timeout time.Duration
	Volume  string
	// Protocol and SRPTargetPort: --protocol srp benchmarks a standard
	// SRP target (its LUN --volume lunN) with the initiator's SRP mode.
	Protocol      string
	SRPTargetPort string
	proto         initiator.Protocol
	srpPort       [16]byte
	Embedded      bool
	Backend       string // memory, pebble, file
	Dir           string
	Provider      string
	Wire          string
	Profile       string
	Mechanism     frmr.Mechanism
	ProvOpts      []string
	Name          string
	SecretFile    string
	Channels      int
	TargetPID     int
	Interval      time.Duration
}

// triBool is a bool flag that remembers whether it was given.
type triBool struct{ set, v bool }

func (t *triBool) String() string {
	if !t.set {
		return "auto"
	}
	return strconv.FormatBool(t.v)
}

func (t *triBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	t.set, t.v = true, v
	return nil
}

func (t *triBool) IsBoolFlag() bool { return true }

// sizeValue is a fio-style size: a number with an optional k, m, g, t or p
// suffix (any case; "KiB", "kb" and "k" are all 1024, as with fio's
// default kb_base).
type sizeValue struct{ p *int64 }

func (s sizeValue) String() string {
	if s.p == nil || *s.p == 0 {
		return "0"
	}
	return formatFioSize(*s.p)
}

func (s sizeValue) Set(v string) error {
	n, err := parseFioSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}

func parseFioSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(t, "ib")
	t = strings.TrimSuffix(t, "b")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		case 'p':
			mult = 1 << 50
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional k, m, g or t suffix (4k, 128k, 1g)", s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 || v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return int64(v), nil
}

func formatFioSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// durationValue takes Go durations ("5s", "300ms") or, like fio, a bare
// number of seconds.
type durationValue struct{ p *time.Duration }

func (d durationValue) String() string {
	if d.p == nil {
		return "0s"
	}
	return d.p.String()
}

func (d durationValue) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 {
		*d.p = time.Duration(f * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("duration %q: want e.g. 5s, 300ms or a number of seconds", s)
	}
	*d.p = v
	return nil
}

func defaultOptions() *Options {
	return &Options{
		RW: "randread", BS: 4096, IODepth: 1, NumJobs: 1, Runtime: 5 * time.Second,
		RWMixRead: 50, OutFormat: "normal", Volume: "vol0", Backend: "memory",
		Provider: "emu", Profile: "strict", Channels: 1, Name: "gosrp-bench", Interval: time.Second,
		Procs: procsAuto,
	}
}

func (o *Options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.RW, "rw", o.RW, "I/O pattern `MODE`: randread, randwrite, randrw, read (sequential) or write (sequential)")
	fs.Var(sizeValue{&o.BS}, "bs", "block `SIZE` of every I/O, e.g. 4k, 128k (a multiple of the volume's block size)")
	fs.IntVar(&o.IODepth, "iodepth", o.IODepth, "I/Os each job keeps in flight (`N`, 1..1024)")
	fs.IntVar(&o.NumJobs, "numjobs", o.NumJobs, "`N` jobs: goroutines, each with its own session (connection) and queue of --iodepth I/Os")
	fs.Var(procsValue{&o.Procs}, "procs", "`N` threads running Go code (GOMAXPROCS); auto: --numjobs with --target (a thread per job, as fio), the Go default when embedded")
	fs.Var(durationValue{&o.Runtime}, "runtime", "measure for `DURATION` (5s, 300ms, or seconds) after the ramp")
	fs.Var(durationValue{&o.Ramp}, "ramp", "run for `DURATION` before measuring; nothing from the ramp is counted (fio's ramp_time)")
	fs.Var(sizeValue{&o.Size}, "size", "`SIZE` of the region I/O goes to, from --offset (default: the whole volume; embedded: 1g)")
	fs.Var(sizeValue{&o.Offset}, "offset", "start of the region, a `SIZE` (multiple of --bs)")
	fs.IntVar(&o.RWMixRead, "rwmixread", o.RWMixRead, "`PERCENT` of randrw I/Os that are reads")
	fs.Int64Var(&o.NumberIOs, "number_ios", 0, "stop each job after `N` I/Os of the measured phase, FLUSHes included, as fio's --number_ios; the run ends when every job has, or at --runtime (0: no limit)")
	fs.IntVar(&o.Fsync, "fsync", 0, "issue a FLUSH after every `N` writes, as fio's --fsync (0: never); a FLUSH takes one of the --iodepth slots and is reported apart, as fio's sync; each job ends with one more (fio's end_fsync), so exit status 0 says every write is durable")
	fs.Var(sizeValue{&o.ReplayBuf}, "replay-buffer", "keep a copy of each job's writes since its last FLUSH in a `SIZE` buffer and re-issue them if the target restarts and loses them (0: none; the next FLUSH fails instead)")
	fs.StringVar(&o.StateFile, "verify-state", "", "with --verify, save what the run knew of every block at its end, however it ended (generation acknowledged, submitted, covered by a FLUSH) to `FILE`, for a check of the volume afterwards")
	fs.BoolVar(&o.Verify, "verify", false, "write patterned blocks (LBA, generation, run ID, CRC-32C) and check every read; mismatches are counted, reported and make the exit status 1")
	fs.Var(&o.Prefill, "prefill", "write the whole region before the run (patterned with --verify) so reads hit data (default: true when --embedded and the workload reads)")
	fs.Func("seed", "`N` seeding the offsets and the verify run ID (default: from the clock)", func(s string) error {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return fmt.Errorf("want an unsigned integer")
		}
		o.Seed = v
		return nil
	})
	fs.StringVar(&o.OutFormat, "output-format", o.OutFormat, "report `FORMAT`: normal (table and summary) or json (fio's JSON shape; the per-second table goes to stderr)")
	fs.StringVar(&o.Output, "output", "", "write the report to `FILE` instead of stdout")
	fs.StringVar(&o.Plot, "plot", "", "draw IOPS over time and the latency distribution into an SVG `FILE`")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of this process (go tool pprof) to `FILE`; with --embedded it covers the target too")
	fs.Func("target", "benchmark a running target at `HOST:PORT` (for --wire shm: its socket path); repeat it for gateways of one shared volume (srpd over one RBD image): each job then drives a Multipath of them, failing over as srpc does", o.addTarget)
	fs.DurationVar(&o.Timeout, "timeout", 0, "give up on a lost or unreachable target after `DURATION` (0: the initiator's default, 60s)")
	fs.DurationVar(&o.FastFail, "fast-fail", 0, "with several --target: how long a path may stay down or silent before its I/O fails over, a `DURATION` (0: the initiator's default, 1s); a gateway whose address refuses connections is failed over at once")
	fs.StringVar(&o.Protocol, "protocol", "gosrp", "with --target: `PROTOCOL` gosrp, or srp for a standard SRP target (the kernel's ib_srpt, srpd's SRP personality), whose LUN n --volume names lunN")
	fs.StringVar(&o.SRPTargetPort, "srp-target-port", "", "with --protocol srp: the target port `ID`, 32 hex digits (id_ext then ioc_guid)")
	fs.StringVar(&o.Volume, "volume", o.Volume, "volume `NAME` to open on the target (embedded: the name of the volume created)")
	fs.BoolVar(&o.Embedded, "embedded", false, "run a target in this process (default when --target is not given)")
	fs.StringVar(&o.Backend, "backend", o.Backend, "embedded target's `BACKEND`: memory, pebble or file")
	fs.StringVar(&o.Dir, "dir", "", "embedded pebble or file store `DIR` (default: a temporary directory, removed afterwards)")
	fs.StringVar(&o.Provider, "provider", o.Provider, "verbs `PROVIDER`: emu (software NIC) or ibverbs (RDMA hardware; needs a build with -tags ibverbs)")
	fs.StringVar(&o.Wire, "wire", "", "emu `WIRE`: loop (one process), tcp or shm (default: loop when embedded, tcp with --target)")
	fs.StringVar(&o.Profile, "profile", o.Profile, "emu device quirk `PROFILE`: strict, ib, iwarp or rxe")
	fs.Func("mechanism", "how the initiator registers I/O buffers: `MECH` auto (FRMR where the device has it), frmr or mw (memory windows)", func(s string) error {
		for _, m := range []frmr.Mechanism{frmr.Auto, frmr.FRMR, frmr.MW} {
			if s == m.String() {
				o.Mechanism = m
				return nil
			}
		}
		return fmt.Errorf("want auto, frmr or mw")
	})
	fs.Func("provider-option", "extra provider option `KEY=VALUE` (repeatable); over ibverbs the CQs poll with busy_poll=adaptive unless one is given", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		o.ProvOpts = append(o.ProvOpts, s)
		return nil
	})
	fs.StringVar(&o.Name, "name", o.Name, "initiator `NAME` the target's ACL and secrets know")
	fs.StringVar(&o.SecretFile, "secret-file", "", "read the shared secret from `FILE` (one line)")
	fs.IntVar(&o.Channels, "channels", o.Channels, "connections (QPs) per job's session, `N`")
	fs.IntVar(&o.TargetPID, "target-pid", 0, "count the CPU time of process `PID` as the target's (default: found from the listening socket when the one --target is local; none through several)")
	fs.Var(durationValue{&o.Interval}, "interval", "print a table row every `DURATION`")
}

// addTarget is --target's flag function: each one is another path.
func (o *Options) addTarget(s string) error {
	if s == "" {
		return fmt.Errorf("empty address")
	}
	for _, t := range o.Targets {
		if t == s {
			return fmt.Errorf("%s given twice", s)
		}
	}
	o.Targets = append(o.Targets, s)
	o.Target = o.Targets[0]
	return nil
}

// multipath reports whether the run goes through several --target
// paths.
func (o *Options) multipath() bool { return len(o.Targets) > 1 }

// procsAuto is --procs auto.
const procsAuto = -1

// procsValue is the --procs flag: a thread count or auto.
type procsValue struct{ p *int }

func (v procsValue) String() string {
	if v.p == nil || *v.p == procsAuto {
		return "auto"
	}
	return strconv.Itoa(*v.p)
}

func (v procsValue) Set(s string) error {
	if s == "auto" {
		*v.p = procsAuto
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want auto or a count of at least 1")
	}
	*v.p = n
	return nil
}

// applyProcs sets GOMAXPROCS from --procs once the mode is known. An
// explicit GOMAXPROCS in the environment wins over auto.
func (o *Options) applyProcs() {
	n := o.Procs
	if n == procsAuto {
		if o.Embedded || os.Getenv("GOMAXPROCS") != "" {
			o.Procs = runtime.GOMAXPROCS(0)
			return
		}
		n = min(o.NumJobs, runtime.NumCPU())
	}
	runtime.GOMAXPROCS(n)
	o.Procs = n
}

// validate checks the options that do not need the volume.
func (o *Options) validate() error {
	switch o.RW {
	case "randread", "randwrite", "randrw", "read", "write":
	default:
		return cli.Usagef("--rw %q: want randread, randwrite, randrw, read or write", o.RW)
	}
	switch {
	case o.BS <= 0:
		return cli.Usagef("--bs must be positive")
	case o.BS > 64<<20:
		return cli.Usagef("--bs %s: at most 64m", formatFioSize(o.BS))
	case o.Verify && o.BS < minVerifyBS:
		return cli.Usagef("--verify needs --bs of at least %d bytes", minVerifyBS)
	case o.IODepth < 1 || o.IODepth > 1024:
		return cli.Usagef("--iodepth %d: want 1..1024", o.IODepth)
	case o.NumJobs < 1 || o.NumJobs > 256:
		return cli.Usagef("--numjobs %d: want 1..256", o.NumJobs)
	case o.Runtime <= 0:
		return cli.Usagef("--runtime must be positive")
	case o.Timeout < 0:
		return cli.Usagef("--timeout %s: want a duration of zero (the default) or more", o.Timeout)
	case o.FastFail < 0:
		return cli.Usagef("--fast-fail %s: want a duration of zero (the default) or more", o.FastFail)
	case o.RWMixRead < 0 || o.RWMixRead > 100:
		return cli.Usagef("--rwmixread %d: want 0..100", o.RWMixRead)
	case o.NumberIOs < 0:
		return cli.Usagef("--number_ios %d: want 0 (no limit) or a number of I/Os", o.NumberIOs)
	case o.StateFile != "" && !o.Verify:
		return cli.Usagef("--verify-state needs --verify")
	case o.ReplayBuf > math.MaxInt32:
		return cli.Usagef("--replay-buffer %s: at most 2g", formatFioSize(o.ReplayBuf))
	case o.Fsync < 0:
		return cli.Usagef("--fsync %d: want 0 (never) or a number of writes", o.Fsync)
	case o.Channels < 1 || o.Channels > 64:
		return cli.Usagef("--channels %d: want 1..64", o.Channels)
	case o.Interval < 10*time.Millisecond:
		return cli.Usagef("--interval must be at least 10ms")
	case o.Offset%o.BS != 0:
		return cli.Usagef("--offset must be a multiple of --bs")
	}
	switch o.OutFormat {
	case "normal", "json":
	default:
		return cli.Usagef("--output-format %q: want normal or json", o.OutFormat)
	}
	if o.Target != "" && o.Embedded {
		return cli.Usagef("--target and --embedded exclude each other")
	}
	if o.Target == "" {
		o.Embedded = true
	}
	var err error
	if o.proto, err = initiator.ParseProtocol(o.Protocol); err != nil {
		return cli.Usagef("--protocol %q: want gosrp or srp", o.Protocol)
	}
	if o.proto == initiator.ProtocolSRP && o.Embedded {
		return cli.Usagef("--protocol srp needs --target (the embedded target is benchmarked with gosrp's protocol)")
	}
	if o.proto == initiator.ProtocolSRP && o.multipath() {
		return cli.Usagef("--protocol srp takes one --target (a Multipath of several speaks gosrp's protocol only: it needs their path states)")
	}
	if o.SRPTargetPort != "" {
		if o.srpPort, err = initiator.ParseSRPPortID(o.SRPTargetPort); err != nil || o.proto != initiator.ProtocolSRP {
			return cli.Usagef("--srp-target-port %q: want 32 hex digits (id_ext then ioc_guid), with --protocol srp", o.SRPTargetPort)
		}
	}
	name, err := block.ParseBackend(o.Backend)
	if err != nil || name == "rbd" {
		return cli.Usagef("--backend %q: want memory, pebble or file", o.Backend)
	}
	o.Backend = name
	if o.Wire == "" {
		o.Wire = "tcp"
		if o.Embedded {
			o.Wire = "loop"
		}
	}
	if o.Provider == "emu" {
		switch o.Wire {
		case "loop", "tcp", "shm":
		default:
			return cli.Usagef("--wire %q: want loop, tcp or shm", o.Wire)
		}
		if !o.Embedded && o.Wire == "loop" {
			return cli.Usagef("--wire loop works only --embedded (both ends in one process)")
		}
	}
	if o.Volume == "" {
		return cli.Usagef("--volume must not be empty")
	}
	return nil
}

// reads and writes tell what the workload does.
func (o *Options) reads() bool  { return o.RW != "randwrite" && o.RW != "write" }
func (o *Options) writes() bool { return o.RW != "randread" && o.RW != "read" }
func (o *Options) random() bool { return strings.HasPrefix(o.RW, "rand") }

// readFraction is the share of I/Os that read.
func (o *Options) readPercent() int {
	switch o.RW {
	case "randread", "read":
		return 100
	case "randwrite", "write":
		return 0
	}
	return o.RWMixRead
}
