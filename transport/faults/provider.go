package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// Provider is a provider with faults injected between its consumer and its
// queue pairs and completion queues. It is a transport.Provider, and it
// implements the fault hooks transport/transporttest looks for.
type Provider struct {
	under  transport.Provider
	cfg    Config
	random bool

	mu   sync.Mutex
	rng  *rand.Rand
	devs map[transport.Device]*device // by the device underneath
	n    Counters
	// hold, while HoldDestroys holds them, is what every QP's Close
	// waits on once the QP underneath is gone; nil otherwise.
	hold chan struct{}
}

// Counters count the faults made so far, hooks and random ones together.
type Counters struct {
	PostFails uint64 // PostSend calls cut short
	QPErrors  uint64 // QPs moved to ERR before a WR
	Drops     uint64 // completions lost
	Corrupts  uint64 // completions that reported an error instead
	LinkCuts  uint64 // connections cut
	// DestroysHeld counts the QP Closes HoldDestroys made wait, those
	// still waiting included.
	DestroysHeld uint64
}

// Counters returns the faults made so far.
func (p *Provider) Counters() Counters {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *Provider) count(f func(*Counters)) {
	p.mu.Lock()
	f(&p.n)
	p.mu.Unlock()
}

// Wrap returns p with faults injected at cfg's rates. Closing the result
// closes p.
func Wrap(p transport.Provider, cfg Config) *Provider {
	seed := uint64(cfg.Seed)
	return &Provider{
		under: p, cfg: cfg, random: cfg.random(),
		rng:  rand.New(rand.NewPCG(seed, seed^0x6661756c7473)),
		devs: map[transport.Device]*device{},
	}
}

// Unwrap returns the provider underneath.
func (p *Provider) Unwrap() transport.Provider { return p.under }

// Seed reports the seed of the random faults (transporttest.Seeder).
func (p *Provider) Seed() int64 { return p.cfg.Seed }

// Name is the name of the provider underneath, whose behaviour this one has.
func (p *Provider) Name() string { return p.under.Name() }

// Devices lists the devices of the provider underneath.
func (p *Provider) Devices() ([]string, error) { return p.under.Devices() }

// OpenDevice opens a device of the provider underneath.
func (p *Provider) OpenDevice(name string) (transport.Device, error) {
	d, err := p.under.OpenDevice(name)
	if err != nil {
		return nil, err
	}
	return p.device(d), nil
}

// Listen listens with the provider underneath.
func (p *Provider) Listen(ctx context.Context, addr string) (transport.Listener, error) {
	l, err := p.under.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: l, p: p}, nil
}

// Resolve resolves addr with the provider underneath.
func (p *Provider) Resolve(ctx context.Context, addr string) (transport.Endpoint, error) {
	e, err := p.under.Resolve(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &endpoint{Endpoint: e, p: p}, nil
}

// Close closes the provider underneath.
func (p *Provider) Close() error { return p.under.Close() }

// device returns the wrapper of d, making it on first sight: a connection
// request and an endpoint name their device, and the consumer must reach
// the same wrapper through either.
func (p *Provider) device(d transport.Device) *device {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.devs[d]
	if w == nil {
		w = &device{Device: d, p: p, cqs: map[transport.CQ]transport.CQ{}, qps: map[uint32]*qp{}}
		p.devs[d] = w
	}
	return w
}

// chance reports whether a fault of probability rate happens now.
func (p *Provider) chance(rate float64) bool {
	if rate <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64() < rate
}

// ours returns q as a QP of this provider.
func (p *Provider) ours(q transport.QP) (*qp, error) {
	w, ok := q.(*qp)
	if !ok || w.d.p != p {
		return nil, fmt.Errorf("faults: %T is not a QP of this provider: %w", q, transport.ErrInvalidArgument)
	}
	return w, nil
}

// arm sets a fault on q, one of this provider's QPs, under the QP's
// lock: the post and completion paths read it there.
func (p *Provider) arm(q transport.QP, set func(w *qp)) error {
	w, err := p.ours(q)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	set(w)
	return nil
}

// InjectPostFailure makes the next PostSend on q hand the device wrs[:atWR]
// and fail wrs[atWR] with an error wrapping transport.ErrQueueFull.
func (p *Provider) InjectPostFailure(q transport.QP, atWR int) error {
	return p.arm(q, func(w *qp) { w.failAt = atWR })
}

// InjectQPError moves q to ERR just before the afterWRs-th next send WR (0
// is the next one) is handed to the device.
func (p *Provider) InjectQPError(q transport.QP, afterWRs int) error {
	return p.arm(q, func(w *qp) { w.errIn = afterWRs })
}

// InjectDropCQE loses the nth next successful send completion of q (0 is
// the next one).
func (p *Provider) InjectDropCQE(q transport.QP, nth int) error {
	return p.arm(q, func(w *qp) { w.dropIn = nth })
}

// InjectCQEStatus makes the nth next successful send completion of q report
// s instead; q then goes to ERR and its later completions report
// WR_FLUSH_ERR, as after a real error.
func (p *Provider) InjectCQEStatus(q transport.QP, nth int, s transport.Status) error {
	return p.arm(q, func(w *qp) { w.statusIn, w.status = nth, s })
}

// CutLink disconnects the connection under q.
func (p *Provider) CutLink(q transport.QP) error {
	w, err := p.ours(q)
	if err != nil {
		return err
	}
	c := w.connection()
	if c == nil {
		return fmt.Errorf("faults: cut link: QP %d has no connection: %w", w.Num(), transport.ErrInvalidState)
	}
	p.count(func(n *Counters) { n.LinkCuts++ })
	return c.Disconnect()
}

// HoldDestroys makes every QP's Close, from now until release is called,
// wait after the QP underneath is gone: a destroy that does not return,
// as rxe's does while the QP's tasks still hold references
// (Config.DestroyLatency is the timed form). release lets the Closes this
// hold made wait return, and later ones too unless another hold came
// since; it may be called more than once.
func (p *Provider) HoldDestroys() (release func()) {
	hold := make(chan struct{})
	p.mu.Lock()
	p.hold = hold
	p.mu.Unlock()
	return sync.OnceFunc(func() {
		p.mu.Lock()
		if p.hold == hold {
			p.hold = nil
		}
		p.mu.Unlock()
		close(hold)
	})
}

// heldDestroy waits while HoldDestroys holds QP destroys.
func (p *Provider) heldDestroy() {
	p.mu.Lock()
	hold := p.hold
	if hold != nil {
		p.n.DestroysHeld++
	}
	p.mu.Unlock()
	if hold != nil {
		<-hold
	}
}
