package faults

import (
	"context"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// device wraps a device so that the CQs and QPs made on it are wrapped.
type device struct {
	transport.Device
	p *Provider

	mu  sync.Mutex
	cqs map[transport.CQ]transport.CQ // the CQ underneath → its wrapper
	qps map[uint32]*qp                // by QP number, unique on the device
}

// AllocPD allocates a protection domain whose QPs are wrapped. Memory
// objects pass through: work requests name them as they are.
func (d *device) AllocPD() (transport.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &protDomain{PD: pd, d: d}, nil
}

// CreateCQ creates a CQ whose completions pass through the QPs' faults.
func (d *device) CreateCQ(depth int) (transport.CQ, error) {
	under, err := d.Device.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	c := &cq{CQ: under, d: d}
	var w transport.CQ = c
	if n, ok := under.(transport.CQNotifier); ok {
		w = &notifyCQ{cq: c, n: n}
	}
	d.mu.Lock()
	d.cqs[under] = w
	d.mu.Unlock()
	return w, nil
}

// NextEvent returns the device's next asynchronous event, naming the
// consumer's CQ rather than the one underneath.
func (d *device) NextEvent(ctx context.Context) (transport.AsyncEvent, error) {
	ev, err := d.Device.NextEvent(ctx)
	if ev.CQ != nil {
		d.mu.Lock()
		if w := d.cqs[ev.CQ]; w != nil {
			ev.CQ = w
		}
		d.mu.Unlock()
	}
	return ev, err
}

func (d *device) qpByNum(num uint32) *qp {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.qps[num]
}

func (d *device) forget(q *qp) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.qps[q.Num()] == q {
		delete(d.qps, q.Num())
	}
}

// protDomain wraps a PD so that its QPs are wrapped.
type protDomain struct {
	transport.PD
	d *device
}

// CreateQP creates a QP on the CQs underneath the consumer's.
func (pd *protDomain) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	cfg.SendCQ, cfg.RecvCQ = unwrapCQ(cfg.SendCQ), unwrapCQ(cfg.RecvCQ)
	under, err := pd.PD.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	q := &qp{QP: under, d: pd.d, failAt: -1, errIn: -1, dropIn: -1, statusIn: -1}
	pd.d.mu.Lock()
	pd.d.qps[under.Num()] = q
	pd.d.mu.Unlock()
	return q, nil
}

func unwrapCQ(c transport.CQ) transport.CQ {
	switch w := c.(type) {
	case *cq:
		return w.CQ
	case *notifyCQ:
		return w.CQ
	}
	return c
}

func unwrapQP(q transport.QP) transport.QP {
	if w, ok := q.(*qp); ok {
		return w.QP
	}
	return q
}

// cq wraps a CQ: each completion it polls is shown to its QP's faults,
// which may drop it or change its status.
type cq struct {
	transport.CQ
	d *device
}

// Poll polls the CQ underneath and applies the faults. When every
// completion of a full batch was dropped it polls again, so that a 0 still
// means the CQ was empty and the consumer may wait.
func (c *cq) Poll(wcs []transport.WC) (int, error) {
	for {
		n, err := c.CQ.Poll(wcs)
		kept := 0
		for i := 0; i < n; i++ {
			wc := wcs[i]
			if q := c.d.qpByNum(wc.QPNum); q != nil && !q.complete(&wc) {
				continue
			}
			wcs[kept] = wc
			kept++
		}
		if kept > 0 || n < len(wcs) || err != nil {
			return kept, err
		}
	}
}

// Close closes the CQ underneath.
func (c *cq) Close() error {
	c.d.mu.Lock()
	delete(c.d.cqs, c.CQ)
	c.d.mu.Unlock()
	return c.CQ.Close()
}

// notifyCQ is a cq whose CQ underneath signals on a channel
// (transport.CQNotifier); dropped completions only make a wake-up
// spurious, which the contract allows.
type notifyCQ struct {
	*cq
	n transport.CQNotifier
}

// Notify is the channel of the CQ underneath.
func (c *notifyCQ) Notify() <-chan struct{} { return c.n.Notify() }
