// Package block provides gosrp's volumes: fixed-block-size virtual disks
// with an io.ReaderAt / io.WriterAt shape plus Flush, a FUA write, Discard,
// WriteZeroes and Resize, stored by one of three backends (four with the
// build tags ceph and pacific: rbd, see below). It knows nothing
// of RDMA; the target consumes the Volume interface and cmd/srpd picks a
// backend by name with OpenStore.
//
//	s, err := block.OpenPebbleStore("/var/lib/srpd", nil)
//	v, err := s.Create("vol0", 1<<30, 4096)
//	_, err = v.WriteAt(buf, 8192) // visible now
//	err = v.Flush()               // durable now
//
// # Requests
//
// Offsets and lengths must be multiples of the volume's block size (512 or
// 4096, default 4096; fixed at creation), non-zero, and inside the volume.
// Violations return ErrMisaligned, ErrZeroLength or ErrOutOfRange wrapped
// with the volume name and the request, and change nothing. Requests are
// all-or-nothing; a Volume is safe for concurrent use. Caps reports which
// optional operations a volume really performs; the others return
// ErrUnsupported (or ErrReadOnly on a snapshot), never a silent success.
// Every volume is also an Allocator: Allocated reports the runs that hold
// data (pebble: blocks with a key in any layer of the chain; memory:
// blocks held; file: lseek SEEK_DATA/SEEK_HOLE), never less than the truth,
// so that copies and maps skip the rest.
//
// # Durability
//
//   - WriteAt, Discard and WriteZeroes are visible to every reader when they
//     return, and durable only after a later Flush returns.
//   - Flush makes every request that returned before it was called durable.
//   - WriteAtFUA is durable when it returns (and, on pebble, so is every
//     request that returned before it: the WAL is one sequential log).
//   - Create, Resize, Snapshot, Clone and Delete are durable when they return.
//   - A multi-block write is atomic on pebble (one batch): after a crash a
//     request's blocks are all old or all new. The file backend inherits the
//     file system's guarantees, which do not include that.
//
// Pebble: a write is one pebble batch committed with NoSync, and so is a
// BatchWriter's WriteBatch of several writes (the target's writes that
// arrive together: one trip through pebble's commit pipeline for all of
// them); a FUA write commits with Sync; Flush writes an empty LogData record
// with Sync (an empty batch would not touch the WAL) and so fsyncs the WAL
// up to and including every earlier batch. Pebble's commit pipeline gives
// group commit: concurrent Sync commits share one fsync. The WAL is never
// disabled. Blocks are compressed with pebble's fastest profile (MinLZ), not
// its default snappy, which cost a fifth of the target's CPU in compactions
// of incompressible data. Block data lives in pebble's blob files (value
// separation): compactions move keys and handles, not 4 KiB values, which
// more than doubled sustained random-write throughput.
// File: pwrite/pread, fdatasync for Flush and FUA with a small
// group-commit helper (syncGroup) so concurrent callers share fsyncs; a
// failed fdatasync is sticky. Memory: Flush and FUA succeed trivially and
// the volumes do not report CapPersistent.
//
// # Ceph RBD
//
// Built with -tags ceph,pacific (cgo, librbd-dev and librados-dev from
// Debian 12's Ceph 16.2, through github.com/ceph/go-ceph pinned at
// v0.34.0, its last version that serves Pacific), OpenRBDStore opens a
// pool (and optionally an RBD namespace) of a Ceph cluster as a store;
// without the tags it fails with ErrUnsupported and the build stays pure
// Go. A volume is an RBD image whose block size is kept in its image
// metadata. Its requests use librbd's asynchronous calls directly
// (go-ceph binds only the synchronous ones, and a goroutine waiting in
// C holds its P; see rbd_aio.go), each waiting for its completion
// without a thread: ReadAt and WriteAt are rbd_aio_read and
// rbd_aio_write; Flush is rbd_aio_flush (everything written before it
// acknowledged by the OSDs); WriteAtFUA is a write then a flush,
// librbd having no per-request FUA; Discard is rbd_aio_discard with
// rbd_skip_partial_discard off, so that the range reads as zeros;
// WriteZeroes is rbd_aio_writesame of a zero block,
// which librbd turns into a discard; Resize is rbd_resize. Snapshots are
// RBD snapshots, clones RBD clones of format 2 (a snapshot with clones
// can be deleted: it waits in the snapshot trash; a volume whose
// snapshots clones still need goes to the RBD trash when deleted).
// Allocated is rbd_diff_iterate2 with whole-object granularity, answered
// by the object map: runs of whole RBD objects (4 MiB). Errors carry
// librbd's errno and the sentinel it means (EBUSY: ErrBusy, ENOSPC:
// ErrNoSpace, ...).
//
// Fencing: with RBDOptions.Exclusive, opening a volume takes the image's
// exclusive lock and keeps it (librbd never hands it over on request;
// another client's write fails with EROFS). LockBreaker.BreakLock breaks
// another client's lock, which blocklists that client on the cluster: its
// next I/O fails with ErrFenced (ESHUTDOWN), so no write of an old owner
// lands after the new owner took the volume. A gateway opens volumes
// with SharedOpener.OpenShared, each through a cluster client of its
// own, so that a break fences it from that volume only; Reconnector
// gives a fenced volume a new client, which refuses writes until
// AcquireLock takes the lock again. WatchFenced hears of a broken lock
// from librbd's update watch, before any request fails.
//
// The rbd tests need a cluster: test/ceph/cluster.sh starts a one-monitor,
// one-OSD cluster in a temporary directory, and with CEPH_CONF set
//
//	go test -tags ceph,pacific ./block
//
// runs the API tests (api_test.go) and the model (shorter for rbd)
// against it too, each test in an RBD namespace of its own; without
// CEPH_CONF they skip saying so.
//
// # Out of space
//
// Pebble cannot survive ENOSPC in its WAL: the writer hangs in the commit
// pipeline, or the process dies in DB.rotateWAL ("sync: unlock of unlocked
// mutex", not a recoverable panic), taking every volume with it. So a
// pebble store never lets pebble reach it: every data write (WriteAt,
// WriteAtFUA, WriteBatch) is admitted against a reserve of free space on
// the store's file system and fails fast with ErrNoSpace below it. The
// reserve (PebbleOptions.SpaceReserve) defaults to max(64 MiB, 1% of the
// file system, two memtables), at most a quarter of it; it is the room
// pebble's flushes and compactions need to run, and so to free space,
// while writes are refused. The memtable itself is a 32nd of the file
// system, between 4 and 128 MiB, so that a small one has room to flush
// what it logged before writes were refused. Free space is statfs(2) (f_bavail), cached and measured again
// after 100 ms or after a quarter of the reserve (1 to 16 MiB) has been
// admitted; bytes admitted since a measurement count as used. Once a write
// is refused the store is "full" and refuses every write until a
// measurement shows the reserve plus that quarter free again; entering and
// leaving is logged (slog, at most once per 10 s). If pebble meets ENOSPC
// anyway (another process filled the disk between measurements), pebble's
// vfs.OnDiskFull hook measures at once. Reads are never refused. Flush,
// Discard and WriteZeroes (range deletions that free space once
// compacted) and the metadata operations write a few bytes each to the
// WAL and are not held to the reserve: they are refused (ErrNoSpace,
// which reads as "no space left on device") only when less than 1 MiB is
// free (walFloor), that is when something else has filled the file
// system and the next WAL block would meet ENOSPC. A store with a custom
// vfs.FS and no PebbleOptions.Statfs, and the memory store, do not
// measure and refuse nothing.
//
// ErrNoSpace also matches syscall.ENOSPC (errors.Is), so the target, which
// does not import this package, answers a SCSI "space allocation failed"
// sense, and the file backend wraps the ENOSPC of a pwrite or fdatasync in
// ErrNoSpace instead of returning a bare errno.
//
// Thin provisioning: volumes take space only for written blocks, so the
// sum of their sizes may exceed the disk, but only up to
// PebbleOptions.MaxOvercommit times the file system's size (default
// DefaultMaxOvercommit, 10; negative: unbounded). Create, Clone and a
// growing Resize beyond it fail with ErrNoSpace and a one-line message
// naming the totals; Space (SpaceReporter) reports the free space, the
// reserve, the provisioned total and the refused writes.
//
// # Pebble key layout
//
// Many volumes share one pebble database. Every key starts with a one-byte
// kind:
//
//	"f"                         store record (msgpack: format version, created)
//	"n"                         next layer id, uint64 big-endian
//	"v" name                    volume record (msgpack volumeMeta)
//	"s" volume 0x00 snapshot    snapshot record (msgpack volumeMeta)
//	"d" layer(8) block(8)       one block of one layer, big-endian integers
//
// Data is stored one key per block. Fixed multi-block extents were
// rejected: a 4 KiB random write into a 64 KiB extent must read, modify and
// rewrite 64 KiB (16× the bytes before any LSM amplification) under a
// per-extent lock, while per-block keys cost ~17 bytes of key per 4 KiB.
// Unwritten blocks have no key and read as zeros; Discard and WriteZeroes
// are one range deletion whatever their length; nothing ever stores a zero
// block on their behalf.
//
// Data lives in layers, not volumes. A volume's record holds its layer
// chain, newest first; writes go to the top layer (Layers[0]). A read of
// block b looks for "d" layer b in each layer of the chain in turn; the first
// layer holding it supplies the block. Snapshot freezes the top layer: the
// snapshot record takes the current chain and the volume gets a new, empty
// top layer above it, so a snapshot costs two small records and no copy,
// later writes never change it, and it survives restarts (pebble's own
// snapshots would not). Clone makes a new volume whose chain is a fresh top
// layer over a snapshot's chain. A volume with no snapshot has a chain of
// one layer and reads with a single point lookup (or one iterator for a
// multi-block read).
//
// In a layer with older layers below it, Discard, WriteZeroes and a
// shrinking Resize also set a pebble range key (a "mask") over the span, in
// that layer's key range: a read that reaches a mask stops there with zeros
// instead of falling through to the older layers. A later write in the
// masked span sets a point key, which wins over the mask of its own layer.
// A shrink masks from the new end to the end of the layer, so blocks beyond
// the end read as zeros after the volume grows again, even where an older
// layer was larger.
//
// Deleting a volume deletes its snapshots; deleting a volume or snapshot
// drops (range-deletes) exactly the layers no remaining volume, snapshot or
// clone references, computed from the records in the same batch. A layer
// that a deleted snapshot shared with its volume stays until the volume is
// deleted: chains are not yet flattened, so reads of blocks not in the top
// layer cost one seek per layer of the chain.
//
// # Records and format versions
//
// Records are msgpack with a "format" field (currently 1). A record is
// first checked to be one well-formed msgpack value whose declared lengths
// fit in it, then its format is decoded alone: a format newer than this code
// gives ErrFormatVersion; anything that fails to decode or validate gives
// ErrCorrupt naming the volume. Opening a store checks the store record and
// the layer counter (ErrFormatVersion, ErrCorrupt); a damaged volume record
// fails Open and List of that store with ErrCorrupt, never a panic or a
// silent reset, and a delete never drops data while any record is
// unreadable. The file backend keeps the same record in NAME.meta, replaced
// atomically (write, fsync, rename, fsync directory).
//
// # Tests and soaks
//
// go test -race ./block runs everything in a few seconds, including:
//
//   - TestModel: random write / FUA / discard / write-zeroes / resize /
//     snapshot / clone / delete / reopen / bad-request sequences against
//     each backend and a map-based reference, compared after every step.
//     GOSRP_MODEL_SEED replays a seed, GOSRP_MODEL_STEPS lengthens runs.
//   - TestCrash: re-executes the test binary as a writer (four goroutines,
//     a snapshot, flushes and FUA writes, a small memtable so the WAL
//     rotates), SIGKILLs it after a seeded number of log records, reopens
//     and checks durability, untorn blocks, atomic multi-block writes, the
//     snapshot and the metadata. GOSRP_CRASH_ITERS=500 is the long soak;
//     GOSRP_CRASH_SEED replays.
//   - FuzzDecodeVolumeMeta: go test -fuzz=FuzzDecodeVolumeMeta ./block.
//
// Measurements (not run by default):
//
//	go test -run '^$' -bench . ./block                    // per-backend benchmarks
//	GOSRP_MEASURE=1 go test -run TestMeasureIOPSRatio -v ./block
//	GOSRP_WA_BYTES=1073741824 go test -run TestMeasureWriteAmp -v -timeout 30m ./block
package block
