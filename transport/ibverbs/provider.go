//go:build linux && cgo && ibverbs

package ibverbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gosrp/gosrp/transport"
)

// Name is the registry name of this provider.
const Name = "ibverbs"

func init() {
	transport.Register(Name, func(o transport.Options) (transport.Provider, error) { return New(o) })
}

// Provider is the libibverbs/librdmacm provider. It is safe for concurrent
// use.
type Provider struct {
	rnrRetry   int           // rdma_conn_param.rnr_retry_count
	retry      int           // rdma_conn_param.retry_count
	ackTimeout int           // the QPs' local ACK timeout; 0: the device's default
	busyPoll   time.Duration // CQ.Wait polls this long before it arms the CQ
	// adaptive: CQ.Wait polls for a budget from its CQ's recent waits
	// instead (busy_poll=adaptive), at least busyPoll.
	adaptive bool

	mu      sync.Mutex
	closed  bool
	devices map[string]*Device
	cm      *cmChannel // created on first Listen or Resolve
}

var _ transport.Provider = (*Provider)(nil)

// RxeAckTimeout is the local ACK timeout of QPs on rxe unless the
// ack_timeout option says otherwise: 2^19 × 4.096 µs, about 2.1 s, where
// rdma_cm would give about 0.5 s. rxe runs on the host's CPUs, where a
// busy or virtual machine delays an ACK past half a second now and then
// (one retry in about 69,000 packets in the TCG test VM), and a retry on
// rxe is costly: it executes the local operations behind the retried
// request again (transport.Quirks.RetryRepeatsLocalOps), which the
// initiator must fence its registrations against
// (frmr.Config.FenceRegistrations), and it stalls the queue for the
// timeout. A dead peer is
// noticed later (eight tries: about 17 s, not 4 s); connections that
// must notice sooner keep their own keepalive, as the initiator does.
const RxeAckTimeout = 19

// DefaultBusyPoll is how long CQ.Wait polls the CQ before it arms it and
// sleeps, unless the busy_poll option says otherwise. It is sized for a
// machine whose cores serve storage: long enough to cover an I/O's round
// trip on a hardware RNIC (a few µs to tens of µs) and a memory-backed
// target's turnaround, so that a busy queue is drained without a system
// call, short enough that an idle connection stops spinning at once.
const DefaultBusyPoll = 50 * time.Microsecond

// AdaptiveBusyPollMax is the longest poll of busy_poll=adaptive: waits
// that last longer (an idle connection, a slow peer) are slept through
// after DefaultBusyPoll. It covers a 4 KiB round trip over rxe in a
// TCG guest (450-520 µs polled, docs/performance.md) twice.
const AdaptiveBusyPollMax = 2 * time.Millisecond

// New returns a provider. It does not open any device; Devices lists them.
// Options (all optional):
//
//	rnr_retry=N  receiver-not-ready retries, 0..7, 7 = forever (default 6:
//	             a peer without a posted receive fails the SEND with
//	             RNR_RETRY_EXC_ERR instead of stalling it)
//	retry=N      transport retries, 0..7 (default 7)
//	ack_timeout=N  the local ACK timeout, IBA's exponent 1..31: a request
//	             unanswered for 4.096 µs × 2^N is sent again (default:
//	             what rdma_cm computes, about 0.5 s on RoCE; on rxe
//	             RxeAckTimeout)
//	busy_poll=D  how long CQ.Wait polls the CQ before it arms it and sleeps
//	             on the completion channel, a Go duration (default 50µs,
//	             DefaultBusyPoll; 0 arms at once). Polling costs a core
//	             while it lasts; arming and sleeping cost three system
//	             calls and a wake-up (see the package doc, Waiting).
//	             adaptive: each CQ polls for twice its recent waits,
//	             between DefaultBusyPoll and AdaptiveBusyPollMax, so that
//	             a QD1 stream is met polling and an idle one sleeps.
func New(opts transport.Options) (*Provider, error) {
	p := &Provider{devices: map[string]*Device{}, rnrRetry: 6, retry: 7, busyPoll: DefaultBusyPoll}
	for k, v := range opts {
		if k == "busy_poll" && v == "adaptive" {
			p.busyPoll, p.adaptive = DefaultBusyPoll, true
			continue
		}
		if k == "busy_poll" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > time.Second {
				return nil, fmt.Errorf("ibverbs: option busy_poll=%q: want a duration from 0 to 1s, or adaptive: %w", v, transport.ErrInvalidArgument)
			}
			p.busyPoll, p.adaptive = d, false
			continue
		}
		n, err := strconv.Atoi(v)
		if k == "ack_timeout" {
			if err != nil || n < 1 || n > 31 {
				return nil, fmt.Errorf("ibverbs: option ack_timeout=%q: want 1..31: %w", v, transport.ErrInvalidArgument)
			}
			p.ackTimeout = n
			continue
		}
		switch {
		case k != "rnr_retry" && k != "retry":
			return nil, fmt.Errorf("ibverbs: unknown option %q (have rnr_retry, retry, ack_timeout, busy_poll): %w", k, transport.ErrInvalidArgument)
		case err != nil || n < 0 || n > 7:
			return nil, fmt.Errorf("ibverbs: option %s=%q: want 0..7: %w", k, v, transport.ErrInvalidArgument)
		case k == "rnr_retry":
			p.rnrRetry = n
		default:
			p.retry = n
		}
	}
	return p, nil
}

// Name is "ibverbs".
func (p *Provider) Name() string { return Name }

// Devices lists the RDMA devices ibv_get_device_list reports.
func (p *Provider) Devices() ([]string, error) {
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		// ENOSYS: no kernel verbs support at all; that is "no devices".
		return nil, nil
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		names = append(names, C.GoString(C.ibv_get_device_name(d)))
	}
	sort.Strings(names)
	return names, nil
}

// OpenDevice opens the named device ("" is the first one) or returns the
// already-open Device of that name.
func (p *Provider) OpenDevice(name string) (transport.Device, error) {
	d, err := p.openDevice(name)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (p *Provider) openDevice(name string) (*Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("ibverbs: open device %q: %w", name, transport.ErrClosed)
	}
	if name != "" {
		if d := p.devices[name]; d != nil {
			return d, nil
		}
	}
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil || n == 0 {
		if list != nil {
			C.ibv_free_device_list(list)
		}
		return nil, fmt.Errorf("ibverbs: no RDMA device (ibv_get_device_list is empty): %w", transport.ErrNotFound)
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	var pick *C.struct_ibv_device
	names := make([]string, 0, len(devs))
	for _, dv := range devs {
		dn := C.GoString(C.ibv_get_device_name(dv))
		names = append(names, dn)
		if pick == nil && (name == "" || dn == name) {
			pick = dv
			name = dn
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("ibverbs: no device %q (have %v): %w", name, names, transport.ErrNotFound)
	}
	if d := p.devices[name]; d != nil {
		return d, nil
	}
	d, err := openDevice(p, pick, name)
	if err != nil {
		return nil, err
	}
	p.devices[name] = d
	return d, nil
}

// forgetDevice drops a closed device so a later OpenDevice reopens it.
func (p *Provider) forgetDevice(d *Device) {
	p.mu.Lock()
	if p.devices[d.name] == d {
		delete(p.devices, d.name)
	}
	p.mu.Unlock()
}

// cmChan returns the provider's rdma_cm event channel, creating it and its
// dispatcher goroutine on first use.
func (p *Provider) cmChan() (*cmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("ibverbs: %w", transport.ErrClosed)
	}
	if p.cm == nil {
		cm, err := newCMChannel(p)
		if err != nil {
			return nil, err
		}
		p.cm = cm
	}
	return p.cm, nil
}

// Close tears down every connection, listener and device of the provider.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	cm := p.cm
	p.cm = nil
	devs := slices.Collect(maps.Values(p.devices))
	p.devices = map[string]*Device{}
	p.mu.Unlock()
	if cm != nil {
		cm.close()
	}
	var first error
	for _, d := range devs {
		if err := d.forceClose(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// defaultListenIP is the address Listen("") binds: $GOSRP_IBVERBS_ADDR if
// set, else the first IPv4 address of a netdev that carries an RDMA device
// (its GID table names the netdev), so that the provider can reach itself.
func defaultListenIP() (string, error) {
	if a := strings.TrimSpace(os.Getenv("GOSRP_IBVERBS_ADDR")); a != "" {
		if h, _, err := net.SplitHostPort(a); err == nil {
			return h, nil
		}
		return a, nil
	}
	var netdevs []string
	seen := map[string]bool{}
	add := func(n string) {
		n = strings.TrimSpace(n)
		if n != "" && !seen[n] {
			seen[n] = true
			netdevs = append(netdevs, n)
		}
	}
	files, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*")
	sort.Strings(files)
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			add(string(b))
		}
	}
	parents, _ := filepath.Glob("/sys/class/infiniband/*/parent")
	for _, f := range parents {
		if b, err := os.ReadFile(f); err == nil {
			add(string(b))
		}
	}
	for _, n := range netdevs {
		ifc, err := net.InterfaceByName(n)
		if err != nil {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("ibverbs: no IPv4 address on a netdev with an RDMA device (set GOSRP_IBVERBS_ADDR): %w", transport.ErrNotFound)
}

// Listen binds and listens on addr (host:port); "" picks defaultListenIP
// with port 0.
func (p *Provider) Listen(ctx context.Context, addr string) (transport.Listener, error) {
	if addr == "" {
		ip, err := defaultListenIP()
		if err != nil {
			return nil, err
		}
		addr = net.JoinHostPort(ip, "0")
	}
	cm, err := p.cmChan()
	if err != nil {
		return nil, err
	}
	return cm.listen(ctx, addr)
}

// Resolve resolves addr to a device and route and returns an endpoint on
// it.
func (p *Provider) Resolve(ctx context.Context, addr string) (transport.Endpoint, error) {
	cm, err := p.cmChan()
	if err != nil {
		return nil, err
	}
	return cm.resolve(ctx, addr)
}
