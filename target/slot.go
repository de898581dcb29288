package target

import (
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// slotState is the lifecycle of a request slot. A slot carries one command
// or control request from its arrival to the completion of its response
// SEND:
//
//	FREE → RECEIVED → READING_DATA (WRITE: RDMA READs outstanding)
//	                → FETCHING_TABLE (an SRP command's indirect table
//	                                  not wholly inline: its RDMA READ
//	                                  outstanding; then on as from
//	                                  RECEIVED)
//	                → BACKEND      (volume or catalog work on a worker)
//	                → WRITING_DATA (READ, or SRP data-in the model answered
//	                                at once: RDMA WRITEs + response posted)
//	                → RESPONDING   (response posted)
//	     → FREE when the response SEND completes, or (an SRP command
//	       aborted by task management, which gets no response) when
//	       its RDMA READs or its job finish.
type slotState uint8

const (
	slotFree slotState = iota
	slotReceived
	slotReadingData
	slotBackend
	slotWritingData
	slotResponding
	slotFetchingTable
)

var slotStateNames = [...]string{"FREE", "RECEIVED", "READING_DATA", "BACKEND", "WRITING_DATA", "RESPONDING", "FETCHING_TABLE"}

// slotNext says which states a slot may move to from each state; the
// core's setSlot checks every move against it.
var slotNext = [...][]slotState{
	slotFree:        {slotReceived},
	slotReceived:    {slotReadingData, slotBackend, slotWritingData, slotResponding, slotFetchingTable},
	slotReadingData: {slotBackend, slotResponding, slotFree}, // FREE: an aborted SRP command
	slotBackend:     {slotWritingData, slotResponding, slotFree},
	// RESPONDING: a long SRP data-in that another I_T nexus's reset
	// aborted between rounds, answered TASK ABORTED (core_srp_tmf.go).
	slotWritingData: {slotFree, slotResponding},
	slotResponding:  {slotFree},
	// FREE: an aborted SRP command, whose table came after the abort.
	slotFetchingTable: {slotReadingData, slotBackend, slotWritingData, slotResponding, slotFree},
}

func (s slotState) String() string { return enum.Name(slotStateNames[:], s, "slotState") }

// connState is the lifecycle of a connection's session.
type connState uint8

const (
	connLogin     connState = iota // waiting for the LoginRequest
	connChallenge                  // challenge sent, waiting for the LoginProof
	connActive                     // logged in, serving requests
	connDraining                   // shutting down or logged out: finishing what is in flight
	connRejecting                  // LoginReject posted; disconnect when it completes
	connClosed                     // disconnect requested; only backend jobs remain
)

var connStateNames = [...]string{"LOGIN", "CHALLENGE", "ACTIVE", "DRAINING", "REJECTING", "CLOSED"}

// connNext says which states a connection may move to from each state;
// the core's setState checks every move against it. CLOSED is reachable
// from everywhere (a peer may vanish at any moment) and leads nowhere.
var connNext = [...][]connState{
	connLogin:     {connChallenge, connActive, connRejecting, connClosed},
	connChallenge: {connActive, connRejecting, connClosed},
	connActive:    {connDraining, connClosed},
	connDraining:  {connClosed},
	connRejecting: {connClosed},
	connClosed:    {},
}

func (s connState) String() string { return enum.Name(connStateNames[:], s, "connState") }

// wrKind is the kind of work request a wr_id names.
type wrKind uint8

const (
	kindRecv    wrKind = iota + 1 // receive buffer; index = receive buffer
	kindRead                      // RDMA READ of WRITE data; index = slot
	kindWrite                     // RDMA WRITE of READ data; index = slot
	kindResp                      // response SEND; index = slot
	kindLogin                     // login-phase IU SEND; index 0
	kindNotice                    // a gosrp session's PathNotice SEND, from the login buffer; index 0
	kindCredReq                   // an SRP session's SRP_CRED_REQ SEND, from the login buffer; index 0
)

var wrKindNames = [...]string{"?", "RECV", "RDMA_READ", "RDMA_WRITE", "RESPONSE", "LOGIN", "NOTICE", "CRED_REQ"}

func (k wrKind) String() string { return enum.Name(wrKindNames[:], k, "wrKind") }

// wr_id layout: generation (24 bits) << 40 | kind (8 bits) << 32 | index
// (32 bits). Every completion maps to its slot or receive buffer without a
// map, and a completion of another connection generation is recognised.
func makeWRID(gen uint32, k wrKind, idx int) uint64 {
	return uint64(gen&0xffffff)<<40 | uint64(k)<<32 | uint64(uint32(idx))
}

func splitWRID(id uint64) (gen uint32, k wrKind, idx uint32) {
	return uint32(id>>40) & 0xffffff, wrKind(id >> 32), uint32(id)
}

// jobKind is the backend work a slot hands to a worker.
type jobKind uint8

const (
	jobNone jobKind = iota
	jobRead
	jobWrite
	jobWriteFUA
	jobFlush
	jobDiscard
	jobWriteZeroes
	jobList
	jobOpen
	jobClose
	jobExtents
	// jobUnmap discards the extents of an SRP UNMAP (slot.srp.ext).
	jobUnmap
	jobReserve // a PERSISTENT RESERVE OUT action (reservation.go)
	jobReport  // a PERSISTENT RESERVE IN report
	// jobTakeOver makes this gateway serve the volume, for an SRP SET
	// TARGET PORT GROUPS (PathStater.TakeOver).
	jobTakeOver
)

// openVol is a volume opened on one connection.
type openVol struct {
	handle uint32
	name   string
	vol    Volume
	size   int64
	bs     int64
	// ro and revoked are the core's alone (workers never read them): ro
	// can turn true while open, when the ACL narrows to read-only;
	// revoked means the ACL took the volume away, the shell closed vol,
	// and the handle stays reserved, answering AccessDenied, until the
	// initiator closes it (so no later OPEN reuses the number under I/O
	// meant for this volume).
	ro      bool
	revoked bool
	// resized: the volume changed size and the initiator has not been
	// told; the next response on the handle carries the notice (the
	// core's alone, like ro).
	resized bool
	// now: the volume's I/O runs inline (see Immediate).
	now bool
	// batch: the volume takes plain writes in batches (see BatchWriter).
	batch BatchWriter
	stats *ioCounters
	// pr is the volume's reservation state, owner the session key
	// (conn.go's) the exclusive open and the checks know the handle by;
	// writer says the handle counts as a writer there (prState's
	// writers), excl that it is an exclusive open. Set at open.
	pr     *prVolume
	owner  string
	ini    string // the initiator, for PREEMPT AND ABORT (prVolume.fence)
	writer bool
	excl   bool
	// writes counts the handle's writes in the store (dispatch to job
	// done), for PREEMPT AND ABORT to wait for; only with pr set.
	writes atomic.Int32
	// inflight counts backend operations on vol; a close waits for them.
	inflight sync.WaitGroup
	// mark is the volume's dirty mark, for an SRP session's volume when
	// the target keeps marks (DirtyMarks).
	mark *volMark
}

// markOf returns the volume's dirty mark, nil if it keeps none (a nil
// openVol, as a control job has, keeps none).
func (ov *openVol) markOf() *volMark {
	if ov == nil {
		return nil
	}
	return ov.mark
}

// slot is a request slot. The core owns it; while it is in BACKEND a
// worker reads the job fields and writes the result fields, and the core
// touches neither until the worker reports back.
type slot struct {
	idx     int32
	state   slotState
	control bool
	busy    bool // answered Busy (draining): not real work
	start   int64
	cmd     wire.Command
	ctl     wire.ControlRequest
	ctlRO   bool
	// resizedTo, if not 0, is a size the volume of the slot's running
	// OPEN was given meanwhile (core.volumeResized): the store may have
	// answered the OPEN with the size before it. The core's alone.
	resizedTo int64
	ov        *openVol
	srp       srpSlot // the SRP request, in an SRP session (core_srp.go)
	// A reservation job's inputs (the volume's state, the host, the
	// session) and results; prWriter says the OPEN counted a writer.
	prt      *prTable // an OPEN's: where the job finds prv
	prv      *prVolume
	prIni    string
	prOwner  string
	prOut    prOutcome
	prGen    uint32
	prRep    *wire.ControlResponse
	prWriter bool

	// job, set by the core before dispatch
	job jobKind
	// next links the slots of one write batch, the first slot's index
	// going to a worker for all of them; -1 ends the chain. Set and
	// cleared by the connection's loop.
	next int32
	// results, set by the worker
	err      error
	list     []VolumeInfo
	opened   Volume
	openInfo VolumeInfo
	extents  []wire.Extent

	// registered buffers: an IU send buffer and a data buffer
	send     []byte
	sendAddr uint64
	data     []byte
	dataAddr uint64
	sges     [wire.MaxDescriptors + 1]transport.SGE
	// sigSeq is the send-queue sequence number of the slot's outstanding
	// signaled WR: its completion frees every SQ entry up to it.
	sigSeq uint64
}

// holdsTag reports whether the request in the slot still holds its tag:
// it is not answered yet. Once its answer is posted (RESPONDING, or
// WRITING_DATA with the response behind the data) the initiator may
// have the answer and use the tag again before the answer's SEND
// completes here; an SRP data-in moved in rounds (pushing) has its
// answer still to come.
func (s *slot) holdsTag() bool {
	switch s.state {
	case slotFree, slotResponding:
		return false
	case slotWritingData:
		return s.srp.pushing
	}
	return true
}
