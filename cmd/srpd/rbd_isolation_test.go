//go:build ceph && pacific

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/e2etest"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestRBDIsolatedGateway: the active gateway cut off from the network
// while it is alive, then healed. The first srpd runs in a network
// namespace of its own, joined to the rest of the machine by a veth
// pair (198.18.N.0/30, the benchmarking range: nothing leaves the
// machine); a micro cluster of its own listens on the root end, where
// the second srpd runs. With writes in flight through the first, its
// link goes down: the host fails over to the second, which breaks the
// first's lock, and writes newer data over every block. Healed, the
// first finds its client blocklisted, reconnects and stands by (or has
// closed the volume, if the host's close reached it first); it does
// not take the volume back by itself (no split brain: the second stays
// active, the host stays there, every block holds the newest data), and
// takes it back only when a host asks.
//
// It needs root and ip(8), and starts its own cluster (about 15 s): it
// runs with the others when CEPH_CONF is set.
func TestRBDIsolatedGateway(t *testing.T) {
	needIsolation(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	iso := startIsolatedPair(t, ctx, initiator.Config{LossTimeout: 60 * time.Second})
	n, p, gws, addrs, nic, mv := iso.net, iso.pair, iso.gws, iso.addrs, iso.nic, iso.mv

	iso.writeAcross(t, ctx, "cut", func() { n.link(t, "down") })

	healed := time.Now()
	n.link(t, "up")
	// Healed, the first gateway hears it was fenced (its requests held
	// since the cut fail, or its fence watch fires) and stands by, or
	// the host's close of its handle there arrives first and closes it.
	iso.waitFenced(t, ctx, healed)
	if mv.Path() != addrs[1] {
		t.Fatalf("the host moved back to %s by itself", mv.Path())
	}
	iso.verifyNewest(t, ctx)

	// Failback, asked for by another host through the first gateway.
	s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addrs[0], Name: "other-host"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Open(ctx, "vol0", initiator.OpenOptions{Takeover: true})
	if err != nil {
		t.Fatalf("failback through the healed gateway: %v", err)
	}
	t.Cleanup(func() { v.Close() })
	if s0 := p.pathState(t, gws[0]); s0 != "active" {
		t.Fatalf("after the failback the first gateway is %q", s0)
	}
	buf := make([]byte, 4096)
	if _, err := v.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := checkStamp(buf, 0, 3); err != nil {
		t.Fatalf("read through the first gateway after the failback: %v", err)
	}
}

// TestRBDWedgedGateway: the active gateway's storage hangs while the
// gateway itself answers. The first srpd runs in a network namespace
// (as in TestRBDIsolatedGateway) whose veth end then drops every packet
// it sends but those from srpd's own port: the host's connections and
// pings are answered, while librbd's requests to the monitor and the
// OSD vanish, so every write the gateway accepted hangs in its cluster
// client, as on a gateway whose network to the cluster failed or whose
// client wedged. The host's I/O timeout (1 s) ends the connection; its
// reconnect waits while the gateway retires the old connection, whose
// volume calls never end (the target's reinstatement), so the path
// counts as lost after FastFail and the I/O fails over to the second
// gateway, which fences the first (its lock broken, its client
// blocklisted); newer data goes over every block. Healed, whatever the
// first gateway still held (requests in its TCP retransmit queues since
// the wedge) reaches the OSD and must be refused there: every block
// keeps the newest data.
func TestRBDWedgedGateway(t *testing.T) {
	needIsolation(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft(8)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// FastFail and Keepalive at their defaults (1 s): pings are
	// answered, so only the I/O timeout finds the wedge.
	iso := startIsolatedPair(t, ctx, initiator.Config{IOTimeout: time.Second, LossTimeout: 60 * time.Second})
	n, gws := iso.net, iso.gws
	_, port0, _ := net.SplitHostPort(iso.addrs[0])
	defer func() {
		// Deferred, so that a Fatal inside the helpers prints it too.
		if t.Failed() {
			t.Logf("the first gateway's log:\n%s", gws[0].Log())
		}
	}()

	defer n.unwedge(t)
	iso.writeAcross(t, ctx, "wedge", func() { n.wedge(t, port0) })

	healed := time.Now()
	n.unwedge(t)
	iso.waitFenced(t, ctx, healed)
	iso.verifyNewest(t, ctx)
}

// needIsolation skips a test of a gateway in a network namespace where
// it cannot run: no cluster under test, not root, no ip(8).
func needIsolation(t *testing.T) {
	t.Helper()
	if os.Getenv("CEPH_CONF") == "" {
		t.Skip("CEPH_CONF not set: the Ceph tests are not being run")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for ip netns")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8)")
	}
}

// isolatedPair is two gateways of vol0 on a micro cluster of their
// own: the first in a network namespace (net), the second beside the
// cluster on the root end, and a host's multipath volume opened on the
// first.
type isolatedPair struct {
	net   *isoNet
	pair  *pair
	gws   []*e2etest.Daemon
	addrs []string
	nic   *emu.Provider
	mv    *initiator.MultipathVolume
}

// startIsolatedPair starts an isolatedPair, the host's sessions
// configured by cfg (its Provider and Name are set here; FastFail and
// Keepalive stay at their defaults).
func startIsolatedPair(t *testing.T, ctx context.Context, cfg initiator.Config) *isolatedPair {
	t.Helper()
	n := isolatedNet(t)
	t.Setenv("CEPH_CONF", microCluster(t, n.root))
	_, srpd, args := rbdGatewaySetup(t)
	dir := t.TempDir()
	inNS := filepath.Join(dir, "srpd-in-ns")
	if err := os.WriteFile(inNS, fmt.Appendf(nil, "#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", n.ns, srpd), 0o755); err != nil {
		t.Fatal(err)
	}
	port := func() string { _, p, _ := net.SplitHostPort(e2etest.FreeAddr(t)); return p }
	addrs := []string{net.JoinHostPort(n.inside, port()), net.JoinHostPort(n.root, port())}
	gws := []*e2etest.Daemon{
		e2etest.StartDaemon(t, inNS, filepath.Join(dir, "gw0"), addrs[0], "", args...),
		e2etest.StartDaemon(t, srpd, filepath.Join(dir, "gw1"), addrs[1], "", args...),
	}
	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	cfg.Provider, cfg.Name = nic, "host"
	m, err := initiator.DialMultipath(ctx, initiator.MultipathConfig{Config: cfg, Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	mv, err := m.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mv.Close() })
	if mv.Path() != addrs[0] {
		t.Fatalf("the volume opened on %s, want the first gateway %s", mv.Path(), addrs[0])
	}
	return &isolatedPair{net: n, pair: &pair{srpd: srpd, addrs: addrs, gws: gws}, gws: gws, addrs: addrs, nic: nic, mv: mv}
}

// isolationBlocks is how many blocks the isolation tests stamp, at
// queue depth 16.
const isolationBlocks = 256

// writeAcross stamps generation 1 over every block through the first
// gateway, then generation 2 with fault (named what) made 20 ms into
// it; the writes must all complete, through the second gateway, which
// then takes generation 3 over every block. Generation 2 is written
// over and over until a pass has begun after the fault was made: a
// single pass (256 blocks at QD16) could end before the fault, which
// takes several ip(8) and nft(8) runs, was in place, and then nothing
// failed over.
func (iso *isolatedPair) writeAcross(t *testing.T, ctx context.Context, what string, fault func()) {
	t.Helper()
	mv := iso.mv
	writeAll := func(gen uint32) error { return writeStamps(ctx, mv, 16, isolationBlocks, gen, nil) }
	if err := writeAll(1); err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan error, 1)
	var faulted atomic.Bool
	go func() {
		for {
			after := faulted.Load()
			if err := writeAll(2); err != nil || after {
				inFlight <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	at := time.Now()
	fault()
	faulted.Store(true)
	if err := <-inFlight; err != nil {
		t.Fatalf("writes in flight at the %s: %v", what, err)
	}
	t.Logf("the writes in flight at the %s completed %v later, through %s (%d failovers)", what, time.Since(at).Round(time.Millisecond), mv.Path(), mv.Failovers())
	if mv.Path() != iso.addrs[1] {
		t.Fatalf("after the %s the volume is on %s, want the second gateway %s", what, mv.Path(), iso.addrs[1])
	}
	if err := writeAll(3); err != nil {
		t.Fatal(err)
	}
}

// verifyNewest checks that every block holds generation 3, the newest.
func (iso *isolatedPair) verifyNewest(t *testing.T, ctx context.Context) {
	t.Helper()
	gens := make([]uint32, isolationBlocks)
	for i := range gens {
		gens[i] = 3
	}
	verifyStamps(t, ctx, iso.mv, gens)
}

// waitFenced waits, after the first gateway was healed at healed, for
// it to stand by (it heard it was fenced) or close the volume (the
// host's close reached it first), gives what it still held 2 s to land,
// and checks that the second gateway alone is active.
func (iso *isolatedPair) waitFenced(t *testing.T, ctx context.Context, healed time.Time) {
	t.Helper()
	gw0 := iso.gws[0]
	for ctx.Err() == nil {
		if s0 := iso.pair.pathState(t, gw0); s0 == "closed" || strings.Contains(gw0.Log(), "state=standby") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s0 := iso.pair.pathState(t, gw0); s0 != "closed" && !strings.Contains(gw0.Log(), "state=standby") {
		t.Fatalf("the healed gateway neither stood by nor closed the volume (%q):\n%s", s0, gw0.Log())
	}
	t.Logf("the healed gateway stood by or closed %v after the heal", time.Since(healed).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	if s0, s1 := iso.pair.pathState(t, gw0), iso.pair.pathState(t, iso.gws[1]); s0 == "active" || s1 != "active" {
		t.Fatalf("after the heal: first gateway %q, second %q; want the second alone active", s0, s1)
	}
}

// isoNet is a network namespace joined to the root one by a veth pair.
type isoNet struct {
	ns           string // the namespace's name
	dev          string // the veth end inside it
	root, inside string // the two ends' addresses
}

// isolatedNet makes a namespace and its veth pair, removed at the end
// of the test.
func isolatedNet(t *testing.T) *isoNet {
	t.Helper()
	id := os.Getpid() % 100000
	octet := os.Getpid() % 256
	n := &isoNet{ns: fmt.Sprintf("gosrp-iso-%d", id), dev: fmt.Sprintf("gsi%dn", id),
		root: fmt.Sprintf("198.18.%d.1", octet), inside: fmt.Sprintf("198.18.%d.2", octet)}
	rootDev := fmt.Sprintf("gsi%dr", id)
	ipCmd(t, "netns", "add", n.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", n.ns).Run() }) // takes the veth pair with it
	ipCmd(t, "link", "add", rootDev, "type", "veth", "peer", "name", n.dev, "netns", n.ns)
	ipCmd(t, "addr", "add", n.root+"/30", "dev", rootDev)
	ipCmd(t, "link", "set", rootDev, "up")
	ipCmd(t, "-n", n.ns, "addr", "add", n.inside+"/30", "dev", n.dev)
	ipCmd(t, "-n", n.ns, "link", "set", n.dev, "up")
	ipCmd(t, "-n", n.ns, "link", "set", "lo", "up")
	return n
}

// link sets the namespace's end of the pair up or down.
func (n *isoNet) link(t *testing.T, state string) {
	t.Helper()
	ipCmd(t, "-n", n.ns, "link", "set", n.dev, state)
}

// wedge drops every TCP segment the namespace sends out of its veth
// end but those from port port (the gateway's own): its answers to
// hosts go out, its cluster client's requests do not. An nftables
// output rule (nft(8)): the machine's kernel has nf_tables but neither
// tc's prio qdisc nor its drop action.
func (n *isoNet) wedge(t *testing.T, port string) {
	t.Helper()
	nft := func(args ...string) { ipCmd(t, append([]string{"netns", "exec", n.ns, "nft"}, args...)...) }
	nft("add", "table", "ip", "gosrpwedge")
	nft("add", "chain", "ip", "gosrpwedge", "out", "{", "type", "filter", "hook", "output", "priority", "0", ";", "}")
	nft("add", "rule", "ip", "gosrpwedge", "out", "oifname", n.dev, "tcp", "sport", "!=", port, "drop")
}

// unwedge lets all the namespace's packets out again; a second call
// does nothing.
func (n *isoNet) unwedge(t *testing.T) {
	t.Helper()
	_ = exec.Command("ip", "netns", "exec", n.ns, "nft", "delete", "table", "ip", "gosrpwedge").Run()
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// microCluster starts a micro cluster listening on addr
// (test/ceph/cluster.sh with CEPH_ADDR), stopped at the end of the test,
// and returns its ceph.conf.
func microCluster(t *testing.T, addr string) string {
	t.Helper()
	dir := t.TempDir()
	script, err := filepath.Abs("../../test/ceph/cluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = append(os.Environ(), "CEPH_ADDR="+addr)
	t.Cleanup(func() { _ = exec.Command("bash", script, "stop", dir).Run() })
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cluster.sh start: %v: %s", err, out)
	}
	return filepath.Join(dir, "ceph.conf")
}
