package initiator

import (
	"errors"
	"fmt"
	"io/fs"
	"sync/atomic"
	"syscall"

	"github.com/gosrp/gosrp/internal/wire"
)

// Op is a block operation.
type Op uint8

// Operations.
const (
	OpRead Op = iota + 1
	OpWrite
	OpFlush
	OpDiscard
	OpWriteZeroes
	opControl
)

func (o Op) String() string {
	switch o {
	case opControl:
		return "CONTROL"
	}
	return wire.Op(o).String()
}

// Sentinel errors callers act on.
var (
	// ErrClosed: the session or volume is closed.
	ErrClosed = errors.New("initiator: closed")
	// ErrConnectionLost: the connection stayed down past the loss timeout,
	// or the request was re-issued across connections that ended with it
	// on them for that long (the error wraps what ended the last).
	ErrConnectionLost = errors.New("initiator: connection lost")
	// ErrRejected: the target refused the login; see *LoginError.
	ErrRejected = errors.New("initiator: login rejected")
	// ErrAuth: the target failed to prove it knows the shared secret.
	ErrAuth = errors.New("initiator: target authentication failed")
	// ErrInvalid: a request is malformed (alignment, size, range).
	ErrInvalid = errors.New("initiator: invalid request")
	// ErrReadOnly: a write to a volume opened read-only, or one the
	// target answered write-protected (its ACL became read-only while
	// the volume was open, say).
	ErrReadOnly = errors.New("initiator: volume is read-only")
	// ErrAccessDenied: the target's ACL does not let this initiator open
	// the volume, or no longer lets it use a volume it had open (the
	// target closed the handle on an ACL change). It is also
	// fs.ErrPermission, as callers mapping errors to errnos expect.
	ErrAccessDenied = fmt.Errorf("initiator: access denied: %w", fs.ErrPermission)
	// ErrProtocol: the target broke the protocol; the connection is reset.
	ErrProtocol = errors.New("initiator: protocol violation by the target")
	// ErrWriteCacheLost: the target restarted (its instance changed) while
	// it held writes it had acknowledged and not yet made durable, and the
	// session could not replay them: what those writes wrote is unknown.
	// The next Flush and the next FUA write of the volume report it, once
	// each per loss.
	ErrWriteCacheLost = errors.New("initiator: target lost acknowledged writes that were not yet flushed")
	// ErrVolumeLost is ErrWriteCacheLost (errors.Is matches both) of a
	// volume the target keeps in memory (srpd --backend memory): a
	// restart lost all of it, what was flushed too, and no replay brings
	// it back. It is reported as ErrWriteCacheLost is, once the volume
	// was written to in the session.
	ErrVolumeLost = fmt.Errorf("initiator: target lost a volume it kept in memory: %w", ErrWriteCacheLost)
	// ErrVolumeReplaced is ErrWriteCacheLost (errors.Is matches both) of
	// a volume that, re-opened after a reconnect, is another volume of
	// the same name: deleted and created again while the connection was
	// down, or served by another target at the address. What the session
	// wrote went to the old one; nothing is replayed onto the new one,
	// and every later request of the Volume fails with it. Open the name
	// again to use the new volume.
	ErrVolumeReplaced = fmt.Errorf("initiator: the volume was replaced by another of the same name: %w", ErrWriteCacheLost)
	// ErrVolumeGone is ErrVolumeReplaced (errors.Is matches both) of a
	// volume whose unit the target no longer has at all after a
	// re-login: over ProtocolSRP, its LUN answers LOGICAL UNIT NOT
	// SUPPORTED (the volume deleted, or created again and given another
	// LUN, as srpd does).
	ErrVolumeGone = fmt.Errorf("initiator: the target no longer has the volume: %w", ErrVolumeReplaced)
	// ErrReservationConflict: another host's reservation, or another
	// session's exclusive open, forbids the command or the open (SAM-5's
	// RESERVATION CONFLICT); see Volume.Reservations and
	// OpenOptions.Exclusive.
	ErrReservationConflict = errors.New("initiator: volume is reserved by another host")
	// ErrStandby: the target is a standby gateway for the volume: another
	// gateway serves it, or took it from this one (Volume.Standby,
	// OpenOptions.Takeover, Multipath). Nothing was done; the command
	// may be retried on the active path.
	ErrStandby = errors.New("initiator: the target is a standby path for the volume")
	// ErrNotReady: Open's context ended while the target was still
	// opening the volume (it answered NOT READY, becoming ready: its
	// store had not opened the volume within the target's OpenWait; over
	// ProtocolSRP, the LUN's commands were answered so).
	// The error wraps the context's error too.
	ErrNotReady = errors.New("initiator: the target has not opened the volume yet")
)

// ErrNoSpace: the target's store had no space for a write (it answered
// SenseSpaceAllocFailed, SBC's SPACE ALLOCATION FAILED WRITE PROTECT). It
// matches syscall.ENOSPC too (errors.Is), so a caller that passes errors
// on as errnos (FUSE, NBD) reports ENOSPC. Reads still work, and the write
// may succeed once space is freed on the target.
var ErrNoSpace error = noSpaceError{}

type noSpaceError struct{}

func (noSpaceError) Error() string { return "initiator: no space on the target" }

// Is makes errors.Is(ErrNoSpace, syscall.ENOSPC) true.
func (noSpaceError) Is(target error) bool { return target == syscall.ENOSPC }

// IOError is a command the target failed, with its sense code.
type IOError struct {
	Op    Op
	Off   int64
	Len   int64
	Sense Sense
	// Busy: the target answered that it could not run the command now
	// (a target draining for its stop), to the last try within the I/O
	// timeout.
	Busy bool
}

func (e *IOError) Error() string {
	if e.Busy {
		return fmt.Sprintf("initiator: %s of %d bytes at %d: target busy", e.Op, e.Len, e.Off)
	}
	return fmt.Sprintf("initiator: %s of %d bytes at %d: target: %s", e.Op, e.Len, e.Off, e.Sense)
}

// Unwrap gives the sentinel of the senses callers act on: write
// protected is ErrReadOnly, access denied is ErrAccessDenied, space
// allocation failed is ErrNoSpace (and so syscall.ENOSPC), reservation
// conflict is ErrReservationConflict, path not active is ErrStandby; nil
// for the others.
func (e *IOError) Unwrap() error {
	switch e.Sense {
	case SenseWriteProtected:
		return ErrReadOnly
	case SenseAccessDenied:
		return ErrAccessDenied
	case SenseSpaceAllocFailed:
		return ErrNoSpace
	case SenseReservationConflict:
		return ErrReservationConflict
	case SenseNotActive:
		return ErrStandby
	}
	return nil
}

// LoginError is a login the target rejected.
type LoginError struct {
	Reason  RejectReason
	Message string
}

func (e *LoginError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("initiator: login rejected: %s: %s", e.Reason, e.Message)
	}
	return fmt.Sprintf("initiator: login rejected: %s", e.Reason)
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *LoginError) Unwrap() error { return ErrRejected }

// Request is one asynchronous block operation (Volume.Submit). Buf is
// read into or written from; Offset and, for DISCARD and WRITE_ZEROES,
// Length say where. Offsets and lengths must be multiples of the block
// size and a transfer at most Session.MaxTransfer bytes. When the request
// completes, Err is set and the request is sent on Done, which must have
// room for it: the channel's poller blocks until it is taken. If OnDone is
// set it is called instead, on the poller's goroutine: it must return
// quickly and never block (hand the request on, as a completion queue
// entry), and it saves the hand-off to a goroutine waiting on Done.
//
// A Request may be reused after it has come back on Done (or OnDone).
type Request struct {
	Op     Op
	Buf    []byte
	Offset int64
	Length int64
	FUA    bool
	Done   chan<- *Request
	OnDone func(*Request)
	Err    error

	vol     *Volume
	next    *Request
	start   int64         // clock.Nanos when queued on a channel (channel.submit)
	state   atomic.Uint32 // reqPending, reqClaimed, reqAbandoned
	ctrl    *wire.ControlRequest
	ctrlRsp wire.ControlResponse
	epoch   uint64 // connection the response came from (control requests)
	seq     uint64 // a flush: the writes it covers; a parked write: its number (replay.go)
	// lossGen is a flush's count of its volume's losses a flush had
	// reported when it was issued, or noLoss (replay.go).
	lossGen uint64
	replay  bool          // re-issued from the replay ring
	self    bool          // the session's own flush, for room in the ring
	sync    chan *Request // the synchronous API's own completion channel
	// scsi, for a session in ProtocolSRP, is a SCSI command of the
	// session's own (discovery: REPORT LUNS, INQUIRY, READ CAPACITY)
	// sent instead of the one Op would make (core_srp.go).
	scsi *scsiCmd
	// retries counts the re-issues of a command answered BUSY (either
	// protocol), or UNIT ATTENTION, TASK ABORTED or TASK SET FULL (SRP)
	// since it was submitted, retryFirst is when it was first staged,
	// and retryLast is the answer that re-issued it last: past
	// Config.IOTimeout from retryFirst it is not re-issued again but
	// completes with retryLast (core.retryExpired).
	retries    uint32
	retryFirst int64
	retryLast  error
	// timeouts counts the I/O timeouts that ended a connection while
	// the request was on it unanswered (core.tick); at maxIOTimeouts it
	// fails instead of being re-issued (core.reset).
	timeouts uint8
	// losses counts the connections that ended, for whatever reason,
	// while the request was on them (core.reset), the first at lostAt;
	// re-issued so for Config.LossTimeout, it fails instead (lostError).
	losses uint32
	lostAt int64
}

// what names the request in errors: its SCSI command in T10 SRP, else
// its operation.
func (r *Request) what() string {
	if w := r.scsi.name(); w != "" {
		return w
	}
	return r.Op.String()
}

func (r *Request) length() int64 {
	if r.Op == OpRead || r.Op == OpWrite {
		return int64(len(r.Buf))
	}
	return r.Length
}

const (
	reqPending uint32 = iota
	reqClaimed
	reqAbandoned
	reqPinned // the poller is copying the caller's buffer
)

// claim makes the poller the request's owner until it is delivered; it
// fails if the synchronous caller gave up on the request first (then only
// a bounce buffer was exposed, and nobody waits for it).
func (r *Request) claim() bool { return r.state.CompareAndSwap(reqPending, reqClaimed) }

// abandon is the caller giving up; false if the poller already claimed it.
func (r *Request) abandon() bool { return r.state.CompareAndSwap(reqPending, reqAbandoned) }

func (r *Request) abandoned() bool { return r.state.Load() == reqAbandoned }

// pin keeps the caller from giving up on r while the poller reads its
// buffer (a write's copy into the bounce buffer); false if it already
// has. unpin ends it.
func (r *Request) pin() bool    { return r.state.CompareAndSwap(reqPending, reqPinned) }
func (r *Request) unpin()       { r.state.Store(reqPending) }
func (r *Request) pinned() bool { return r.state.Load() == reqPinned }

// deliver reports a claimed request. A volume's I/O the target refused
// as a standby path turns the volume standby (Volume.Standby), as
// Linux's alua_check_sense takes such a sense for the port group's new
// state.
func (r *Request) deliver(err error) {
	r.Err = err
	if err != nil && r.vol != nil && errors.Is(err, ErrStandby) {
		r.vol.standby.Store(true)
	}
	switch {
	case r.OnDone != nil:
		r.OnDone(r)
	case r.Done != nil:
		r.Done <- r
	}
}

// finish claims and reports the request.
func (r *Request) finish(err error) {
	if r.claim() {
		r.deliver(err)
	}
}

// queue is an intrusive FIFO of requests.
type queue struct {
	head, tail *Request
	n          int
}

func (q *queue) push(r *Request) {
	r.next = nil
	if q.tail == nil {
		q.head = r
	} else {
		q.tail.next = r
	}
	q.tail = r
	q.n++
}

func (q *queue) pushFront(r *Request) {
	r.next = q.head
	q.head = r
	if q.tail == nil {
		q.tail = r
	}
	q.n++
}

// prependAll moves every request of o, in order, ahead of q's.
func (q *queue) prependAll(o *queue) {
	if o.head == nil {
		return
	}
	o.tail.next = q.head
	if q.tail == nil {
		q.tail = o.tail
	}
	q.head = o.head
	q.n += o.n
	*o = queue{}
}

// popFirst removes and returns the first request ok accepts, nil if
// none does.
func (q *queue) popFirst(ok func(*Request) bool) *Request {
	var prev *Request
	for r := q.head; r != nil; prev, r = r, r.next {
		if ok(r) {
			q.unlink(prev, r)
			return r
		}
	}
	return nil
}

// extract takes every request out accepts out of q, in one pass, and
// returns them in their order; the rest stay in theirs.
func (q *queue) extract(out func(*Request) bool) queue {
	var got queue
	var prev *Request
	for r := q.head; r != nil; {
		next := r.next
		if out(r) {
			q.unlink(prev, r)
			got.push(r)
		} else {
			prev = r
		}
		r = next
	}
	return got
}

func (q *queue) pop() *Request {
	r := q.head
	if r != nil {
		q.unlink(nil, r)
	}
	return r
}

// unlink takes r, which follows prev (nil: r is the head), out of q.
func (q *queue) unlink(prev, r *Request) {
	if prev == nil {
		q.head = r.next
	} else {
		prev.next = r.next
	}
	if q.tail == r {
		q.tail = prev
	}
	r.next = nil
	q.n--
}
