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
	if os.Getenv("CEPH_CONF") == "" {
		t.Skip("CEPH_CONF not set: the Ceph tests are not being run")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for ip netns")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
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
	p := &pair{srpd: srpd, addrs: addrs, gws: gws}

	nic, err := emu.New(emu.Config{Wire: emu.WireTCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	m, err := initiator.DialMultipath(ctx, initiator.MultipathConfig{Config: initiator.Config{Provider: nic, Name: "host", LossTimeout: 60 * time.Second}, Addrs: addrs})
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

	const qd, blocks = 16, 256
	writeAll := func(gen uint32) error { return writeStamps(ctx, mv, qd, blocks, gen, nil) }
	if err := writeAll(1); err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan error, 1)
	go func() { inFlight <- writeAll(2) }()
	time.Sleep(20 * time.Millisecond)
	cut := time.Now()
	n.link(t, "down")
	if err := <-inFlight; err != nil {
		t.Fatalf("writes in flight at the cut: %v", err)
	}
	t.Logf("the writes in flight at the cut completed %v later, through %s", time.Since(cut).Round(time.Millisecond), mv.Path())
	if mv.Path() != addrs[1] {
		t.Fatalf("after the cut the volume is on %s, want the second gateway %s", mv.Path(), addrs[1])
	}
	if err := writeAll(3); err != nil {
		t.Fatal(err)
	}

	healed := time.Now()
	n.link(t, "up")
	// Healed, the first gateway hears it was fenced (its requests held
	// since the cut fail, or its fence watch fires) and stands by, or
	// the host's close of its handle there arrives first and closes it.
	var s0 string
	for ctx.Err() == nil {
		if s0 = p.pathState(t, gws[0]); s0 == "closed" || strings.Contains(gws[0].Log(), "state=standby") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s0 != "closed" && !strings.Contains(gws[0].Log(), "state=standby") {
		t.Fatalf("the healed gateway neither stood by nor closed the volume (%q):\n%s", s0, gws[0].Log())
	}
	t.Logf("the healed gateway stood by or closed %v after the link came back (%s)", time.Since(healed).Round(time.Millisecond), s0)
	// Whatever the first gateway still held has had its chance to land.
	time.Sleep(2 * time.Second)
	if s0, s1 := p.pathState(t, gws[0]), p.pathState(t, gws[1]); s0 == "active" || s1 != "active" {
		t.Fatalf("after the heal: first gateway %q, second %q; want the second alone active", s0, s1)
	}
	if mv.Path() != addrs[1] {
		t.Fatalf("the host moved back to %s by itself", mv.Path())
	}
	gens := make([]uint32, blocks)
	for i := range gens {
		gens[i] = 3
	}
	verifyStamps(t, ctx, mv, gens)

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
