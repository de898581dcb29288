//go:build ceph && pacific

package block

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// RBDSupported reports whether this build can open RBD stores.
const RBDSupported = true

// Image metadata keys (rbd image-meta) where the store keeps what RBD
// itself does not: the block size the volume was created with and the
// generation List reports. An image without them (made by rbd create)
// opens with DefaultBlockSize, or 512 when its size is not a multiple.
const (
	rbdMetaBlockSize  = "gosrp.block_size"
	rbdMetaGeneration = "gosrp.generation"
)

// RBDStore is the rbd backend: a store is a pool (and namespace) of a
// Ceph cluster, a volume one RBD image, a snapshot an RBD snapshot, a
// clone an RBD clone (format 2: the snapshot can be deleted while clones
// depend on it; it waits in the snapshot trash for them). Data lives in the cluster, so CapPersistent; Flush is librbd's
// flush (rbd_flush), which writes back librbd's cache and waits for the
// OSDs' acknowledgements of everything written before it.
type RBDStore struct {
	o RBDOptions
	// The store's own client: creates, lists, deletes, snapshots and
	// the volumes opened with Open. Volumes opened shared have one each.
	*rbdClient

	// storeState.mu serializes creates, deletes, snapshots and guards
	// open. Lock order: mu before any rbdCore.mu.
	storeState[*rbdCore]
	open map[string]*rbdCore // by Name: "volume" or "volume@snapshot"

	fw fenceWatch
}

var (
	_ Store       = (*RBDStore)(nil)
	_ Snapshotter = (*RBDStore)(nil)
	_ LockBreaker = (*RBDStore)(nil)
)

// rbdCore is an open image (or snapshot), shared by its handles.
type rbdCore struct {
	sizedState
	st *RBDStore
	// io is the handle requests and lock calls run on (rbd_aio.go); img
	// a second handle of the same client for what needs no lock and
	// takes a callback: the update watch, diff-iterate, reading image
	// metadata. Swapped together by Reconnect.
	io  *rbdIO
	img *rbd.Image
	// zero is one zero block: WriteZeroes is librbd's writesame of it,
	// which librbd turns into a discard of whole objects
	// (rbd_discard_on_zeroed_write_same) without moving zero blocks.
	zero []byte

	// fenced is set once a request failed with ErrFenced: this client
	// was blocklisted (or refused by the lock's owner), and every later
	// write and flush fails too, until a Reconnect and an AcquireLock.
	fenced atomic.Bool
	// client is the image's own client when it was opened shared
	// (Reconnector), nil when it is the store's. Swapped by Reconnect
	// under st.mu and mu held exclusively.
	client *rbdClient
	// reconnected: Reconnect gave the image a new client and
	// AcquireLock has not taken the lock since, so fenced is not final.
	// Guarded by st.mu.
	reconnected bool
	// watch is the fence watch's update watch on img, once AcquireLock
	// took the lock with a watcher present (WatchFenced). Guarded by
	// st.mu and mu.
	watch *rbd.Watch
	// locked is set once AcquireLock was asked for the image's lock
	// (SharedOpener): its flushes then check that it still owns it, as
	// an Exclusive store's do.
	locked atomic.Bool

	// Guarded by mu:
	gen uint64
}

// OpenRBDStore connects to the cluster o.ConfFile describes and opens
// the pool (and namespace) as a store.
func OpenRBDStore(o RBDOptions) (Store, error) {
	s, err := openRBDStore(o)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func openRBDStore(o RBDOptions) (*RBDStore, error) {
	what := "rbd store " + o.Pool
	if o.Namespace != "" {
		what += "/" + o.Namespace
	}
	if o.Pool == "" {
		return nil, fmt.Errorf("block: rbd store: no pool given: %w", ErrInvalid)
	}
	cl, err := dialRBD(o)
	if err != nil {
		return nil, fmt.Errorf("block: %s: %w", what, err)
	}
	if o.Namespace != "" {
		ok, err := rbd.NamespaceExists(cl.ioctx, o.Namespace)
		if err == nil && !ok {
			err = fmt.Errorf("namespace does not exist (rbd namespace create %s/%s): %w", o.Pool, o.Namespace, ErrNotFound)
		}
		if err != nil {
			cl.close()
			return nil, fmt.Errorf("block: %s: %w", what, err)
		}
	}
	return &RBDStore{o: o, rbdClient: cl, storeState: newStoreState[*rbdCore](what), open: map[string]*rbdCore{}}, nil
}

// rbdClient is one client of the cluster (a rados instance: its own
// address, which is what a lock break blocklists) and the store's pool
// opened through it.
type rbdClient struct {
	conn  *rados.Conn
	ioctx *rados.IOContext
}

// dialRBD connects a new client to the cluster o names and opens o's pool
// (and namespace) through it.
func dialRBD(o RBDOptions) (*rbdClient, error) {
	user := o.User
	if user == "" {
		user = "admin"
	}
	conn, err := rados.NewConnWithUser(user)
	if err != nil {
		return nil, err
	}
	if o.ConfFile != "" {
		err = conn.ReadConfigFile(o.ConfFile)
	} else {
		err = conn.ReadDefaultConfigFile()
	}
	// A discard must leave zeros (Volume.Discard): librbd skips the
	// parts of a discard that do not cover a whole discard granule
	// unless told not to.
	// Clones are format 2: a snapshot needs no protection and can be
	// deleted while clones depend on it (it moves to the snapshot trash
	// until the last clone goes), as Snapshotter promises.
	// librbd's cache is off: with it, a write returns once it is in
	// this process's memory, so a client whose lock was just broken could
	// still acknowledge writes that can never land (they fail only at
	// the next flush); without it a write returns when the OSD has it,
	// and a fenced client's write fails at once with ESHUTDOWN.
	for _, kv := range [][2]string{{"rbd_skip_partial_discard", "false"}, {"rbd_default_clone_format", "2"}, {"rbd_cache", "false"}} {
		if err == nil {
			err = conn.SetConfigOption(kv[0], kv[1])
		}
	}
	if err == nil {
		err = conn.Connect()
	}
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("connect to the cluster (conf %q): %w", o.ConfFile, err)
	}
	ioctx, err := conn.OpenIOContext(o.Pool)
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("open pool: %w", rbdErr(err))
	}
	if o.Namespace != "" {
		ioctx.SetNamespace(o.Namespace)
	}
	return &rbdClient{conn: conn, ioctx: ioctx}, nil
}

// close releases the pool and shuts the client down.
func (cl *rbdClient) close() {
	cl.ioctx.Destroy()
	cl.conn.Shutdown()
}

// rbdErr adds the sentinel a caller acts on to an error of librados or
// librbd, which carry a negative errno (ErrorCode).
func rbdErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, rbd.ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var coded interface{ ErrorCode() int }
	if !errors.As(err, &coded) {
		return err
	}
	code := coded.ErrorCode()
	if code < 0 {
		code = -code
	}
	var sentinel error
	switch syscall.Errno(code) {
	case syscall.ENOENT:
		sentinel = ErrNotFound
	case syscall.EEXIST:
		sentinel = ErrExists
	case syscall.EBUSY, syscall.ENOTEMPTY:
		sentinel = ErrBusy
	case syscall.ESHUTDOWN, syscall.EROFS:
		// ESHUTDOWN: this client is blocklisted (its lock was
		// broken); EROFS: another client holds the exclusive lock
		// and refused to hand it over.
		sentinel = ErrFenced
	case syscall.ENOSPC, syscall.EDQUOT:
		sentinel = ErrNoSpace
	case syscall.EINVAL:
		sentinel = ErrInvalid
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// Create implements Store.
func (s *RBDStore) Create(name string, size int64, blockSize int) (Volume, error) {
	bs, err := s.lockCreate(name, size, blockSize)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := rbd.CreateImage(s.ioctx, name, uint64(size), opts); err != nil {
		return nil, fmt.Errorf("block: volume %q: create: %w", name, rbdErr(err))
	}
	return s.openNewLocked(name, bs, "create")
}

// openNewLocked opens an image just made (created or cloned), records
// its block size and generation 1 and takes the lock an Exclusive store
// wants; on failure it removes the image again. REQUIRES: s.mu.
func (s *RBDStore) openNewLocked(name string, bs int, op string) (Volume, error) {
	c, err := s.openHandles(s.ioctx, name, "")
	if err == nil {
		err = c.io.SetMetadata(rbdMetaBlockSize, strconv.Itoa(bs))
		if err == nil {
			err = c.io.SetMetadata(rbdMetaGeneration, "1")
		}
		var size uint64
		if err == nil {
			size, err = c.io.GetSize()
		}
		if err != nil {
			c.closeHandles()
		}
		c.sizedState = sizedState{coreState{nm: name, bs: bs, id: rbdIdentity(c.img, "")}, int64(size)}
		c.gen, c.zero = 1, make([]byte, bs)
	}
	if err != nil {
		_ = rbd.RemoveImage(s.ioctx, name)
		return nil, fmt.Errorf("block: volume %q: %s: %w", name, op, rbdErr(err))
	}
	if err := s.lockExclusive(c); err != nil {
		c.closeHandles()
		return nil, err
	}
	return openNamedLocked(&s.storeState, s.open, c), nil
}

// lockExclusive takes the image's exclusive lock when the store is
// Exclusive; a lock another client holds is ErrBusy (ErrFenced from
// librbd's EROFS, which says the same from the writer's side).
func (s *RBDStore) lockExclusive(c *rbdCore) error {
	if !s.o.Exclusive || c.readOnly {
		return nil
	}
	if err := c.io.LockAcquire(rbd.LockModeExclusive); err != nil {
		return fmt.Errorf("block: volume %q: take the exclusive lock (held by another client?): %w: %w", c.nm, ErrBusy, err)
	}
	return nil
}

// openImage opens an image (snap empty) or one of its snapshots,
// read-only, and reads its block size and generation.
func (s *RBDStore) openImage(ioctx *rados.IOContext, name, snap string) (*rbdCore, error) {
	nm := name
	if snap != "" {
		nm = name + "@" + snap
	}
	c, err := s.openHandles(ioctx, name, snap)
	if err != nil {
		return nil, fmt.Errorf("block: volume %q: open: %w", nm, rbdErr(err))
	}
	size, err := c.io.GetSize()
	if err != nil {
		c.closeHandles()
		return nil, fmt.Errorf("block: volume %q: open: %w", nm, rbdErr(err))
	}
	bs, gen := rbdImageMeta(c.img, int64(size))
	c.sizedState = sizedState{coreState{nm: nm, bs: bs, readOnly: snap != "", id: rbdIdentity(c.img, snap)}, int64(size) / int64(bs) * int64(bs)}
	c.gen, c.zero = gen, make([]byte, bs)
	return c, nil
}

// rbdIdentity is an image's identity (Volume.Identity): from its id,
// which the cluster gives each image it creates and every gateway reads
// alike, or 0 if the image does not tell it.
func rbdIdentity(img *rbd.Image, snap string) uint64 {
	id, err := img.GetId()
	if err != nil || id == "" {
		return 0
	}
	return volumeIdentity(id, snap, 0)
}

// openHandles opens an image's two handles (rbdCore.io and img), for a
// core to be filled in.
func (s *RBDStore) openHandles(ioctx *rados.IOContext, name, snap string) (*rbdCore, error) {
	var img *rbd.Image
	var err error
	if snap == "" {
		img, err = rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	} else {
		img, err = rbd.OpenImageReadOnly(ioctx, name, snap)
	}
	if err != nil {
		return nil, err
	}
	io, err := openRBDIO(ioctx, name, snap)
	if err != nil {
		_ = img.Close()
		return nil, err
	}
	return &rbdCore{st: s, io: io, img: img}, nil
}

// closeHandles closes both handles of a core that never served.
func (c *rbdCore) closeHandles() {
	_ = c.io.close()
	_ = c.img.Close()
}

// rbdImageMeta reads the block size and generation the store recorded;
// an image it did not create gets DefaultBlockSize (512 if its size is
// not a multiple) and generation 1.
func rbdImageMeta(img *rbd.Image, size int64) (bs int, gen uint64) {
	bs, gen = DefaultBlockSize, 1
	if size%int64(bs) != 0 {
		bs = 512
	}
	if v, err := img.GetMetadata(rbdMetaBlockSize); err == nil {
		if n, err := strconv.Atoi(v); err == nil && (n == 512 || n == 4096) {
			bs = n
		}
	}
	if v, err := img.GetMetadata(rbdMetaGeneration); err == nil {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			gen = n
		}
	}
	return bs, gen
}

// Open implements Store.
func (s *RBDStore) Open(name string) (Volume, error) { return s.openVolume(name, false) }

// openVolume returns a new handle to a volume, opening its image unless
// it is open already: through the store's client, taking the lock an
// Exclusive store wants, or for SharedOpener.OpenShared (shared set)
// through a client of its own (Reconnector) and without the lock.
func (s *RBDStore) openVolume(name string, shared bool) (Volume, error) {
	if err := s.lock("open " + name); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if c := s.open[name]; c != nil {
		return openNamedLocked(&s.storeState, s.open, c), nil
	}
	if err := checkName("volume", name); err != nil {
		return nil, err
	}
	if shared {
		return s.openSharedLocked(name)
	}
	c, err := s.openImage(s.ioctx, name, "")
	if err != nil {
		return nil, err
	}
	if err := s.lockExclusive(c); err != nil {
		c.closeHandles()
		return nil, err
	}
	return openNamedLocked(&s.storeState, s.open, c), nil
}

// List implements Store: every image of the pool (namespace), each opened
// read-only for its size and the recorded block size.
func (s *RBDStore) List() ([]VolumeInfo, error) {
	if err := s.lock("list"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	names, err := rbd.GetImageNames(s.ioctx)
	if err != nil {
		return nil, fmt.Errorf("block: %s: list: %w", s.what, rbdErr(err))
	}
	out := []VolumeInfo{}
	for _, name := range names {
		img, err := rbd.OpenImageReadOnly(s.ioctx, name, rbd.NoSnapshot)
		if errors.Is(err, rbd.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("block: %s: list: volume %q: %w", s.what, name, rbdErr(err))
		}
		size, err := img.GetSize()
		if err != nil {
			_ = img.Close()
			return nil, fmt.Errorf("block: %s: list: volume %q: %w", s.what, name, rbdErr(err))
		}
		bs, gen := rbdImageMeta(img, int64(size))
		var created time.Time
		if ts, err := img.GetCreateTimestamp(); err == nil {
			created = time.Unix(ts.Sec, ts.Nsec)
		}
		id := rbdIdentity(img, "")
		_ = img.Close()
		out = append(out, VolumeInfo{Name: name, Size: int64(size) / int64(bs) * int64(bs), BlockSize: bs, Created: created, Generation: gen,
			Identity: id})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete implements Store: the image's snapshots go first (a snapshot
// that has clones keeps the volume: ErrBusy), then the image; an image
// another client has open is ErrBusy too (librbd refuses it: EBUSY).
func (s *RBDStore) Delete(name string) error { return s.delete(name, false) }

// DeleteIfNoSnapshots implements Snapshotter. Another gateway may take a
// snapshot between this store's look and the removal; librbd's removal
// then refuses (ENOTEMPTY), and the image is kept rather than trashed.
func (s *RBDStore) DeleteIfNoSnapshots(name string) error { return s.delete(name, true) }

// delete is Delete, refusing an image that has user snapshots if alone.
func (s *RBDStore) delete(name string, alone bool) error {
	if err := s.lock("delete " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := checkName("volume", name); err != nil {
		return err
	}
	if s.open[name] != nil || s.snapOpenLocked(name) {
		return fmt.Errorf("block: volume %q: delete: %w", name, ErrBusy)
	}
	img, err := rbd.OpenImage(s.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return fmt.Errorf("block: volume %q: delete: %w", name, rbdErr(err))
	}
	snaps, err := userSnaps(img)
	if err == nil && alone && len(snaps) > 0 {
		err = fmt.Errorf("%d snapshots: %w", len(snaps), ErrHasSnapshots)
	}
	for i := 0; err == nil && i < len(snaps); i++ {
		err = removeSnap(img.GetSnapshot(snaps[i].Name))
	}
	if cerr := img.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rbd.RemoveImage(s.ioctx, name)
		busy := errors.Is(rbdErr(err), ErrBusy)
		if busy && alone {
			// A snapshot another gateway took since the look above
			// must not go to the trash with the image.
			if has, serr := s.hasUserSnaps(name); serr != nil || has {
				busy = false
				if has {
					err = ErrHasSnapshots
				}
			}
		}
		if busy && !s.watchedByOthers(name) {
			// Snapshots that clones still depend on are in the
			// snapshot trash and keep the image: it goes to the RBD
			// trash instead, out of List and its name free, until
			// rbd trash purge removes it after its last clone.
			err = s.trashImage(name)
		}
	}
	if err != nil {
		return fmt.Errorf("block: volume %q: delete: %w", name, rbdErr(err))
	}
	return nil
}

// hasUserSnaps reports whether the image has user snapshots.
func (s *RBDStore) hasUserSnaps(name string) (bool, error) {
	img, err := rbd.OpenImageReadOnly(s.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return false, err
	}
	defer img.Close()
	snaps, err := userSnaps(img)
	return len(snaps) > 0, err
}

// watchedByOthers reports whether another client has the image open.
func (s *RBDStore) watchedByOthers(name string) bool {
	img, err := rbd.OpenImageReadOnly(s.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return true
	}
	defer img.Close()
	ws, err := img.ListWatchers()
	return err != nil || len(ws) > 0
}

// trashImage moves an image to the RBD trash.
func (s *RBDStore) trashImage(name string) error {
	img, err := rbd.OpenImage(s.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return err
	}
	defer img.Close()
	return img.Trash(0)
}

// snapOpenLocked reports whether a snapshot of volume is open.
// REQUIRES: s.mu.
func (s *RBDStore) snapOpenLocked(volume string) bool {
	for _, c := range s.open {
		if c.readOnly && len(c.nm) > len(volume) && c.nm[:len(volume)+1] == volume+"@" {
			return true
		}
	}
	return false
}

// removeSnap unprotects (refused with EBUSY while clones depend on it)
// and removes a snapshot.
func removeSnap(sn *rbd.Snapshot) error {
	if prot, err := sn.IsProtected(); err != nil {
		return err
	} else if prot {
		if err := sn.Unprotect(); err != nil {
			return err
		}
	}
	return sn.Remove()
}

// Close implements Store: open handles then fail with ErrClosed, their
// images are closed (which flushes librbd's cache and releases the
// exclusive lock) and the cluster connection shut down.
func (s *RBDStore) Close() error {
	s.fw.halt()
	if err := s.lock("close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	err := closeAllLocked(s.open)
	s.close()
	return err
}

// BreakLock implements LockBreaker.
func (s *RBDStore) BreakLock(name string) error {
	if err := s.lock("break lock " + name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	var img interface {
		LockGetOwners() ([]*rbd.LockOwner, error)
		LockIsExclusiveOwner() (bool, error)
		LockBreak(rbd.LockMode, string) error
	}
	if c := s.open[name]; c != nil {
		img = c.io // the handle that may hold the lock
	} else {
		if err := checkName("volume", name); err != nil {
			return err
		}
		tmp, err := rbd.OpenImage(s.ioctx, name, rbd.NoSnapshot)
		if err != nil {
			return fmt.Errorf("block: volume %q: break lock: %w", name, rbdErr(err))
		}
		defer tmp.Close()
		img = tmp
	}
	owners, err := img.LockGetOwners()
	if err != nil {
		return fmt.Errorf("block: volume %q: break lock: %w", name, rbdErr(err))
	}
	if mine, err := img.LockIsExclusiveOwner(); err == nil && mine {
		return nil
	}
	for _, o := range owners {
		if err := img.LockBreak(o.Mode, o.Owner); err != nil && !errors.Is(rbdErr(err), ErrNotFound) {
			return fmt.Errorf("block: volume %q: break the lock of %s: %w", name, o.Owner, rbdErr(err))
		}
	}
	return nil
}
