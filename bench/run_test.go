package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/logsink"
)

// bench runs the program with args and returns its exit code, stdout and
// stderr.
func bench(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	// Safe for writes from several goroutines: with --output-format
	// json the table rows and the sessions' warnings both go to stderr.
	var out, errb logsink.Buffer
	code := executeForTest(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// benchJSON runs bench with args and --output-format json, fails the test
// unless it exits 0, and returns the report it printed.
func benchJSON(t *testing.T, args ...string) fioJSONReport {
	t.Helper()
	code, out, errs := bench(t, append([]string{"--output-format", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errs)
	}
	var rep fioJSONReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return rep
}

func executeForTest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cliExecute(ctx, rootCommand(defaultOptions(), stdout, stderr), args, stdout, stderr)
}

// TestEmbeddedVerify runs a short embedded benchmark of every --rw mode
// with --verify: every read is checked, and none may mismatch.
func TestEmbeddedVerify(t *testing.T) {
	for _, rw := range []string{"randread", "randwrite", "randrw", "read", "write"} {
		t.Run(rw, func(t *testing.T) {
			code, out, errs := bench(t, "--rw", rw, "--verify", "--runtime", "300ms", "--size", "8m",
				"--iodepth", "4", "--numjobs", "2", "--interval", "100ms", "--seed", "7")
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
			}
			for _, want := range []string{"ops/sec(inst)", "IOPS=", "p99.9=", "cpu  :", "frmr :", "registrations="} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if !strings.Contains(out, ", 0 mismatches") {
				t.Fatalf("verify did not report 0 mismatches:\n%s", out)
			}
			if strings.Contains(out, "verify: 0 blocks checked") && rw != "randwrite" && rw != "write" {
				t.Fatalf("no block was verified:\n%s", out)
			}
		})
	}
}

// TestEmbeddedWires runs randrw with --verify over the tcp and shm wires
// (the target on its own NIC).
func TestEmbeddedWires(t *testing.T) {
	if testing.Short() {
		t.Skip("wires are exercised in full runs")
	}
	for _, wire := range []string{"tcp", "shm"} {
		t.Run(wire, func(t *testing.T) {
			code, out, errs := bench(t, "--wire", wire, "--rw", "randrw", "--verify", "--runtime", "300ms", "--size", "4m", "--iodepth", "8")
			if code != 0 || !strings.Contains(out, ", 0 mismatches") {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
			}
		})
	}
}

// fio's JSON field names, as fio's own tools read them.
type fioJSONReport struct {
	FioVersion string `json:"fio version"`
	Jobs       []struct {
		JobName string `json:"jobname"`
		Read    struct {
			IOBytes  int64   `json:"io_bytes"`
			BWBytes  int64   `json:"bw_bytes"`
			BW       int64   `json:"bw"`
			IOPS     float64 `json:"iops"`
			Runtime  int64   `json:"runtime"`
			TotalIOs uint64  `json:"total_ios"`
			ClatNS   struct {
				Min        int64            `json:"min"`
				Max        int64            `json:"max"`
				Mean       float64          `json:"mean"`
				N          uint64           `json:"N"`
				Percentile map[string]int64 `json:"percentile"`
			} `json:"clat_ns"`
			LatNS struct {
				N uint64 `json:"N"`
			} `json:"lat_ns"`
			IOPSSamples int `json:"iops_samples"`
		} `json:"read"`
		Write struct {
			IOPS     float64 `json:"iops"`
			BWBytes  int64   `json:"bw_bytes"`
			TotalIOs uint64  `json:"total_ios"`
		} `json:"write"`
		Sync struct {
			TotalIOs uint64 `json:"total_ios"`
			LatNS    struct {
				N          uint64           `json:"N"`
				Percentile map[string]int64 `json:"percentile"`
			} `json:"lat_ns"`
		} `json:"sync"`
		UsrCPU    float64            `json:"usr_cpu"`
		LatencyUS map[string]float64 `json:"latency_us"`
	} `json:"jobs"`
	Gosrp struct {
		IOPS   float64 `json:"iops"`
		Verify *struct {
			Checked    uint64 `json:"checked"`
			Mismatches uint64 `json:"mismatches"`
		} `json:"verify"`
	} `json:"gosrp"`
}

func TestJSONOutputShape(t *testing.T) {
	dir := t.TempDir()
	plot := filepath.Join(dir, "lat.svg")
	code, out, errs := bench(t, "--output-format", "json", "--rw", "randread", "--verify", "--runtime", "300ms",
		"--size", "4m", "--iodepth", "2", "--numjobs", "2", "--interval", "100ms", "--plot", plot)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errs)
	}
	if !strings.Contains(errs, "ops/sec(inst)") {
		t.Errorf("the per-interval table should go to stderr with json output:\n%s", errs)
	}
	var rep fioJSONReport
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, out)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("trailing output after the JSON document")
	}
	if len(rep.Jobs) != 2 {
		t.Fatalf("%d jobs, want 2", len(rep.Jobs))
	}
	var sum float64
	for _, j := range rep.Jobs {
		r := j.Read
		if r.IOPS <= 0 || r.BWBytes <= 0 || r.TotalIOs == 0 || r.IOBytes != int64(r.TotalIOs)*4096 || r.Runtime <= 0 {
			t.Errorf("job %s read: %+v", j.JobName, r)
		}
		if r.BW != r.BWBytes>>10 {
			t.Errorf("bw %d KiB/s, bw_bytes %d", r.BW, r.BWBytes)
		}
		if r.ClatNS.N != r.TotalIOs || r.LatNS.N != r.TotalIOs || r.ClatNS.Min <= 0 || r.ClatNS.Max < r.ClatNS.Min {
			t.Errorf("clat_ns %+v", r.ClatNS)
		}
		p50, p99, p999 := r.ClatNS.Percentile["50.000000"], r.ClatNS.Percentile["99.000000"], r.ClatNS.Percentile["99.900000"]
		if p50 <= 0 || p99 < p50 || p999 < p99 || p999 > r.ClatNS.Max {
			t.Errorf("clat percentiles p50 %d p99 %d p99.9 %d max %d", p50, p99, p999, r.ClatNS.Max)
		}
		if j.Write.IOPS != 0 || j.Write.BWBytes != 0 {
			t.Errorf("randread job wrote: %+v", j.Write)
		}
		if len(j.LatencyUS) == 0 {
			t.Errorf("no latency_us distribution")
		}
		sum += r.IOPS
	}
	if d := rep.Gosrp.IOPS - sum; d > 1 || d < -1 {
		t.Errorf("gosrp.iops %.1f, sum of jobs %.1f", rep.Gosrp.IOPS, sum)
	}
	if v := rep.Gosrp.Verify; v == nil || v.Checked == 0 || v.Mismatches != 0 {
		t.Errorf("gosrp.verify = %+v", v)
	}
	svg, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	var polylines int
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 2 {
		t.Errorf("plot has %d lines, want 2 (IOPS over time and the percentile spectrum)", polylines)
	}
}

// TestFsync checks that --fsync issues one FLUSH per N writes to a
// pebble volume (whose FLUSH syncs its log) and reports them in fio's
// sync section, with every write still verified.
func TestFsync(t *testing.T) {
	// A count of I/Os, not a duration, so that a loaded machine cannot
	// starve the run of writes (it made 80 in 300 ms once); --runtime
	// only bounds it. Of 400 I/Os about half are writes, so one flush
	// per 10 writes gives about 18, against a tolerance of depth+1.
	const n, depth = 10, 4
	rep := benchJSON(t, "--backend", "pebble", "--dir", t.TempDir(), "--rw", "randrw",
		"--verify", "--fsync", strconv.Itoa(n), "--number_ios", "400", "--runtime", "60s", "--seed", "1",
		"--size", "4m", "--iodepth", strconv.Itoa(depth))
	j := rep.Jobs[0]
	w, s := j.Write.TotalIOs, j.Sync.TotalIOs
	// Flushes and writes completed in the measured phase may differ from
	// those submitted in it by the I/Os in flight at either end.
	if w < 10*n || s+depth+1 < w/n || s > w/n+depth+1 {
		t.Fatalf("%d writes and %d flushes, want one flush per %d writes", w, s, n)
	}
	if j.Sync.LatNS.N != s || j.Sync.LatNS.Percentile["50.000000"] <= 0 {
		t.Errorf("sync lat_ns %+v for %d flushes", j.Sync.LatNS, s)
	}
	if v := rep.Gosrp.Verify; v == nil || v.Checked == 0 || v.Mismatches != 0 {
		t.Errorf("gosrp.verify = %+v", v)
	}
}

func TestUsage(t *testing.T) {
	code, out, _ := bench(t, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, f := range []string{"--rw", "--bs", "--iodepth", "--numjobs", "--runtime", "--ramp", "--size", "--rwmixread",
		"--verify", "--fsync", "--target", "--volume", "--embedded", "--backend", "--output-format", "--plot", "--provider", "--wire", "--profile", "--mechanism", "--procs"} {
		if !strings.Contains(out, "  "+f+" ") && !strings.Contains(out, "  "+f+"\n") {
			t.Errorf("help lacks %s", f)
		}
	}
	for _, args := range [][]string{
		{"--rw", "trim"}, {"--bs", "4x"}, {"--iodepth", "0"}, {"--runtime", "soon"}, {"--output-format", "xml"},
		{"--target", "127.0.0.1:1", "--embedded"}, {"--wire", "carrier-pigeon"}, {"extra"}, {"--bogus"},
		{"--procs", "0"}, {"--procs", "many"}, {"--fsync", "-1"}, {"--mechanism", "windows"},
		{"--verify", "--size", "16k", "--iodepth", "4", "--runtime", "100ms"}, {"--bs", "6k", "--runtime", "100ms", "--size", "60k"},
		// Several --target paths: a Multipath, which speaks gosrp's
		// protocol to running gateways only.
		{"--target", "127.0.0.1:1", "--target", "127.0.0.1:2", "--protocol", "srp"},
		{"--target", "127.0.0.1:1", "--target", "127.0.0.1:2", "--embedded"},
		{"--target", "127.0.0.1:1", "--target", "127.0.0.1:1"}, {"--target", ""},
	} {
		if code, _, errs := bench(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errs)
		}
	}
	for _, targets := range [][]string{{"--target", "127.0.0.1:1"}, {"--target", "127.0.0.1:1", "--target", "127.0.0.1:2"}} {
		code, _, errs := bench(t, append(targets, "--runtime", "100ms")...)
		if code != 1 || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("unreachable %q: exit %d, stderr %q; want 1 and one line", targets, code, errs)
		}
	}
}

// TestEmbeddedVerifyOffset: with --offset, blocks are stamped with their
// place on the volume and must be checked against it; a check against
// the place in the region reported every prefilled block as misplaced.
func TestEmbeddedVerifyOffset(t *testing.T) {
	for _, rw := range []string{"randrw", "read"} {
		t.Run(rw, func(t *testing.T) {
			code, out, errs := bench(t, "--rw", rw, "--verify", "--offset", "1m", "--size", "4m", "--runtime", "300ms",
				"--iodepth", "4", "--interval", "100ms", "--seed", "7")
			if code != 0 || !strings.Contains(out, ", 0 mismatches") {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
			}
			if strings.Contains(out, "verify: 0 blocks checked") {
				t.Fatalf("no block was verified:\n%s", out)
			}
		})
	}
}

// TestNumberIOs: --number_ios ends the measured phase after that many
// I/Os per job, long before --runtime; at depth 1 the count is exact.
func TestNumberIOs(t *testing.T) {
	rep := benchJSON(t, "--rw", "randrw", "--number_ios", "50",
		"--runtime", "60s", "--size", "4m", "--iodepth", "1", "--seed", "1")
	j := rep.Jobs[0]
	if n := j.Read.TotalIOs + j.Write.TotalIOs; n != 50 {
		t.Fatalf("%d reads and %d writes measured, want 50 I/Os in all", j.Read.TotalIOs, j.Write.TotalIOs)
	}
}

// TestSizeMessages: a --bs or --size that does not fit is told as what it
// is. "--bs 1000" alone used to say "--size must be a multiple of --bs",
// naming a flag the user never gave.
func TestSizeMessages(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bs", "1000"}, "bench: --bs 1000 is not a multiple of the embedded volume's 4096-byte blocks\n"},
		{[]string{"--bs", "4k", "--size", "10k"}, "bench: --size 10k is not a multiple of --bs 4k\n"},
	} {
		code, _, errs := bench(t, append(tc.args, "--runtime", "100ms")...)
		if got, _, _ := strings.Cut(errs, "Run '"); code != 2 || got != tc.want {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestMechanism: --mechanism reaches the session. 300 reads at QD1 take
// one window through more than 254 bindings, so it is rotated: the frmr
// line counts rotations with mw and none with frmr.
func TestMechanism(t *testing.T) {
	for _, tc := range []struct{ mech, want string }{{"mw", "rotations=1 "}, {"frmr", "rotations=0 "}} {
		code, out, errs := bench(t, "--profile", "rxe", "--mechanism", tc.mech, "--rw", "randread", "--number_ios", "300",
			"--runtime", "60s", "--size", "4m", "--iodepth", "1", "--seed", "1")
		if code != 0 {
			t.Fatalf("%s: exit %d\nstderr:\n%s", tc.mech, code, errs)
		}
		if !strings.Contains(out, "mechanism="+tc.mech) || !strings.Contains(out, tc.want) {
			t.Errorf("--mechanism %s: want mechanism=%s and %q in the report:\n%s", tc.mech, tc.mech, tc.want, out)
		}
	}
}

// TestProviderOptionsPoll: over real verbs bench polls adaptively unless
// --provider-option names a busy_poll, and the report says which; the
// software NIC gets its wire and profile and no busy_poll.
func TestProviderOptionsPoll(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string // busy_poll, "" for none
	}{
		{Options{Provider: "ibverbs"}, "adaptive"},
		{Options{Provider: "ibverbs", ProvOpts: []string{"busy_poll = 50us"}}, "50us"},
		{Options{Provider: "emu", Wire: "tcp", Profile: "rxe"}, ""},
	} {
		got := tc.o.providerOptions()
		if got["busy_poll"] != tc.want {
			t.Errorf("%s %v: busy_poll %q, want %q", tc.o.Provider, tc.o.ProvOpts, got["busy_poll"], tc.want)
		}
		if tc.o.Provider == "emu" && (got["wire"] != "tcp" || got["profile"] != "rxe") {
			t.Errorf("emu: options %v, want its wire and profile", got)
		}
	}
}
