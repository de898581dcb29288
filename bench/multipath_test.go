package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/internal/servetest"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// ioCounter counts the reads and writes the gateways' stores served
// and closes hit once there were at; who is then the gateway that
// served the at-th.
type ioCounter struct {
	n    atomic.Int64
	at   int64
	hit  chan struct{}
	who  atomic.Int32
	once sync.Once
}

func (c *ioCounter) count(gw int) {
	if c.n.Add(1) == c.at {
		c.once.Do(func() {
			c.who.Store(int32(gw))
			close(c.hit)
		})
	}
}

// countingClient is a gatewaytest client whose volumes count their
// reads and writes, as gateway gw's.
type countingClient struct {
	*gatewaytest.Client
	c  *ioCounter
	gw int
}

func (s countingClient) Open(name string) (block.Volume, error) { return s.OpenShared(name) }

func (s countingClient) OpenShared(name string) (block.Volume, error) {
	v, err := s.Client.OpenShared(name)
	if err != nil {
		return nil, err
	}
	return countingVolume{v, s.c, s.gw}, nil
}

type countingVolume struct {
	block.Volume
	c  *ioCounter
	gw int
}

func (v countingVolume) ReadAt(p []byte, off int64) (int, error) {
	n, err := v.Volume.ReadAt(p, off)
	v.c.count(v.gw)
	return n, err
}

func (v countingVolume) WriteAt(p []byte, off int64) (int, error) {
	n, err := v.Volume.WriteAt(p, off)
	v.c.count(v.gw)
	return n, err
}

// gateways serves vol0 (16 MiB) of one gatewaytest cluster from two
// targets, each on a software NIC of its own (tcp wire), as two srpd
// over one RBD image; both count their I/O in c. kill[i] closes
// gateway i's NIC: every connection goes, and its address refuses
// connections, as a killed srpd's.
func gateways(t *testing.T, c *ioCounter) (addrs []string, kill []func()) {
	t.Helper()
	cl := gatewaytest.NewCluster()
	if err := cl.Create("vol0", 16<<20, 4096); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
		if err != nil {
			t.Fatal(err)
		}
		cat := gateway.New(countingClient{cl.Client(), c, i})
		tgt, err := target.New(target.Config{Name: "gw", Catalog: cat})
		if err != nil {
			nic.Close()
			t.Fatal(err)
		}
		// As srpd does: state changes reach the sessions as path notices.
		cat.OnStateChange(func(name string, s gateway.State) { gateway.Tell(tgt, name, s) })
		addrs = append(addrs, servetest.Serve(t, tgt, nic.Listen, nic.Close))
		kill = append(kill, func() { nic.Close() })
	}
	return addrs, kill
}

// TestMultipathFailover: bench --verify through two gateways of one
// volume (--target twice), randrw at QD8 in two jobs; the active gateway
// is killed once the gateways served 1500 I/Os (of the prefill's and
// the jobs'), and the run goes on through the other. Which gateway is
// active first is the first open's (the Multipath's path order, unless
// the first path is slow to answer): the one serving the 1500th I/O is
// the one killed. The killed gateway's address refuses connections, so
// the failover does not wait for --fast-fail (10 s); a shorter one let
// a starved machine's late keepalive fail a job over before the kill. It must exit 0 with no
// mismatch, and report both paths, a failover per job (each job has a
// Multipath of its own) and each job's longest completion gap.
func TestMultipathFailover(t *testing.T) {
	c := &ioCounter{at: 1500, hit: make(chan struct{})}
	addrs, kill := gateways(t, c)
	go func() {
		<-c.hit
		kill[c.who.Load()]()
	}()
	killed := func() bool {
		select {
		case <-c.hit:
			return true
		default:
			return false
		}
	}
	code, out, errs := bench(t, "--output-format", "json", "--target", addrs[0], "--target", addrs[1], "--wire", "tcp",
		"--rw", "randrw", "--verify", "--prefill", "--size", "4m", "--bs", "4k", "--iodepth", "8", "--numjobs", "2",
		"--number_ios", "3000", "--runtime", "60s", "--seed", "3", "--fast-fail", "10s")
	if code != 0 {
		t.Fatalf("exit %d (gateway 0 killed: %v)\nstderr:\n%s", code, killed(), errs)
	}
	var rep struct {
		Gosrp gosrpJSON `json:"gosrp"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	g := rep.Gosrp
	t.Logf("paths %d, failovers %d, longest completion gap %v, allocations per I/O %.3f",
		g.Paths, g.Failovers, time.Duration(g.MaxCompletionGapNS), g.AllocsPerIO)
	if !killed() {
		t.Fatalf("the gateways served %d I/Os, the test wanted to kill the active one at %d", c.n.Load(), c.at)
	}
	other := addrs[1-c.who.Load()]
	if v := g.Verify; v == nil || v.Checked == 0 || v.Mismatches != 0 {
		t.Fatalf("gosrp.verify = %+v", v)
	}
	if g.Paths != 2 || g.Failovers != 2 || len(g.JobPaths) != 2 {
		t.Fatalf("paths %d, failovers %d, %d job_paths; want 2, 2 (one per job), 2", g.Paths, g.Failovers, len(g.JobPaths))
	}
	for i, j := range g.JobPaths {
		if j.Failovers != 1 || j.Path != other || j.MaxCompletionGapNS <= 0 || j.MaxCompletionGapNS > g.MaxCompletionGapNS ||
			j.MaxCompletionGapEnd <= 0 || j.MaxCompletionGapEnd > g.Elapsed {
			t.Errorf("job %d: %+v; want one failover, to %s, and a gap", i, j, other)
		}
	}
}

// TestMultipathReport: two paths, nothing killed: the text report says
// so, and the jobs' I/O allocates nothing: what the whole process
// allocates while measuring (the reporter, the paths' keepalive ticks),
// over 20000 I/Os, is far below one per I/O.
func TestMultipathReport(t *testing.T) {
	addrs, _ := gateways(t, &ioCounter{at: -1})
	code, out, errs := bench(t, "--target", addrs[0], "--target", addrs[1], "--wire", "tcp",
		"--rw", "randrw", "--verify", "--size", "4m", "--iodepth", "4", "--number_ios", "20000", "--runtime", "60s")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errs)
	}
	for _, want := range []string{"paths: 2, failovers=0, longest completion gap", "not reported through a Multipath", ", 0 mismatches",
		"target=" + addrs[0] + "," + addrs[1] + " "} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if raceEnabled {
		return
	}
	_, mem, _ := strings.Cut(out, "  mem  : ")
	var perIO float64
	if _, err := fmt.Sscanf(mem, "%f heap allocations per I/O", &perIO); err != nil || perIO > 0.05 {
		t.Errorf("%.3f heap allocations per I/O through a Multipath (%v), want about 0", perIO, err)
	}
}

// TestNoVolumeMessage: a --volume the target does not offer is said in
// one line, naming it and the target; it came through five nested
// layers of the target's store ("open volume ...: block: volume ...:
// open: block: not found: initiator: invalid request").
func TestNoVolumeMessage(t *testing.T) {
	addrs, _ := gateways(t, &ioCounter{at: -1, hit: make(chan struct{})})
	code, _, errs := bench(t, "--target", addrs[0], "--wire", "tcp", "--volume", "nosuch", "--runtime", "100ms")
	want := fmt.Sprintf("bench: no volume %q on %s for this initiator (srpc list shows what it may open; --volume)\n", "nosuch", addrs[0])
	if code != 1 || errs != want {
		t.Fatalf("--volume nosuch: exit %d, stderr %q; want 1, %q", code, errs, want)
	}
}
