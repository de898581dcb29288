// Package gatewaytest is a shared store for gateway tests without Ceph:
// a Cluster holds memory volumes, and each of its clients is a
// block.Store that opens them shared and locks them as RBD's exclusive
// lock does (block.SharedOpener, block.LockBreaker): a client that holds
// a volume's lock never hands it over, another client's writes to it
// fail with block.ErrFenced, and BreakLock blocklists the holder's
// connection for that volume, whose every later request fails with
// block.ErrFenced. Each volume a client opens has a connection of its
// own, as the rbd store's shared opens do (block.Reconnector): a break
// fences that volume only, and Reconnect gives it a new connection,
// whose writes fail until it takes the lock again. The holder hears of
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
	owner       map[string]conn
	blocklisted map[conn]bool
	nextID      int
}

// conn is one client's connection for one volume: its n-th, counting
// reconnects. The lock belongs to a connection, and a break blocklists
// one.
type conn struct {
	c    *Client
	name string
	n    int
}

// NewCluster returns an empty cluster over a memory store.
func NewCluster() *Cluster {
	return &Cluster{st: block.NewMemStore(), owner: map[string]conn{}, blocklisted: map[conn]bool{}}
}

// Blocklisted reports how many connections the lock breaks have
// blocklisted so far: what a cluster's blocklist would hold.
func (cl *Cluster) Blocklisted() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.blocklisted)
}

// Client returns a new client of the cluster: a store with a lock
// identity of its own.
func (cl *Cluster) Client() *Client {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.nextID++
	return &Client{cl: cl, id: cl.nextID, open: map[string]int{}, conns: map[string]int{}, relock: map[string]bool{}}
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
	if o, ok := cl.owner[name]; ok {
		return o.c.id
	}
	return 0
}

// Client is one process's connection to the cluster.
type Client struct {
	cl *Cluster
	id int

	// Guarded by cl.mu:
	open   map[string]int      // handles per volume
	conns  map[string]int      // the current connection's n per volume
	relock map[string]bool     // reconnected, the lock not taken since
	fenced func(volume string) // WatchFenced's
	// noReconnect: Reconnect fails (FailReconnects).
	noReconnect bool
}

// connLocked is the client's current connection for name. REQUIRES:
// cl.mu.
func (c *Client) connLocked(name string) conn { return conn{c, name, c.conns[name]} }

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
	_ block.Reconnector  = (*Client)(nil)
)

// FailReconnects makes the client's Reconnects fail (fail set), as when
// the cluster is out of its reach, or succeed again.
func (c *Client) FailReconnects(fail bool) {
	c.cl.mu.Lock()
	c.noReconnect = fail
	c.cl.mu.Unlock()
}

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

// AcquireLock implements block.SharedOpener.
func (c *Client) AcquireLock(name string) error {
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	me := c.connLocked(name)
	switch o, held := c.cl.owner[name]; {
	case c.cl.blocklisted[me]:
		return fmt.Errorf("gatewaytest: client %d's connection for %q is blocklisted: %w", c.id, name, block.ErrFenced)
	case c.open[name] == 0:
		return fmt.Errorf("gatewaytest: %q is not open: %w", name, block.ErrInvalid)
	case held && o == me:
		return nil
	case held:
		return fmt.Errorf("gatewaytest: %q is locked by client %d: %w", name, o.c.id, block.ErrBusy)
	}
	c.cl.owner[name] = me
	delete(c.relock, name)
	return nil
}

// BreakLock implements block.LockBreaker: the owner's connection for
// the volume is blocklisted. A client without the volume open breaks
// through a connection of its own, never blocklisted.
func (c *Client) BreakLock(name string) error {
	c.cl.mu.Lock()
	if c.open[name] > 0 && c.cl.blocklisted[c.connLocked(name)] {
		c.cl.mu.Unlock()
		return fmt.Errorf("gatewaytest: client %d's connection for %q is blocklisted: %w", c.id, name, block.ErrFenced)
	}
	var tell func(string)
	if o, held := c.cl.owner[name]; held && o.c != c {
		c.cl.blocklisted[o] = true
		delete(c.cl.owner, name)
		tell = o.c.fenced
	}
	c.cl.mu.Unlock()
	if tell != nil {
		tell(name)
	}
	return nil
}

// Reconnect implements block.Reconnector: the volume gets a new
// connection, which does not hold the lock (the old one's, if it still
// had it, is released as closing an image does) and refuses writes until
// AcquireLock.
func (c *Client) Reconnect(name string) error {
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	if c.open[name] == 0 {
		return fmt.Errorf("gatewaytest: %q is not open: %w", name, block.ErrInvalid)
	}
	if c.noReconnect {
		return fmt.Errorf("gatewaytest: client %d cannot reach the cluster", c.id)
	}
	if c.cl.owner[name] == c.connLocked(name) {
		delete(c.cl.owner, name)
	}
	c.conns[name]++
	c.relock[name] = true
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

// Identity is the shared volume's (target.Identifier), the same through
// every client.
func (v *volume) Identity() uint64 {
	if id, ok := v.Volume.(interface{ Identity() uint64 }); ok {
		return id.Identity()
	}
	return 0
}

func (v *volume) allowed(write bool) error {
	cl := v.c.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	me := v.c.connLocked(v.name)
	if cl.blocklisted[me] {
		return fmt.Errorf("gatewaytest: client %d's connection for %q is blocklisted: %w", v.c.id, v.name, block.ErrFenced)
	}
	if write && v.c.relock[v.name] {
		return fmt.Errorf("gatewaytest: client %d reconnected %q and has not locked it since: %w", v.c.id, v.name, block.ErrFenced)
	}
	if o, held := cl.owner[v.name]; write && held && o != me {
		return fmt.Errorf("gatewaytest: %q is locked by client %d: %w", v.name, o.c.id, block.ErrFenced)
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
		if v.c.open[v.name]--; v.c.open[v.name] > 0 {
			return
		}
		if cl.owner[v.name] == v.c.connLocked(v.name) {
			delete(cl.owner, v.name)
		}
		// The next open is a new image on a new connection.
		v.c.conns[v.name]++
		delete(v.c.relock, v.name)
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
