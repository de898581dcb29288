package emu

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/internal/asyncq"
	"github.com/gosrp/gosrp/transport/internal/refs"
)

// Device limits of the software NIC. They are generous but finite, so that
// consumers that forget to size queues still hit them in tests.
const (
	maxQPWR         = 16384
	maxSGE          = 32
	maxCQE          = 1 << 20
	maxFastRegPages = 1024
	maxInline       = 256
	maxMsgSize      = 64 << 20
	maxObjects      = 1 << 20
)

type device struct {
	p *Provider

	// mem guards every memory object's device state and the object table;
	// see the package doc for why data copies hold it shared.
	mem     sync.RWMutex
	objs    []*memObj // by index; nil = free slot
	freeIdx []uint32
	lastIdx uint32 // the index handed out last (Quirks.CyclicIndices)

	qpMu   sync.Mutex
	qps    map[uint32]*qp
	nextQP uint32
	nextPD uint32

	events *asyncq.Queue
	done   chan struct{}
	once   sync.Once
	// closedCtx ends with the provider (shutdown), for the waits that
	// take a context: a Connect under way ends with it.
	closedCtx context.Context
	closeCtx  context.CancelFunc
}

func newDevice(p *Provider) *device {
	d := &device{
		p:      p,
		objs:   make([]*memObj, 1, 64), // index 0 is never used
		qps:    map[uint32]*qp{},
		nextQP: 0x11,
		events: asyncq.New(256),
		done:   make(chan struct{}),
	}
	d.closedCtx, d.closeCtx = context.WithCancel(context.Background())
	return d
}

func (d *device) Attr() transport.DeviceAttr {
	caps := transport.CapFastRegMR | transport.CapMemWindow2 | transport.CapLocalInv |
		transport.CapSendWithInv | transport.CapHugePages | transport.CapSharedArenas
	return transport.DeviceAttr{
		Name:            DeviceName,
		Vendor:          d.p.prof.Vendor,
		FWVer:           "1.0",
		Caps:            caps,
		MaxQP:           1 << 16,
		MaxQPWR:         maxQPWR,
		MaxSGE:          maxSGE,
		MaxCQE:          maxCQE,
		MaxMR:           maxObjects,
		MaxMW:           maxObjects,
		MaxPD:           1 << 16,
		MaxMRSize:       1 << 40,
		MaxFastRegPages: maxFastRegPages,
		MaxInline:       maxInline,
		PageSizeCap:     uint64(transport.PageSize),
		PortMTU:         4096,
		Quirks:          d.p.quirks,
	}
}

func (d *device) AllocPD() (transport.PD, error) {
	if d.p.isClosed() {
		return nil, fmt.Errorf("emu: alloc pd: %w", transport.ErrClosed)
	}
	d.qpMu.Lock()
	d.nextPD++
	id := d.nextPD
	d.qpMu.Unlock()
	return &pd{dev: d, id: id}, nil
}

func (d *device) CreateCQ(depth int) (transport.CQ, error) {
	if depth <= 0 || depth > maxCQE {
		return nil, fmt.Errorf("emu: create cq of depth %d (max %d): %w", depth, maxCQE, transport.ErrInvalidArgument)
	}
	if d.p.isClosed() {
		return nil, fmt.Errorf("emu: create cq: %w", transport.ErrClosed)
	}
	return newCQ(d, depth), nil
}

func (d *device) NextEvent(ctx context.Context) (transport.AsyncEvent, error) {
	return d.events.Next(ctx, d.done, "emu: device events")
}

// event queues an asynchronous event; if nobody reads them the oldest are
// kept and new ones dropped, as a full async queue would.
func (d *device) event(ev transport.AsyncEvent) { d.events.Post(ev) }

// Close is a no-op: the device lives as long as its provider.
func (d *device) Close() error { return nil }

func (d *device) shutdown() {
	d.once.Do(func() { close(d.done) })
	d.closeCtx()
	d.qpMu.Lock()
	qps := slices.Collect(maps.Values(d.qps))
	d.qpMu.Unlock()
	for _, q := range qps {
		q.Close()
	}
}

// newObj installs o in the table and gives it an index and a random initial
// variant (rxe_get_next_key: never assume key 0 after allocation).
// REQUIRES: d.mem held exclusively.
func (d *device) newObjLocked(o *memObj) error {
	var idx uint32
	switch n := len(d.freeIdx); {
	case d.p.quirks.CyclicIndices && len(d.objs) < maxObjects:
		// Fresh indices first: a freed one comes back only once the
		// range is used up (rxe_pool.c's xa_alloc_cyclic).
		idx = uint32(len(d.objs))
		d.objs = append(d.objs, nil)
	case d.p.quirks.CyclicIndices && n > 0:
		// The range is used up: the free index after the last one
		// handed out, wrapping.
		best := 0
		for i, f := range d.freeIdx {
			if (f-d.lastIdx-1)%maxObjects < (d.freeIdx[best]-d.lastIdx-1)%maxObjects {
				best = i
			}
		}
		idx = d.freeIdx[best]
		d.freeIdx[best] = d.freeIdx[n-1]
		d.freeIdx = d.freeIdx[:n-1]
	case n > 0:
		// The index freed last, the harshest reuse a device may show.
		idx = d.freeIdx[n-1]
		d.freeIdx = d.freeIdx[:n-1]
	default:
		if len(d.objs) >= maxObjects {
			return fmt.Errorf("emu: %d memory objects: %w", maxObjects, transport.ErrNoMemory)
		}
		idx = uint32(len(d.objs))
		d.objs = append(d.objs, nil)
	}
	d.lastIdx = idx
	o.index = idx
	o.key = transport.MakeKey(idx, uint8(d.p.randUint32()))
	d.objs[idx] = o
	return nil
}

// obj finds the live object for a key's index. REQUIRES: d.mem held.
func (d *device) objLocked(k transport.Key) *memObj {
	i := k.Index()
	if i == 0 || int(i) >= len(d.objs) {
		return nil
	}
	return d.objs[i]
}

type pd struct {
	dev  *device
	id   uint32
	refs refs.Count // objects and QPs on the PD
}

func (pd *pd) use() error {
	if !pd.refs.Hold() {
		return fmt.Errorf("emu: pd %d: %w", pd.id, transport.ErrClosed)
	}
	return nil
}

func (pd *pd) Close() error {
	if n, _ := pd.refs.Close(); n > 0 {
		return fmt.Errorf("emu: dealloc pd %d with %d objects on it: %w", pd.id, n, transport.ErrBusy)
	}
	return nil
}
