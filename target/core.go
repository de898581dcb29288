package target

import (
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// coreParams are what a connection's core needs: limits, policy and the
// addresses and keys of the buffers the shell registered.
type coreParams struct {
	gen       uint32
	id        uint64
	name      string // target name
	credits   int
	maxXfer   int
	maxDesc   int
	offerInv  bool  // target may answer with SEND_WITH_INV
	replays   bool  // the device replays requests at ERR (transport.Quirks.ReplayOnErr)
	loginTO   int64 // ns
	secrets   func(string) ([]byte, bool)
	acl       func() *ACL // the current rules (Target.SetACL swaps them)
	sqDepth   int
	nrecv     int
	recv      []byte // nrecv × recvSize
	recvAddr  uint64
	iu        []byte // (slots + 1) × iuSize send buffers; the last is the login buffer
	iuAddr    uint64
	iuLKey    transport.Key
	data      []byte // slots × maxXfer
	dataAddr  uint64
	dataLKey  transport.Key
	rand      func([]byte)
	volStats  func(name string) *ioCounters
	connStats *ioCounters
	instance  uint64   // the Target's write verifier, drawn by the shell
	srpPort   [16]byte // Config.SRPTargetPortID
	portGroup uint16   // Config.SRPPortGroup
	// source is the host the connection came from (its RDMA CM source
	// address), which an SRP session's ACL rules may name (ACL).
	source string
	// pr is the target's reservation table (reservation.go), shared by
	// its connections.
	pr *prTable
	// trace, if set, hears every state change (tests).
	trace func(change string)
}

// actions are what one or more events asked the shell to do, in order:
// post the receives and sends, start the jobs, then (if set) disconnect.
type actions struct {
	recv       []transport.RecvWR
	send       []transport.SendWR
	jobs       []int32
	disconnect bool
	violation  bool   // the disconnect is for a protocol violation or transfer error
	rejected   bool   // the login was refused
	reason     string // why the connection ends
	loggedIn   bool   // the login completed in this step
	// closeVols are volumes the shell must close off the loop (after
	// their in-flight operations): handles revoked by a policy change,
	// and volumes whose OPEN finished after the policy denied them.
	closeVols []*openVol
	// policy says what a policy change did to the session, for the
	// shell to log.
	policy []policyEffect
	// lossTold are volumes whose lost write cache an SRP flush reported
	// to this session's I_T nexus in this step (scsi.WriteCacheLost).
	lossTold []string
	// srpAborts are SRP task management functions to carry to the other
	// channels of the I_T nexus, and peerAborted the tokens of other
	// channels' functions whose commands here stopped
	// (core_srp_tmf.go).
	srpAborts   []srpNexusAbort
	peerAborted []any
	// taskMgmt are SRP task management functions received or acted on
	// in this step, for the shell to log (core_srp_tmf.go).
	taskMgmt []srpTaskMgmtEvent
}

// policyEffect is one consequence of a policy change on a session.
type policyEffect struct {
	volume string // "" for the session as a whole
	handle uint32
	access Access // what the volume's handle now allows
	reason string
	// retired: not the policy but the catalog took the volume away (an
	// SRP LUN whose volume went, core_srp_luns.go).
	retired bool
}

func (a *actions) reset() {
	a.recv = a.recv[:0]
	a.send = a.send[:0]
	a.jobs = a.jobs[:0]
	a.loggedIn = false
	a.closeVols = nil
	a.policy = nil
	a.lossTold = a.lossTold[:0]
	a.srpAborts = a.srpAborts[:0]
	a.peerAborted = a.peerAborted[:0]
	a.taskMgmt = a.taskMgmt[:0]
}

type pendingIU struct {
	idx int32
	n   uint32
	at  int64
}

// core is a connection's state machine: it takes events (a work
// completion, a finished backend job, a tick, a drain request) and returns
// actions. It starts no goroutines, reads no clock (the shell passes the
// time in) and makes no provider calls, so it can be driven step by step
// in tests.
type core struct {
	p   coreParams
	now int64

	state     connState
	initiator string
	session   uint64 // the initiator's session and channel (reinstatement)
	channel   uint16
	loggedOut bool

	// negotiated at login
	credits   int
	maxXfer   uint32
	maxDesc   int
	remoteInv bool
	maxImm    uint32 // immediate data granted per WRITE (wire.FlagImmediate)
	notices   bool   // the initiator reads capacity notices (wire.RespCapacityChanged)
	// pathNotices: the initiator reads PathNotice IUs (core_notice.go).
	pathNotices bool
	notice      noticeQueue
	iniRecvIU   int
	reqTarget   string // the target name the initiator addressed (bound into proofs)
	secret      []byte
	iniNonce    []byte
	tgtNonce    []byte
	// authMark is a keyed digest of what Config.Secrets answered at
	// login (markKey is random per connection, so the digest says
	// nothing about the secret): a policy change that alters the answer
	// ends the session, which must then prove the new secret.
	authMark [sha256.Size]byte
	markKey  []byte
	deadline int64 // login or reject deadline
	loginSeq uint64
	handles  []*openVol // index handle-1
	nhandles int
	// handlesGen changes whenever a handle is opened, closed or
	// revoked, so the shell republishes the names of the open volumes
	// (Target.OpenConns) only then, never per I/O.
	handlesGen uint64
	orphans    []Volume // volumes opened after the connection closed

	slots    []slot
	free     []int32 // stack of free slot indexes
	pending  []pendingIU
	pendHead int
	pendN    int

	recvSGE []transport.SGE
	recvWR  []transport.RecvWR

	outstanding  int // requests received and not yet answered (credits in use)
	jobsInFlight int
	sqPosted     uint64
	sqDone       uint64

	// prOwner is the session key reservations know this connection's
	// handles by (sessionKey).
	prOwner string

	// srp is the SRP session when the connection logged in with an
	// SRP_LOGIN_REQ (core_srp.go); nil for a gosrp session.
	srp *srpSession

	acts actions
	// bug is the first move the core refused as impossible (setState,
	// setSlot): an error in the core, which the shell logs and tests fail
	// on.
	bug error
}

func newCore(p coreParams) *core {
	if p.acl == nil {
		p.acl = func() *ACL { return nil }
	}
	if p.pr == nil {
		p.pr = newPRTable()
	}
	c := &core{p: p, credits: p.credits, maxXfer: uint32(p.maxXfer), maxDesc: p.maxDesc, iniRecvIU: iuSize}
	n := p.credits
	c.slots = make([]slot, n)
	c.free = make([]int32, 0, n)
	for i := n - 1; i >= 0; i-- {
		s := &c.slots[i]
		s.idx = int32(i)
		s.next = -1
		s.send = p.iu[i*iuSize : (i+1)*iuSize : (i+1)*iuSize]
		s.sendAddr = p.iuAddr + uint64(i*iuSize)
		s.data = p.data[i*p.maxXfer : (i+1)*p.maxXfer : (i+1)*p.maxXfer]
		s.dataAddr = p.dataAddr + uint64(i*p.maxXfer)
		c.free = append(c.free, int32(i))
	}
	c.pending = make([]pendingIU, p.nrecv)
	c.recvSGE = make([]transport.SGE, p.nrecv)
	c.recvWR = make([]transport.RecvWR, p.nrecv)
	for i := range c.recvWR {
		c.recvSGE[i] = transport.SGE{Addr: p.recvAddr + uint64(i*recvSize), Length: recvSize, LKey: p.iuLKey}
		c.recvWR[i] = transport.RecvWR{ID: makeWRID(p.gen, kindRecv, i), SGL: c.recvSGE[i : i+1]}
	}
	c.acts.recv = make([]transport.RecvWR, 0, p.nrecv)
	c.acts.send = make([]transport.SendWR, 0, p.sqDepth)
	c.acts.jobs = make([]int32, 0, n)
	c.handles = make([]*openVol, 0, 8)
	return c
}

// ---- events ----

// start posts every receive buffer and arms the login deadline.
func (c *core) start(now int64) {
	c.now = now
	c.acts.recv = append(c.acts.recv, c.recvWR...)
	c.deadline = now + c.p.loginTO
}

// nextDeadline is when the core wants a tick, if it does.
func (c *core) nextDeadline() (int64, bool) {
	switch c.state {
	case connLogin, connChallenge, connRejecting:
		return c.deadline, true
	}
	return 0, false
}

// tick handles the passage of time: the login and reject deadlines.
func (c *core) tick(now int64) {
	c.now = now
	d, ok := c.nextDeadline()
	if !ok || now < d {
		return
	}
	switch c.state {
	case connRejecting:
		c.close("login rejected (reject not acknowledged in time)", false)
	default:
		c.acts.rejected = true
		c.close("login timed out", false)
	}
}

// drain asks the connection to finish: a login in progress is rejected,
// in-flight requests finish and are answered, new ones are answered Busy,
// and the connection is disconnected once nothing real is in flight.
func (c *core) drain(now int64) {
	c.now = now
	switch c.state {
	case connLogin, connChallenge:
		c.reject(wire.RejectShuttingDown, "target shutting down")
	case connActive:
		c.setState(connDraining)
		c.checkDrained()
	}
}

// peerGone reports that the connection ended under the core.
func (c *core) peerGone(reason string) { c.close(reason, false) }

// postFailed reports that the shell could not post what the core asked
// for; the QP cannot be trusted any more.
func (c *core) postFailed(err error) {
	c.close("post failed: "+err.Error(), false)
}

// completion handles one work completion.
func (c *core) completion(wc *transport.WC, now int64) {
	c.now = now
	if c.state == connClosed {
		return
	}
	gen, kind, idx := splitWRID(wc.ID)
	if gen != c.p.gen&0xffffff {
		c.close(fmt.Sprintf("completion %#x of another connection generation", wc.ID), false)
		return
	}
	switch kind {
	case kindRecv:
		if int(idx) >= c.p.nrecv {
			c.close(fmt.Sprintf("receive completion %#x names no buffer", wc.ID), false)
			return
		}
	case kindRead, kindWrite, kindResp:
		if int(idx) >= len(c.slots) {
			c.close(fmt.Sprintf("completion %#x names no slot", wc.ID), false)
			return
		}
	case kindLogin, kindNotice, kindCredReq:
	default:
		c.close(fmt.Sprintf("completion %#x of unknown kind", wc.ID), false)
		return
	}
	if wc.Status != transport.StatusSuccess {
		c.failed(kind, idx, wc.Status)
		return
	}
	switch kind {
	case kindRecv:
		if wc.ByteLen > recvSize {
			c.close(fmt.Sprintf("IU of %d bytes exceeds the %d-byte receive buffer", wc.ByteLen, recvSize), true)
			return
		}
		c.onRecv(int32(idx), wc.ByteLen)
	case kindRead:
		s := &c.slots[idx]
		if s.state == slotFetchingTable { // an SRP command's indirect table
			c.reclaim(s.sigSeq)
			c.srpTableFetched(s)
			return
		}
		if s.state != slotReadingData {
			c.close(fmt.Sprintf("RDMA READ completion for slot %d in %s", idx, s.state), false)
			return
		}
		c.reclaim(s.sigSeq)
		if c.srp != nil && s.srp.isLong() {
			c.srpReadDone(s) // a round of a long table
			return
		}
		c.dispatchWrite(s)
	case kindWrite:
		s := &c.slots[idx]
		if c.srp == nil || s.state != slotWritingData || !s.srp.pushing {
			c.close("signaled RDMA WRITE completion (never requested)", false)
			return
		}
		c.reclaim(s.sigSeq)
		c.srpWriteDone(s) // a round of a long table
	case kindResp:
		s := &c.slots[idx]
		if s.state != slotResponding && s.state != slotWritingData {
			c.close(fmt.Sprintf("response completion for slot %d in %s", idx, s.state), false)
			return
		}
		c.reclaim(s.sigSeq)
		c.freeSlot(s)
	case kindLogin:
		c.reclaim(c.loginSeq)
		if c.state == connRejecting {
			c.close("login rejected", false)
			return
		}
		c.sendNotice() // one may have waited for the login buffer
	case kindNotice:
		c.noticeSent()
	case kindCredReq:
		c.srpCredSent()
	}
}

// failed handles an error completion. Only ID and Status are meaningful.
func (c *core) failed(kind wrKind, idx uint32, st transport.Status) {
	switch {
	case st == transport.StatusWRFlushErr:
		c.close("connection ended (work requests flushed)", false)
	case kind == kindRead || kind == kindWrite:
		c.close(fmt.Sprintf("%s for slot %d failed: %s (the initiator's descriptor is bad or the connection broke)", kind, idx, st), true)
	case kind == kindRecv:
		c.close(fmt.Sprintf("receive failed: %s", st), true)
	default:
		c.close(fmt.Sprintf("%s send failed: %s", kind, st), false)
	}
}

// backendDone handles a finished job of slot idx.
func (c *core) backendDone(idx int32, now int64) {
	c.now = now
	if idx < 0 || int(idx) >= len(c.slots) {
		return
	}
	s := &c.slots[idx]
	c.jobsInFlight--
	if s.job == jobTakeOver {
		c.srpTakeOverDone(s)
	}
	if c.state == connClosed {
		if s.job == jobOpen && s.opened != nil {
			c.orphans = append(c.orphans, s.opened)
			s.opened = nil
			if s.prWriter {
				(&openVol{pr: s.prv, owner: s.prOwner, writer: true, excl: s.ctl.Exclusive}).releasePR()
			}
		}
		c.setSlot(s, slotFree)
		return
	}
	if s.state != slotBackend {
		c.close(fmt.Sprintf("backend completion for slot %d in %s", idx, s.state), false)
		return
	}
	if s.control {
		c.finishControl(s)
		return
	}
	if c.srp != nil && s.srp.aborted {
		c.srpAbortDone(s)
		return
	}
	if c.srp != nil && (s.job == jobReserve || s.job == jobReport) {
		c.srpReservationDone(s)
		return
	}
	if s.err != nil {
		c.respond(s, wire.StatusError, c.jobSense(s))
		return
	}
	if s.job == jobRead {
		c.respondRead(s)
		return
	}
	c.respond(s, wire.StatusGood, wire.SenseNone)
}

// ---- receive path ----

func (c *core) repost(idx int32) {
	c.acts.recv = append(c.acts.recv, c.recvWR[idx])
}

func (c *core) recvBuf(idx int32, n uint32) []byte {
	off := int(idx) * recvSize
	return c.p.recv[off : off+int(n)]
}

func (c *core) onRecv(idx int32, n uint32) {
	if n == 0 {
		c.close("empty IU", true)
		return
	}
	buf := c.recvBuf(idx, n)
	op := wire.Opcode(buf[0])
	switch c.state {
	case connLogin:
		if op != wire.OpLogin {
			c.close(fmt.Sprintf("first IU is %s, want LOGIN", op), true)
			return
		}
		c.repost(idx)
		c.onLogin(buf)
	case connChallenge:
		if op != wire.OpLoginProof {
			c.close(fmt.Sprintf("%s while waiting for LOGIN_PROOF", op), true)
			return
		}
		c.repost(idx)
		c.onProof(buf)
	case connRejecting:
		// The peer talks past a reject; the disconnect follows.
	case connActive, connDraining:
		switch c.classify(buf) {
		case iuRequest:
			if c.loggedOut {
				c.close(fmt.Sprintf("%s after LOGOUT", c.iuName(buf)), true)
				return
			}
			c.outstanding++
			if c.outstanding > c.credits {
				c.close(fmt.Sprintf("%d requests outstanding, %d credits granted", c.outstanding, c.credits), true)
				return
			}
			if len(c.free) == 0 {
				// Every slot is busy, some only until their response SEND
				// completes: park the IU (its buffer stays unposted).
				c.pending[(c.pendHead+c.pendN)%len(c.pending)] = pendingIU{idx: idx, n: n, at: c.now}
				c.pendN++
				return
			}
			c.assign(c.takeSlot(), idx, n, c.now)
		case iuAnswer:
			c.srpCredAnswered(idx, buf)
		case iuLogout:
			c.repost(idx)
			c.loggedOut = true
			if c.state == connActive {
				c.setState(connDraining)
			}
			c.checkDrained()
		default:
			c.close(fmt.Sprintf("unexpected %s IU in session", c.iuName(buf)), true)
		}
	}
}

// iuClass is what a session IU asks of the core.
type iuClass uint8

const (
	iuOther   iuClass = iota // not valid in a session
	iuRequest                // a request that costs a credit and takes a slot
	iuLogout                 // the initiator logs out
	iuAnswer                 // an SRP session's SRP_CRED_RSP: no credit, no slot
)

// classify sorts a session IU by the session's protocol. It runs for
// every IU, so the name errors print is left to iuName.
func (c *core) classify(buf []byte) iuClass {
	if c.srp != nil {
		return srpClassify(buf)
	}
	switch wire.Opcode(buf[0]) {
	case wire.OpCommand, wire.OpControl:
		return iuRequest
	case wire.OpLogout:
		return iuLogout
	}
	return iuOther
}

// iuName names a session IU for an error message.
func (c *core) iuName(buf []byte) string {
	if c.srp != nil {
		return srp.Opcode(buf[0]).String()
	}
	return wire.Opcode(buf[0]).String()
}

func (c *core) takeSlot() *slot {
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return &c.slots[i]
}

func (c *core) freeSlot(s *slot) {
	c.setSlot(s, slotFree)
	s.ov = nil
	s.busy = false
	c.free = append(c.free, s.idx)
	if c.pendN > 0 {
		p := c.pending[c.pendHead]
		c.pendHead = (c.pendHead + 1) % len(c.pending)
		c.pendN--
		c.assign(c.takeSlot(), p.idx, p.n, p.at)
		return
	}
	c.checkDrained()
}

// ---- ending ----

// checkDrained disconnects a draining connection once nothing real is in
// flight: every slot is free or only answering Busy, nothing is parked.
func (c *core) checkDrained() {
	if c.state != connDraining || c.pendN > 0 {
		return
	}
	for i := range c.slots {
		if s := &c.slots[i]; s.state != slotFree && !s.busy {
			return
		}
	}
	if c.loggedOut {
		c.close("logged out", false)
	} else {
		c.close("drained for shutdown", false)
	}
}

func (c *core) close(reason string, violation bool) {
	if c.state == connClosed {
		return
	}
	c.setState(connClosed)
	c.acts.disconnect = true
	c.acts.violation = violation
	if c.acts.reason == "" || !c.acts.rejected {
		c.acts.reason = reason
	}
}

// setState is the one place the connection's state changes. A move the
// lifecycle (connNext) does not allow is a bug in the core, never the
// peer's doing: it is refused, recorded in bug for the shell to log and
// the tests to fail on, and the connection is closed.
func (c *core) setState(to connState) {
	from := c.state
	if !slices.Contains(connNext[from], to) {
		c.noteBug(fmt.Errorf("target: connection state %s -> %s is not a transition of its lifecycle", from, to))
		if to != connClosed && from != connClosed {
			c.state = connClosed
			c.acts.disconnect = true
			c.acts.reason = "internal error: " + c.bug.Error()
		}
		return
	}
	c.state = to
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("conn %s -> %s", from, to))
	}
}

// setSlot is the one place a slot's state changes, checked against
// slotNext like setState.
func (c *core) setSlot(s *slot, to slotState) {
	from := s.state
	if !slices.Contains(slotNext[from], to) {
		c.noteBug(fmt.Errorf("target: slot %d state %s -> %s is not a transition of its lifecycle", s.idx, from, to))
		c.close("internal error: "+c.bug.Error(), false)
		return
	}
	s.state = to
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("slot %d %s -> %s", s.idx, from, to))
	}
}

// noteBug keeps the first internal error of the connection.
func (c *core) noteBug(err error) {
	if c.bug == nil {
		c.bug = err
	}
}

// sessionKey names the initiator session this connection is a channel
// of, as Target.OpenSessions counts them: the channels of one session
// share an exclusive open, since the initiator opens a volume on each.
func (c *core) sessionKey() string {
	if c.prOwner == "" {
		c.prOwner = fmt.Sprintf("conn %d", c.p.id)
		if c.session != 0 {
			c.prOwner = fmt.Sprintf("%s\x00%d", c.initiator, c.session)
		}
	}
	return c.prOwner
}
