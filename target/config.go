package target

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/wire"
)

// Volume is what the target serves. *block.Volume values (block.Volume
// implementations) satisfy it; the target never imports block.
//
// Requests the target passes on are already validated: block-aligned,
// non-empty and inside Size. A Volume must be safe for concurrent use: the
// target runs requests of one connection in parallel. A failed request is
// answered SenseSpaceAllocFailed when its error matches syscall.ENOSPC
// (errors.Is; block.ErrNoSpace does), SenseMediumError otherwise.
type Volume interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	WriteAtFUA(p []byte, off int64) (int, error)
	Flush() error
	Discard(off, length int64) error
	WriteZeroes(off, length int64) error
	Size() int64
	BlockSize() int
}

// Allocator is implemented by volumes that know which of their parts hold
// data (block's volumes do; the signature is block.Allocator's). The
// target answers an initiator's extents request from it; a volume without
// it has every range reported allocated, which is always true enough: a
// reader that skips nothing loses nothing.
type Allocator interface {
	// Allocated calls yield with each allocated run of [off, off+n), in
	// order, until yield returns false, and returns the end of what it
	// described: bytes before end outside the runs read as zeros.
	Allocated(off, n int64, yield func(off, n int64) bool) (end int64, err error)
}

// Immediate is implemented by volumes whose I/O completes without waiting
// for a device or a sync (memory volumes). The target runs their reads and
// writes on the connection's own goroutine instead of a worker, saving two
// goroutine hand-offs per command. It also takes such a volume for one
// that lives in memory, lost whole when the process ends: it tells
// initiators so (wire.CapVolatile; an SRP host through a dirty mark that
// no flush clears, DirtyMarks).
type Immediate interface {
	Immediate() bool
}

// Identifier is implemented by volumes that know their identity: the
// same for every open of the volume, in any process, and different for
// any other volume ever given its name (deleted and created again, or
// another store's). The OPEN answer carries it, so that an initiator
// re-opening the volume after a reconnect finds a replaced one instead
// of replaying writes onto it; zero means none. block's volumes
// implement it.
type Identifier interface {
	Identity() uint64
}

// identity is v's Identity, or 0 if it has none.
func identity(v Volume) uint64 {
	if id, ok := v.(Identifier); ok {
		return id.Identity()
	}
	return 0
}

// immediate reports whether v says it is Immediate.
func immediate(v Volume) bool {
	im, ok := v.(Immediate)
	return ok && im.Immediate()
}

// Deallocator is implemented by volumes that say whether Discard
// deallocates, the range reading as zeros afterwards (block's volumes
// do, from their CapDiscard). The SRP personality offers UNMAP and
// reports thin provisioning (SBC-3 4.7) only for such a volume; one
// without it is a fully provisioned logical unit.
type Deallocator interface {
	Deallocates() bool
}

// BatchWriter is implemented by volumes that apply several writes at once
// more cheaply than one by one, and whose writes do not wait for a device
// unless the volume says so (block's pebble volumes: one batch, one trip
// through pebble's commit pipeline, no sync). The plain writes that become
// ready in one pass of a connection's loop go to WriteBatch together, on
// the loop itself unless Stalled, else on a worker.
type BatchWriter interface {
	// WriteBatch writes bufs[i] at offs[i] for every i, all or nothing.
	// On an error the target retries the requests one by one, so that
	// each gets its own status.
	WriteBatch(bufs [][]byte, offs []int64) error
	// Stalled reports whether a write started now may wait (for
	// compactions, say).
	Stalled() bool
}

// VolumeInfo describes a servable volume.
type VolumeInfo struct {
	Name      string
	Size      int64
	BlockSize int
	// ReadOnly volumes (snapshots, say) are opened read-only whatever the
	// initiator asks: writes are answered WriteProtected by the target
	// itself, before the volume sees them.
	ReadOnly bool
	// Standby, in what an OPEN learned, says the volume is a
	// PathStater on standby here; the answer says so (wire.PathStandby).
	Standby bool
	// Identity, in what List returns, is the volume's Identifier's, if
	// the catalog knows it without opening the volume and the volume
	// outlives the process (0 otherwise). By it the SRP personality's
	// LUN map tells a volume from another created since under its name
	// by anyone but this target (another gateway, or this target before
	// a crash): the new one gets a new LUN, as after a delete the
	// target saw (LUNStore).
	Identity uint64
}

// Catalog finds volumes by name. cmd/srpd adapts a block.Store to it.
//
// OpenVolume returns a handle private to one OPEN: the target closes it with
// Close when the initiator closes the handle or the connection ends, if the
// handle implements io.Closer. Both methods may block (they run on the
// target's worker goroutines, never on a poller).
type Catalog interface {
	List() ([]VolumeInfo, error)
	OpenVolume(name string) (Volume, error)
}

// Access is what an initiator may do with a volume.
type Access uint8

// Access levels, ordered: a higher level includes the lower.
const (
	AccessNone Access = iota
	AccessReadOnly
	AccessReadWrite
)

var accessNames = [...]string{AccessNone: "none", AccessReadOnly: "read-only", AccessReadWrite: "read-write"}

func (a Access) String() string { return enum.Name(accessNames[:], a, "Access") }

// ACLRule grants Access on Volume to Initiator. "*" in either name matches
// anything.
type ACLRule struct {
	Initiator string
	Volume    string
	Access    Access
}

// ACL maps (initiator, volume) to an Access. The most specific matching
// rule wins: an exact initiator beats "*", then an exact volume beats "*";
// with no matching rule the answer is AccessReadWrite, or AccessNone with
// DenyByDefault. The zero value, and a nil *ACL, allow everything
// read-write.
//
// An SRP session, which carries no name of its own choosing beyond its
// port identifier, is also known by its source address over RDMA CM: a
// rule whose initiator is SourcePrefix and the host ("addr:10.0.2.15")
// matches the sessions from that host (AllowFrom). A rule naming the
// initiator itself beats one naming the source, which beats "*". Source
// rules match nothing else: a gosrp initiator naming itself
// "addr:10.0.2.15" gets no rule of that address.
//
// A name VOL@SNAP is a snapshot of VOL (the catalog convention of
// cmd/srpd; volume names have no '@'). Its access is at most VOL's: the
// rules that decide VOL decide its snapshots too, and a rule naming
// VOL@SNAP itself can narrow that, never widen it. Otherwise "host-b A
// none" beside "host-b * rw" would still let host-b open A@s1 and read
// A's bytes as of the snapshot.
type ACL struct {
	Rules []ACLRule
	// DenyByDefault makes the answer AccessNone when no rule matches. When
	// false (the zero value) an unmatched pair gets AccessReadWrite, so an
	// empty ACL allows all.
	DenyByDefault bool
}

// SourcePrefix begins an ACL rule's initiator that names a source host
// rather than an initiator (see ACL).
const SourcePrefix = "addr:"

// Allow returns the access initiator has to volume.
func (a *ACL) Allow(initiator, volume string) Access { return a.AllowFrom(initiator, "", volume) }

// AllowFrom returns the access initiator, connected from the host
// source ("" for none to match), has to volume: rules naming
// SourcePrefix+source count too, below those naming initiator.
func (a *ACL) AllowFrom(initiator, source, volume string) Access {
	if a == nil {
		return AccessReadWrite
	}
	src := ""
	if source != "" {
		src = SourcePrefix + source
	}
	base, _, isSnap := strings.Cut(volume, "@")
	if !isSnap {
		acc, _ := a.match(initiator, src, volume, true)
		return acc
	}
	acc, _ := a.match(initiator, src, base, true)
	// Only a rule naming the snapshot exactly may narrow: "*" rules
	// already took part in the volume's answer.
	if own, ok := a.match(initiator, src, volume, false); ok && own < acc {
		acc = own
	}
	return acc
}

// match finds the most specific rule for (initiator, volume); with
// wildVolume false only rules naming volume exactly count. It reports
// whether any rule matched; when none did, the answer is the default.
func (a *ACL) match(initiator, src, volume string, wildVolume bool) (Access, bool) {
	best, bestScore := AccessReadWrite, -1
	if a.DenyByDefault {
		best = AccessNone
	}
	for _, r := range a.Rules {
		score := 0
		switch {
		case strings.HasPrefix(r.Initiator, SourcePrefix):
			if src == "" || r.Initiator != src {
				continue // a source rule matches the source only
			}
			score += 2
		case r.Initiator == initiator:
			score += 4
		case r.Initiator == "*":
		default:
			continue
		}
		switch {
		case r.Volume == volume:
			score++
		case r.Volume == "*" && wildVolume:
		default:
			continue
		}
		if score > bestScore {
			best, bestScore = r.Access, score
		}
	}
	return best, bestScore >= 0
}

// Config configures a Target. Zero fields take the documented defaults.
type Config struct {
	// Name is the target name reported at login; a login naming another
	// target is rejected. Default "gosrp".
	Name string
	// Catalog is the set of volumes served. Required.
	Catalog Catalog
	// ACL restricts who may open what; nil lets everyone open everything
	// read-write.
	ACL *ACL
	// Secrets returns an initiator's shared secret and whether it must
	// authenticate (HMAC-SHA256 challenge, wire.LoginProofFor). nil: no
	// authentication. A required login with an empty secret is rejected.
	Secrets func(initiator string) (secret []byte, required bool)
	// Credits is the most requests one connection may have outstanding
	// (default 32, max 1024). The initiator gets min(asked, Credits).
	Credits int
	// SRPCredits is the request limit an SRP login is granted, per
	// channel (default DefaultSRPCredits, max MaxCredits; each costs a
	// slot and MaxTransfer bytes of data buffer, as Credits does). It
	// is separate from Credits because ib_srp keeps one back for task
	// management and caps its queue at the grant: see
	// DefaultSRPCredits.
	SRPCredits int
	// MaxTransfer is the most bytes one command moves (default 1 MiB); the
	// target registers Credits × MaxTransfer bytes of data buffers per
	// connection.
	MaxTransfer int
	// MaxDesc is the most descriptors per command (default and maximum
	// wire.MaxDescriptors).
	MaxDesc int
	// DisableRemoteInvalidate stops the target from offering SEND_WITH_INV
	// responses (remote invalidation is offered by default, when the device
	// can do it and the initiator asks).
	DisableRemoteInvalidate bool
	// LoginTimeout bounds the time from connection to a finished login
	// (default 10s).
	LoginTimeout time.Duration
	// MaxPendingLogins caps the connections accepted and not logged in
	// yet (default DefaultMaxPendingLogins, negative: no cap), and
	// MaxPendingPerSource those of one source, the host of the remote
	// address (default DefaultMaxPendingPerSource, negative: no cap). A
	// connection request beyond a cap is rejected at once.
	MaxPendingLogins    int
	MaxPendingPerSource int
	// MaxConnections caps the target's connections, logged in or not
	// (default DefaultMaxConnections, negative: no cap), and
	// MaxConnectionsPerSource those of one source (default
	// DefaultMaxConnectionsPerSource, negative: no cap). A connection
	// request beyond a cap is rejected at once; no connection is evicted
	// for it.
	MaxConnections          int
	MaxConnectionsPerSource int
	// Logger receives connection events and protocol violations. Default
	// slog.Default().
	Logger *slog.Logger
	// SRPTargetPortID is the T10 SRP target port identifier (id_ext then
	// ioc_guid, SRP r16a 5.3) an SRP login must name; the zero value
	// accepts any. See docs/srp.md.
	SRPTargetPortID [16]byte
	// SRPPortGroup turns on ALUA (SPC-4 5.15) for SRP hosts of the
	// volumes that several gateways export (PathStater): it is this
	// gateway's target port group, and must differ between the gateways
	// of a volume. An SRP host then sees each gateway as a path whose
	// state REPORT TARGET PORT GROUPS gives (active where the volume is
	// served, standby elsewhere), and a SET TARGET PORT GROUPS asking for
	// this gateway to be active takes the volume over, as an OPEN with
	// Takeover does. Zero (the default) leaves ALUA off. See
	// docs/gateways.md.
	SRPPortGroup uint16
	// Reservations, if set, keeps the volumes' persistent reservations
	// across restarts: New loads them, and every change is saved before
	// the initiator that asked is answered. nil keeps them in memory,
	// for the Target's lifetime.
	Reservations ReservationStore
	// DirtyMarks, if set, keeps which volumes may hold unflushed writes,
	// so that after a restart the target tells SRP hosts that their
	// volume lost its write cache (scsi.WriteCacheLost). Without it an
	// SRP host is never told.
	DirtyMarks DirtyMarks
	// LUNs, if set, keeps the SRP LUN numbers across restarts (LUNStore);
	// nil keeps them for the Target's lifetime, so a restart numbers the
	// volumes in name order again.
	LUNs LUNStore
	// OpenWait is how long the target waits for a volume's store to
	// open it (each open runs on a goroutine of its own) before it
	// answers without it, so that one hung volume holds back neither a
	// session nor its other volumes. A gosrp OPEN still waiting is
	// answered NOT READY, becoming ready, and the initiator tries again
	// (conn_open.go). An SRP login, or a catalog change reaching a
	// logged-in session, leaves the LUN out of REPORT LUNS and answers
	// its commands NOT READY, becoming ready, which hosts retry, and
	// adds it, announced by REPORTED LUNS DATA HAS CHANGED, once it
	// opens (conn_srp_open.go).
	// Keep it well under the initiators' I/O timeout (initiator's
	// IOTimeout, 30 s; sd's 30 s): an OPEN unanswered past that ends
	// the initiator's connection. Default DefaultOpenWait.
	OpenWait time.Duration
	// SpareBuffers is how many released connections' buffer sets (a PD
	// with its registered IU and data buffers: Credits × MaxTransfer
	// bytes, 64 MiB for an SRP channel by default) the target keeps for
	// the next accepts (conn_buffers.go). A reconnect then registers
	// nothing; on rxe that is most of what an accept costs
	// (docs/performance.md). The sets stay pinned until they are taken
	// or the target shuts down. 0 (the default) or negative keeps none:
	// on the rxe of Linux 6.12, reconnects that fast under injected QP
	// errors stalled the kernel's QP destroy (docs/performance.md), and
	// the default waits until that is understood. 4 covers the channels
	// of one SRP host that all log in again at once (ib_srp's
	// srp_reconnect_rport; ch_count is at most 4 per NUMA node by
	// default).
	SpareBuffers int
}

// Limits of the configuration.
const (
	DefaultCredits = 32
	// DefaultSRPCredits lets the Linux ib_srp initiator's default queue
	// run full: ib_srp sizes a channel's SCSI queue (can_queue) as
	// min(queue_size − 2, request limit − 1), keeping one request back
	// for task management (SRP_TSK_MGMT_SQ_SIZE) and one for target
	// requests (SRP_RSP_SQ_SIZE), and its default queue_size is 64
	// (SRP_DEFAULT_QUEUE_SIZE, srp_cm_rep_handler). A grant of 64 gives
	// it its 62 and never stops a QD32 job short (32 would give it 31);
	// ib_srpt grants its whole receive ring, 128 or more.
	DefaultSRPCredits   = 64
	MaxCredits          = 1024
	DefaultMaxTransfer  = 1 << 20
	MaxMaxTransfer      = 64 << 20
	DefaultLoginTimeout = 10 * time.Second
	// DefaultOpenWait is long enough for a store that is only slow (an
	// RBD image's open and lock take tens to hundreds of milliseconds)
	// and short beside the time an initiator gives a command (sd's and
	// the initiator package's 30 s).
	DefaultOpenWait = 5 * time.Second
	// iuSize is the size of every receive buffer and IU send buffer: the
	// largest IU the target accepts and the largest it sends.
	iuSize = 4096
	// maxImmediate is the most immediate data (wire.FlagImmediate) one
	// WRITE command may carry: 8 KiB, ib_srp's default max_imm_data, so
	// the common 4 KiB and 8 KiB writes need no RDMA READ.
	maxImmediate = 8 << 10
	// recvSize is the size of every receive buffer: the largest IU the
	// target accepts, a command with maxImmediate bytes of data (an
	// SRP_CMD's data starts later than a gosrp command's, at ib_srp's
	// srp_imm_data_offset).
	recvSize = max(wire.CommandHeaderLen, srpImmOffset) + maxImmediate
	// maxHandles bounds the volumes one connection may have open.
	maxHandles = 256
)

func (c *Config) normalize() error {
	if c.Catalog == nil {
		return errors.New("target: Config.Catalog is required")
	}
	if c.Name == "" {
		c.Name = "gosrp"
	}
	switch {
	case c.Credits == 0:
		c.Credits = DefaultCredits
	case c.Credits < 1 || c.Credits > MaxCredits:
		return fmt.Errorf("target: Credits %d outside [1, %d]", c.Credits, MaxCredits)
	}
	switch {
	case c.SRPCredits == 0:
		c.SRPCredits = DefaultSRPCredits
	case c.SRPCredits < 1 || c.SRPCredits > MaxCredits:
		return fmt.Errorf("target: SRPCredits %d outside [1, %d]", c.SRPCredits, MaxCredits)
	}
	switch {
	case c.MaxTransfer == 0:
		c.MaxTransfer = DefaultMaxTransfer
	case c.MaxTransfer < 512 || c.MaxTransfer > MaxMaxTransfer:
		return fmt.Errorf("target: MaxTransfer %d outside [512, %d]", c.MaxTransfer, MaxMaxTransfer)
	}
	switch {
	case c.MaxDesc == 0:
		c.MaxDesc = wire.MaxDescriptors
	case c.MaxDesc < 1 || c.MaxDesc > wire.MaxDescriptors:
		return fmt.Errorf("target: MaxDesc %d outside [1, %d]", c.MaxDesc, wire.MaxDescriptors)
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = DefaultLoginTimeout
	}
	if c.OpenWait <= 0 {
		c.OpenWait = DefaultOpenWait
	}
	c.SpareBuffers = max(c.SpareBuffers, 0)
	if c.MaxPendingLogins == 0 {
		c.MaxPendingLogins = DefaultMaxPendingLogins
	}
	if c.MaxPendingPerSource == 0 {
		c.MaxPendingPerSource = DefaultMaxPendingPerSource
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConnectionsPerSource == 0 {
		c.MaxConnectionsPerSource = DefaultMaxConnectionsPerSource
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
