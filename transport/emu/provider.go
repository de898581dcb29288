package emu

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// DeviceName is the name of the one device a software NIC has.
const DeviceName = "emu0"

// Provider is a software NIC: one device, its connection manager and its
// fault injector.
type Provider struct {
	cfg    Config
	prof   Profile
	quirks transport.Quirks
	log    *slog.Logger
	// pressure is the CPU pressure gauge the readers consult, nil unless
	// Config.PollPressure.
	pressure *pressureGauge
	dev      *device

	rngMu sync.Mutex
	rng   *rand.Rand

	mu     sync.Mutex
	closed bool
	// owned are the listeners and links Close ends; each leaves the set
	// when it ends on its own, so that a long-lived NIC does not keep
	// every connection it ever had.
	owned map[io.Closer]struct{}

	counters counters
}

// New creates a software NIC.
func New(cfg Config) (*Provider, error) {
	prof, err := LookupProfile(cfg.Profile)
	if err != nil {
		return nil, err
	}
	switch cfg.Wire {
	case "":
		cfg.Wire = WireLoop
	case WireLoop, WireTCP, WireShm:
	default:
		return nil, fmt.Errorf("emu: unknown wire %q (have %v): %w", cfg.Wire, Wires(), transport.ErrNotFound)
	}
	switch cfg.ShmPoll {
	case "":
		cfg.ShmPoll = ShmPollAdaptive
	case ShmPollAdaptive, ShmPollEager:
	default:
		return nil, fmt.Errorf("emu: unknown shm-poll %q (have %s, %s): %w", cfg.ShmPoll, ShmPollAdaptive, ShmPollEager, transport.ErrInvalidArgument)
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	stream := cfg.Wire != WireLoop
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = 20 * time.Millisecond
		if stream {
			// A frame on a stream wire is never lost, only late: the
			// peer is another goroutine or process that may be
			// descheduled, or busy copying a large frame, on a loaded
			// machine. 3 × 100 ms still ended healthy connections with
			// RETRY_EXC_ERR under -race beside a VM (the conformance
			// suite's Write/Large and Send/PollWhilePosting, load 10-20
			// on 2 cores), so a stream wire waits as long as IB's
			// largest common setting allows: 7 retries (retry_cnt's
			// maximum) of 250 ms, 2 s in all. A dead peer is seen
			// sooner anyway: its socket closes.
			cfg.RetryTimeout = 250 * time.Millisecond
		}
	}
	if cfg.RetryCount <= 0 {
		cfg.RetryCount = 3
		if stream {
			cfg.RetryCount = 7
		}
	}
	if cfg.RNRTimeout <= 0 {
		cfg.RNRTimeout = time.Millisecond
	}
	if cfg.RNRRetry <= 0 {
		cfg.RNRRetry = 6 // as the ibverbs provider's rnr_retry
	}
	if cfg.Faults.Delay > 0 && cfg.Faults.MaxDelay <= 0 {
		cfg.Faults.MaxDelay = time.Millisecond
	}
	p := &Provider{
		cfg:    cfg,
		prof:   prof,
		quirks: prof.Quirks,
		log:    cfg.Logger,
		owned:  map[io.Closer]struct{}{},
		rng:    rand.New(rand.NewPCG(uint64(cfg.Seed), 0x9e3779b97f4a7c15)),
	}
	if cfg.PollPressure {
		p.pressure = cpuPressure
	}
	if cfg.Quirks != nil {
		p.quirks = *cfg.Quirks
	}
	if p.quirks.LocalOpErrStatus == transport.StatusSuccess {
		p.quirks.LocalOpErrStatus = transport.StatusMWBindErr
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.log = p.log.With("nic", "emu", "profile", prof.Name, "wire", cfg.Wire)
	p.dev = newDevice(p)
	return p, nil
}

// Name is "emu".
func (p *Provider) Name() string { return "emu" }

// Seed is the seed of the provider's random source; a failing test prints
// it so the run can be repeated.
func (p *Provider) Seed() int64 { return p.cfg.Seed }

// Profile is the quirk profile the NIC was created with.
func (p *Provider) Profile() Profile { return p.prof }

// Devices lists the single device.
func (p *Provider) Devices() ([]string, error) { return []string{DeviceName}, nil }

// OpenDevice returns the NIC's device.
func (p *Provider) OpenDevice(name string) (transport.Device, error) {
	if name != "" && name != DeviceName {
		return nil, fmt.Errorf("emu: device %q: %w", name, transport.ErrNotFound)
	}
	if p.isClosed() {
		return nil, fmt.Errorf("emu: open device: %w", transport.ErrClosed)
	}
	return p.dev, nil
}

func (p *Provider) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close tears down every listener, connection and QP of the NIC.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	owned := p.owned
	p.owned = nil
	p.mu.Unlock()
	for o := range owned {
		o.Close()
	}
	p.dev.shutdown()
	return nil
}

// own makes Close end c; after Close it refuses, and c is the caller's
// to end.
func (p *Provider) own(c io.Closer) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("emu: %w", transport.ErrClosed)
	}
	p.owned[c] = struct{}{}
	return nil
}

// disown forgets c, which has ended.
func (p *Provider) disown(c io.Closer) {
	p.mu.Lock()
	delete(p.owned, c)
	p.mu.Unlock()
}

// chance reports true with probability f, from the seeded source.
func (p *Provider) chance(f float64) bool {
	if f <= 0 {
		return false
	}
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return p.rng.Float64() < f
}

func (p *Provider) randUint32() uint32 {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return p.rng.Uint32()
}

func (p *Provider) randDuration(max time.Duration) time.Duration {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return time.Duration(p.rng.Int64N(int64(max) + 1))
}

// Listen starts accepting connections on addr.
func (p *Provider) Listen(ctx context.Context, addr string) (transport.Listener, error) {
	if p.isClosed() {
		return nil, fmt.Errorf("emu: listen: %w", transport.ErrClosed)
	}
	switch p.cfg.Wire {
	case WireTCP:
		return p.listenTCP(ctx, addr)
	case WireShm:
		return p.listenShm(ctx, addr)
	}
	return p.listenLoop(addr)
}

// Resolve returns an endpoint on the NIC's device for addr.
func (p *Provider) Resolve(ctx context.Context, addr string) (transport.Endpoint, error) {
	if p.isClosed() {
		return nil, fmt.Errorf("emu: resolve: %w", transport.ErrClosed)
	}
	if addr == "" {
		return nil, fmt.Errorf("emu: resolve empty address: %w", transport.ErrInvalidArgument)
	}
	return &endpoint{p: p, addr: addr, offer: transport.ReadCredit{Out: maxReadCredit, In: maxReadCredit}}, nil
}

// counters are the NIC's event counts; see Counters.
type counters struct {
	regOnValid, invKeyMismatch, invOnFree, accessAfterInvalidate  atomic.Uint64
	remoteAccessErrors, flushed, droppedCQEs, corruptedCQEs       atomic.Uint64
	duplicates, linkCuts, injectedQPErrors, postFailures, badFrms atomic.Uint64
	probesServed, acceptErrors, kernelOopses, replays             atomic.Uint64
	repeatedLocalOps, retries                                     atomic.Uint64
	exposedLocalOps                                               atomic.Uint64
}

// ownedCount is how many listeners and links Close would end (tests).
func (p *Provider) ownedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owned)
}
