package block

// RBDOptions tells OpenRBDStore which Ceph cluster, pool and namespace
// hold the store's volumes and how to open them.
type RBDOptions struct {
	// ConfFile is the ceph.conf to read; empty means librados's own
	// search (the CEPH_CONF environment variable, then /etc/ceph/ceph.conf).
	ConfFile string
	// User is the Ceph client name without "client." (empty: "admin").
	User string
	// Pool holds the images (required).
	Pool string
	// Namespace is an RBD namespace inside Pool (optional; it must exist:
	// rbd namespace create POOL/NAMESPACE).
	Namespace string
	// Exclusive makes every volume the store opens (Create, Open) take the
	// image's exclusive lock before it returns, and keep it: librbd's
	// managed lock in exclusive mode never hands the lock over when another
	// client asks, so another client's write fails instead of taking it.
	// Open fails with ErrBusy while another client holds the lock; only
	// LockBreaker.BreakLock takes it away, blocklisting the old owner, whose
	// next I/O fails with ErrFenced. A gateway serving an image sets it.
	Exclusive bool
}

// LockBreaker is implemented by stores whose volumes other processes can
// hold open (rbd): it takes a volume away from whoever holds it, so that
// a new owner can serve it without an old one's late writes landing after
// the new one's.
type LockBreaker interface {
	// BreakLock breaks every exclusive lock another client holds on the
	// volume and blocklists those clients on the cluster (librbd's
	// rbd_lock_break): from its return on, no I/O of theirs reaches the
	// volume, and theirs fails with ErrFenced. It is a no-op when nobody
	// else holds the lock.
	BreakLock(volume string) error
}

// SharedOpener is implemented by stores whose volumes several processes
// open at once, one of them holding the volume's exclusive lock (rbd): a
// gateway opens the volumes it exports shared, and takes a volume's lock
// only when it is to serve it, after LockBreaker.BreakLock has fenced
// the old owner if there was one.
type SharedOpener interface {
	// OpenShared opens a volume without taking its exclusive lock. Until
	// AcquireLock succeeds, its writes may fail with ErrFenced (another
	// client holds the lock and refuses to hand it over).
	OpenShared(name string) (Volume, error)
	// AcquireLock takes the exclusive lock of a volume this store has
	// open, and keeps it until the volume's last handle closes; ErrBusy
	// when another client holds it. From then on a flush that finds the
	// lock gone (broken by another gateway) fails with ErrFenced.
	AcquireLock(name string) error
}

// Reconnector is implemented by SharedOpeners whose volumes a cluster can
// fence (rbd): each volume opened shared reaches the cluster through a
// client of its own, so that breaking one volume's lock blocklists only
// that volume's client (the gateway's other volumes go on), and a fenced
// volume can be given a new client instead of being lost until the
// process restarts (as tcmu-runner reopens an image whose client was
// blocklisted).
type Reconnector interface {
	// Reconnect replaces the cluster client of a volume this store has
	// open shared, the old one (blocklisted, usually) shut down. The
	// volume's handles stay valid and reach it through the new client
	// from the return on, without its lock: their writes and flushes
	// fail with ErrFenced until AcquireLock takes the lock again, so
	// that nothing the old owner accepted can land through the new
	// client behind another gateway's back. ErrInvalid when the volume
	// is not open shared here.
	Reconnect(volume string) error
}

// VolumeMetadata is implemented by shared stores (rbd) that keep small
// records with each volume, where every gateway serving it finds them:
// srpd records a volume's reservations there, so that the gateway that
// takes the volume over enforces the hosts' fence as the one before it
// did.
type VolumeMetadata interface {
	// Metadata returns the value recorded under key for a volume this
	// store has open ("" when there is none). It reads the cluster, not
	// a cache: a gateway that just took the lock reads what the
	// previous owner wrote.
	Metadata(volume, key string) (string, error)
	// SetMetadata records value under key for a volume this store has
	// open and whose lock it holds (AcquireLock, or Exclusive); without
	// the lock, or once another client broke it, it fails with
	// ErrFenced, so that a gateway that lost the volume cannot change
	// what the next one reads.
	SetMetadata(volume, key, value string) error
}
