// Package gatewaytest is a shared store for gateway tests without Ceph:
// a Cluster holds memory volumes, and each of its clients is a
// block.Store that opens them shared and locks them as RBD's exclusive
// lock does (block.SharedOpener, block.LockBreaker): a client that holds
// a volume's lock never hands it over, another client's writes to it
// fail with block.ErrFenced, and BreakLock blocklists the holder, whose
// every later request fails with block.ErrFenced. The holder hears of
// the break at once (WatchFenced), as a librbd client's lock watch is
// told when its lock is broken.
//
//	cl := gatewaytest.NewCluster()
//	a, b := cl.Client(), cl.Client()
//	tgtA, _ := target.New(target.Config{Catalog: gateway.New(a)})
//	tgtB, _ := target.New(target.Config{Catalog: gateway.New(b)})
package gatewaytest

import (
	"fmt"
	"sync"

	"github.com/gosrp/gosrp/block"
)

// Cluster is the shared state of the clients: the volumes, who holds
// each one's lock, and who is blocklisted.
type Cluster struct {
	st block.Store

	mu          sync.Mutex
	owner       map[string]*Client
	blocklisted map[*Client]bool
	nextID      int
}

// NewCluster returns an empty cluster over a memory store.
func NewCluster() *Cluster {
	return &Cluster{st: block.NewMemStore(), owner: map[string]*Client{}, blocklisted: map[*Client]bool{}}
}

// Client returns a new client of the cluster: a store with a lock
// identity of its own.
func (cl *Cluster) Client() *Client {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.nextID++
	return &Client{cl: cl, id: cl.nextID, open: map[string]int{}}
}

// Create makes a volume of the cluster (no client holds it open).
func (cl *Cluster) Create(name string, size int64, blockSize int) error {
	v, err := cl.st.Create(name, size, blockSize)
	if err != nil {
		return err
	}
	return v.Close()
}

// Owner returns the id of the client that holds name's lock (0: none).
func (cl *Cluster) Owner(name string) int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if o := cl.owner[name]; o != nil {
		return o.id
	}
	return 0
}

// Client is one process's connection to the cluster.
type Client struct {
	cl     *Cluster
	id     int
	open   map[string]int      // handles per volume; guarded by cl.mu
	fenced func(volume string) // WatchFenced's; guarded by cl.mu
}

// WatchFenced implements gateway.FenceWatcher: f is called (not under
// any lock of the cluster's) with each volume whose lock this client
// held when another client broke it.
func (c *Client) WatchFenced(f func(volume string)) {
	c.cl.mu.Lock()
	c.fenced = f
	c.cl.mu.Unlock()
}

var (
	_ block.Store        = (*Client)(nil)
	_ block.SharedOpener = (*Client)(nil)
	_ block.LockBreaker  = (*Client)(nil)
)

// ID is the client's identity, as Cluster.Owner reports it.
func (c *Client) ID() int { return c.id }

// Create implements block.Store; the volume is opened shared.
func (c *Client) Create(name string, size int64, blockSize int) (block.Volume, error) {
	v, err := c.cl.st.Create(name, size, blockSize)
	if err != nil {
		return nil, err
	}
	return c.wrap(name, v)
}

// Open implements block.Store: a shared open.
func (c *Client) Open(name string) (block.Volume, error) { return c.OpenShared(name) }

// List implements block.Store.
func (c *Client) List() ([]block.VolumeInfo, error) { return c.cl.st.List() }

// Delete implements block.Store.
func (c *Client) Delete(name string) error { return c.cl.st.Delete(name) }

// Close implements block.Store; the cluster's volumes stay.
func (c *Client) Close() error { return nil }

// OpenShared implements block.SharedOpener.
func (c *Client) OpenShared(name string) (block.Volume, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	v, err := c.cl.st.Open(name)
	if err != nil {
		return nil, err
	}
	return c.wrap(name, v)
}

func (c *Client) wrap(name string, v block.Volume) (block.Volume, error) {
	c.cl.mu.Lock()
	c.open[name]++
	c.cl.mu.Unlock()
	return &volume{Volume: v, c: c, name: name}, nil
}

// usable fails once the client is blocklisted.
func (c *Client) usable() error {
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	if c.cl.blocklisted[c] {
		return fmt.Errorf("gatewaytest: client %d is blocklisted: %w", c.id, block.ErrFenced)
	}
	return nil
}

// AcquireLock implements block.SharedOpener.
func (c *Client) AcquireLock(name string) error {
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	switch o := c.cl.owner[name]; {
	case c.cl.blocklisted[c]:
		return fmt.Errorf("gatewaytest: client %d is blocklisted: %w", c.id, block.ErrFenced)
	case c.open[name] == 0:
		return fmt.Errorf("gatewaytest: %q is not open: %w", name, block.ErrInvalid)
	case o == c:
		return nil
	case o != nil:
		return fmt.Errorf("gatewaytest: %q is locked by client %d: %w", name, o.id, block.ErrBusy)
	}
	c.cl.owner[name] = c
	return nil
}

// BreakLock implements block.LockBreaker.
func (c *Client) BreakLock(name string) error {
	c.cl.mu.Lock()
	if c.cl.blocklisted[c] {
		c.cl.mu.Unlock()
		return fmt.Errorf("gatewaytest: client %d is blocklisted: %w", c.id, block.ErrFenced)
	}
	var tell func(string)
	if o := c.cl.owner[name]; o != nil && o != c {
		c.cl.blocklisted[o] = true
		delete(c.cl.owner, name)
		tell = o.fenced
	}
	c.cl.mu.Unlock()
	if tell != nil {
		tell(name)
	}
	return nil
}

// volume is a client's handle: requests fail with block.ErrFenced once
// the client is blocklisted, and writes while another client holds the
// lock.
type volume struct {
	block.Volume
	c    *Client
	name string
	once sync.Once
}

func (v *volume) allowed(write bool) error {
	cl := v.c.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.blocklisted[v.c] {
		return fmt.Errorf("gatewaytest: client %d is blocklisted: %w", v.c.id, block.ErrFenced)
	}
	if o := cl.owner[v.name]; write && o != nil && o != v.c {
		return fmt.Errorf("gatewaytest: %q is locked by client %d: %w", v.name, o.id, block.ErrFenced)
	}
	return nil
}

func (v *volume) ReadAt(p []byte, off int64) (int, error) {
	if err := v.allowed(false); err != nil {
		return 0, err
	}
	return v.Volume.ReadAt(p, off)
}

func (v *volume) WriteAt(p []byte, off int64) (int, error) {
	if err := v.allowed(true); err != nil {
		return 0, err
	}
	return v.Volume.WriteAt(p, off)
}

func (v *volume) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := v.allowed(true); err != nil {
		return 0, err
	}
	return v.Volume.WriteAtFUA(p, off)
}

func (v *volume) Flush() error {
	if err := v.allowed(true); err != nil {
		return err
	}
	return v.Volume.Flush()
}

func (v *volume) Discard(off, n int64) error {
	if err := v.allowed(true); err != nil {
		return err
	}
	return v.Volume.Discard(off, n)
}

func (v *volume) WriteZeroes(off, n int64) error {
	if err := v.allowed(true); err != nil {
		return err
	}
	return v.Volume.WriteZeroes(off, n)
}

// Close releases the handle; the client's last one releases its lock,
// as closing an RBD image does.
func (v *volume) Close() error {
	var err error
	v.once.Do(func() {
		err = v.Volume.Close()
		cl := v.c.cl
		cl.mu.Lock()
		defer cl.mu.Unlock()
		if v.c.open[v.name]--; v.c.open[v.name] == 0 && cl.owner[v.name] == v.c {
			delete(cl.owner, v.name)
		}
	})
	return err
}

// Allocated implements block.Allocator with the memory volume's answer.
func (v *volume) Allocated(off, n int64, yield func(off, n int64) bool) (int64, error) {
	if err := v.allowed(false); err != nil {
		return off, err
	}
	return v.Volume.(block.Allocator).Allocated(off, n, yield)
}
