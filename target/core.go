package target

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"slices"

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
	instance  uint64 // the Target's write verifier, drawn by the shell
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
}

// policyEffect is one consequence of a policy change on a session.
type policyEffect struct {
	volume string // "" for the session as a whole
	handle uint32
	access Access // what the volume's handle now allows
	reason string
}

func (a *actions) reset() {
	a.recv = a.recv[:0]
	a.send = a.send[:0]
	a.jobs = a.jobs[:0]
	a.loggedIn = false
	a.closeVols = nil
	a.policy = nil
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
	iniRecvIU int
	reqTarget string // the target name the initiator addressed (bound into proofs)
	secret    []byte
	iniNonce  []byte
	tgtNonce  []byte
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
	orphans  []Volume // volumes opened after the connection closed

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
	case kindLogin:
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
		if s.state != slotReadingData {
			c.close(fmt.Sprintf("RDMA READ completion for slot %d in %s", idx, s.state), false)
			return
		}
		c.reclaim(s.sigSeq)
		c.dispatchWrite(s)
	case kindWrite:
		c.close("signaled RDMA WRITE completion (never requested)", false)
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
		}
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
	if c.state == connClosed {
		if s.job == jobOpen && s.opened != nil {
			c.orphans = append(c.orphans, s.opened)
			s.opened = nil
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
	if s.err != nil {
		c.respond(s, wire.StatusError, senseOf(s.err))
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
		switch op {
		case wire.OpCommand, wire.OpControl:
			if c.loggedOut {
				c.close(fmt.Sprintf("%s after LOGOUT", op), true)
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
		case wire.OpLogout:
			c.repost(idx)
			c.loggedOut = true
			if c.state == connActive {
				c.setState(connDraining)
			}
			c.checkDrained()
		default:
			c.close(fmt.Sprintf("unexpected %s IU in session", op), true)
		}
	}
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

// assign decodes the IU in receive buffer idx into slot s, reposts the
// buffer and starts the request.
func (c *core) assign(s *slot, idx int32, n uint32, at int64) {
	buf := c.recvBuf(idx, n)
	s.start = at
	c.setSlot(s, slotReceived)
	s.busy = false
	s.ov = nil
	if wire.Opcode(buf[0]) == wire.OpCommand {
		s.control = false
		err := s.cmd.Decode(buf)
		if err == nil && s.cmd.Immediate != nil {
			// The data arrived with the command: take it out of the
			// receive buffer before the buffer is posted again.
			if n := len(s.cmd.Immediate); n > int(c.maxImm) {
				err = fmt.Errorf("%d bytes of immediate data, %d granted at login", n, c.maxImm)
			} else {
				copy(s.data, s.cmd.Immediate)
			}
			s.cmd.Immediate = nil
		}
		c.repost(idx)
		if err != nil {
			c.close("malformed command: "+err.Error(), true)
			return
		}
		c.startCommand(s)
		return
	}
	s.control = true
	s.ctl = wire.ControlRequest{}
	err := wire.DecodeControl(buf, wire.OpControl, &s.ctl)
	c.repost(idx)
	if err != nil {
		c.close("malformed control request: "+err.Error(), true)
		return
	}
	c.startControl(s)
}

func (c *core) lookup(h uint32) *openVol {
	if h == 0 || int(h) > len(c.handles) {
		return nil
	}
	return c.handles[h-1]
}

func (c *core) startCommand(s *slot) {
	cmd := &s.cmd
	if c.state == connDraining {
		s.busy = true
		c.respond(s, wire.StatusBusy, wire.SenseNone)
		return
	}
	ov := c.lookup(cmd.Volume)
	if ov == nil {
		c.respond(s, wire.StatusError, wire.SenseNoSuchVolume)
		return
	}
	s.ov = ov
	if ov.revoked {
		c.respond(s, wire.StatusError, wire.SenseAccessDenied)
		return
	}
	switch cmd.Op {
	case wire.OpRead, wire.OpWrite:
		if cmd.Length == 0 || cmd.Length > c.maxXfer || cmd.NDesc > c.maxDesc {
			c.respond(s, wire.StatusError, wire.SenseInvalidField)
			return
		}
	case wire.OpDiscard, wire.OpWriteZeroes:
		if cmd.Length == 0 {
			c.respond(s, wire.StatusError, wire.SenseInvalidField)
			return
		}
	}
	if cmd.Op != wire.OpRead && cmd.Op != wire.OpFlush && ov.ro {
		c.respond(s, wire.StatusError, wire.SenseWriteProtected)
		return
	}
	if cmd.Op != wire.OpFlush {
		switch {
		case cmd.Offset%uint64(ov.bs) != 0 || uint64(cmd.Length)%uint64(ov.bs) != 0:
			c.respond(s, wire.StatusError, wire.SenseMisaligned)
			return
		case cmd.Offset > uint64(ov.size) || uint64(cmd.Length) > uint64(ov.size)-cmd.Offset:
			c.respond(s, wire.StatusError, wire.SenseOutOfRange)
			return
		}
	}
	switch cmd.Op {
	case wire.OpWrite:
		if cmd.Flags&wire.FlagImmediate != 0 {
			c.dispatchWrite(s) // the data came with the command
		} else {
			c.postReads(s)
		}
	case wire.OpRead:
		c.dispatch(s, jobRead)
	case wire.OpFlush:
		c.dispatch(s, jobFlush)
	case wire.OpDiscard:
		c.dispatch(s, jobDiscard)
	case wire.OpWriteZeroes:
		c.dispatch(s, jobWriteZeroes)
	}
}

// sqReserve accounts for n more send WRs; false means the send queue
// would overflow (a bug: slots are sized so it cannot happen).
func (c *core) sqReserve(n int) bool {
	if c.sqPosted+uint64(n)-c.sqDone > uint64(c.p.sqDepth) {
		c.close(fmt.Sprintf("send queue would overflow: %d in use + %d > %d", c.sqPosted-c.sqDone, n, c.p.sqDepth), false)
		return false
	}
	c.sqPosted += uint64(n)
	return true
}

// reclaim records that the signaled WR at sequence seq completed, which
// frees its SQ entry and every one before it (docs/verbs.md#completions).
func (c *core) reclaim(seq uint64) {
	if seq > c.sqDone {
		c.sqDone = seq
	}
}

func (c *core) nonEmptyDesc(s *slot) int {
	n := 0
	for i := 0; i < s.cmd.NDesc; i++ {
		if s.cmd.Desc[i].Len > 0 {
			n++
		}
	}
	return n
}

// appendRDMA queues one unsignaled RDMA READ or WRITE per non-empty
// descriptor of the slot's command, between the slot's data buffer and
// the initiator's memory, and returns how many.
func (c *core) appendRDMA(s *slot, kind wrKind, op transport.Opcode) int {
	var off uint64
	k := 0
	for i := 0; i < s.cmd.NDesc; i++ {
		d := &s.cmd.Desc[i]
		if d.Len == 0 {
			continue
		}
		s.sges[k] = transport.SGE{Addr: s.dataAddr + off, Length: d.Len, LKey: c.p.dataLKey}
		c.acts.send = append(c.acts.send, transport.SendWR{
			ID: makeWRID(c.p.gen, kind, int(s.idx)), Opcode: op,
			SGL: s.sges[k : k+1], RemoteAddr: d.VA, RKey: transport.Key(d.RKey),
		})
		off += uint64(d.Len)
		k++
	}
	return k
}

// postReads fetches a WRITE's data: one RDMA READ per descriptor into the
// slot's data buffer, the last one signaled.
func (c *core) postReads(s *slot) {
	n := c.nonEmptyDesc(s)
	if !c.sqReserve(n) {
		return
	}
	c.appendRDMA(s, kindRead, transport.OpRDMARead)
	c.acts.send[len(c.acts.send)-1].Flags = transport.FlagSignaled
	s.sigSeq = c.sqPosted
	c.setSlot(s, slotReadingData)
}

// dispatchWrite hands a WRITE whose data is in the slot's buffer to the
// backend, unless the policy changed while its data was on the way.
func (c *core) dispatchWrite(s *slot) {
	switch {
	case s.ov.revoked:
		c.respond(s, wire.StatusError, wire.SenseAccessDenied)
		return
	case s.ov.ro:
		c.respond(s, wire.StatusError, wire.SenseWriteProtected)
		return
	}
	if s.cmd.Flags&wire.FlagFUA != 0 {
		c.dispatch(s, jobWriteFUA)
	} else {
		c.dispatch(s, jobWrite)
	}
}

func (c *core) dispatch(s *slot, j jobKind) {
	s.job = j
	s.err = nil
	c.setSlot(s, slotBackend)
	if s.ov != nil && !s.control {
		s.ov.inflight.Add(1)
	}
	c.jobsInFlight++
	c.acts.jobs = append(c.acts.jobs, s.idx)
}

// respondRead pushes a READ's data with unsignaled RDMA WRITEs chained in
// front of the response SEND: RC ordering places the data first, and the
// SEND's completion proves the WRITEs are done too.
func (c *core) respondRead(s *slot) {
	n := c.nonEmptyDesc(s)
	if !c.sqReserve(n + 1) {
		return
	}
	k := c.appendRDMA(s, kindWrite, transport.OpRDMAWrite)
	c.postResponse(s, wire.StatusGood, wire.SenseNone, k)
	c.setSlot(s, slotWritingData)
}

// respond answers a command with no data to move.
func (c *core) respond(s *slot, st wire.Status, sense wire.Sense) {
	if !c.sqReserve(1) {
		return
	}
	c.postResponse(s, st, sense, 0)
	c.setSlot(s, slotResponding)
}

// postResponse encodes the Response into the slot's send buffer and
// appends its SEND (SQ space already reserved), using sges[k].
func (c *core) postResponse(s *slot, st wire.Status, sense wire.Sense, k int) {
	cmd := &s.cmd
	r := wire.Response{Status: st, Sense: sense, Credits: 1, Tag: cmd.Tag}
	if st != wire.StatusGood && cmd.Op.HasData() {
		r.Residual = cmd.Length
	}
	r.Encode(s.send)
	s.sges[k] = transport.SGE{Addr: s.sendAddr, Length: wire.ResponseLen, LKey: c.p.iuLKey}
	wr := transport.SendWR{ID: makeWRID(c.p.gen, kindResp, int(s.idx)), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: s.sges[k : k+1]}
	// Remote invalidation only when both sides agreed and the command asked
	// for it. Never with an RDMA READ of that MR outstanding: a WRITE's
	// response is posted only after its READs completed.
	if cmd.Flags&wire.FlagInvalidate != 0 && c.remoteInv {
		wr.Opcode = transport.OpSendWithInv
		wr.InvalidateKey = transport.Key(cmd.InvalidateKey)
	}
	c.acts.send = append(c.acts.send, wr)
	s.sigSeq = c.sqPosted
	c.outstanding--
	lat := c.now - s.start
	failed := st != wire.StatusGood
	c.p.connStats.record(cmd.Op, cmd.Length, failed, lat)
	if s.ov != nil {
		s.ov.stats.record(cmd.Op, cmd.Length, failed, lat)
	}
}

// ---- control requests ----

func (c *core) startControl(s *slot) {
	req := &s.ctl
	if c.state == connDraining {
		s.busy = true
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInternal, Error: "target shutting down"})
		return
	}
	switch req.Op {
	case wire.ControlList:
		c.dispatch(s, jobList)
	case wire.ControlOpen:
		acc := c.p.acl().Allow(c.initiator, req.Volume)
		if acc == AccessNone {
			c.controlRespond(s, c.deniedOpen(req.Volume))
			return
		}
		if c.nhandles >= maxHandles {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInvalidField,
				Error: fmt.Sprintf("too many open volumes (max %d per connection)", maxHandles)})
			return
		}
		s.ctlRO = req.ReadOnly || acc == AccessReadOnly
		c.dispatch(s, jobOpen)
	case wire.ControlClose:
		ov := c.lookup(req.Handle)
		if ov == nil {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseNoSuchVolume,
				Error: fmt.Sprintf("no open volume with handle %d", req.Handle)})
			return
		}
		c.handles[req.Handle-1] = nil
		c.nhandles--
		if ov.revoked {
			// The shell closed the volume when it was revoked; only the
			// number was still reserved.
			c.controlRespond(s, &wire.ControlResponse{})
			return
		}
		s.ov = ov
		c.dispatch(s, jobClose)
	default:
		c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseUnsupported,
			Error: fmt.Sprintf("unknown control operation %q", req.Op)})
	}
}

func (c *core) finishControl(s *slot) {
	req := &s.ctl
	switch s.job {
	case jobList:
		if s.err != nil {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseInternal, Error: "list volumes: " + s.err.Error()})
			return
		}
		rsp := &wire.ControlResponse{Volumes: []wire.VolumeInfo{}}
		for _, v := range s.list {
			acc := c.p.acl().Allow(c.initiator, v.Name)
			if acc == AccessNone {
				continue
			}
			rsp.Volumes = append(rsp.Volumes, wire.VolumeInfo{Name: v.Name, Size: uint64(v.Size),
				BlockSize: uint32(v.BlockSize), ReadOnly: v.ReadOnly || acc == AccessReadOnly})
		}
		s.list = nil
		c.controlRespond(s, rsp)
	case jobOpen:
		if s.err != nil {
			c.controlRespond(s, &wire.ControlResponse{Sense: wire.SenseNoSuchVolume,
				Error: fmt.Sprintf("open volume %q: %v", req.Volume, s.err)})
			return
		}
		// The policy may have changed while the volume was being opened:
		// what it says now is what the handle gets.
		switch c.p.acl().Allow(c.initiator, req.Volume) {
		case AccessNone:
			c.acts.closeVols = append(c.acts.closeVols, &openVol{name: req.Volume, vol: s.opened})
			s.opened = nil
			c.controlRespond(s, c.deniedOpen(req.Volume))
			return
		case AccessReadOnly:
			s.ctlRO = true
		}
		info := s.openInfo
		ov := &openVol{name: req.Volume, vol: s.opened, size: info.Size, bs: int64(info.BlockSize),
			ro: s.ctlRO || info.ReadOnly, stats: c.p.volStats(req.Volume)}
		if im, ok := s.opened.(Immediate); ok {
			ov.now = im.Immediate()
		}
		if bw, ok := s.opened.(BatchWriter); ok && !ov.now && !ov.ro {
			ov.batch = bw
		}
		s.opened = nil
		h := -1
		for i, x := range c.handles {
			if x == nil {
				h = i
				break
			}
		}
		if h < 0 {
			c.handles = append(c.handles, ov)
			h = len(c.handles) - 1
		} else {
			c.handles[h] = ov
		}
		c.nhandles++
		ov.handle = uint32(h + 1)
		caps := wire.CapFlush
		if !ov.ro {
			caps |= wire.CapFUA | wire.CapDiscard | wire.CapWriteZeroes
		}
		c.controlRespond(s, &wire.ControlResponse{Handle: ov.handle, Size: uint64(ov.size),
			BlockSize: uint32(ov.bs), ReadOnly: ov.ro, Caps: caps})
	case jobClose:
		s.ov = nil
		rsp := &wire.ControlResponse{}
		if s.err != nil {
			rsp.Sense, rsp.Error = wire.SenseInternal, "close: "+s.err.Error()
		}
		c.controlRespond(s, rsp)
	}
}

func (c *core) deniedOpen(volume string) *wire.ControlResponse {
	return &wire.ControlResponse{Sense: wire.SenseAccessDenied,
		Error: fmt.Sprintf("access denied: initiator %q may not open volume %q", c.initiator, volume)}
}

// controlRespond posts a ControlResponse; one that does not fit the
// initiator's receive buffer becomes an error.
func (c *core) controlRespond(s *slot, rsp *wire.ControlResponse) {
	if !c.sqReserve(1) {
		return
	}
	rsp.Tag = s.ctl.Tag
	rsp.Credits = 1
	limit := min(iuSize, c.iniRecvIU)
	b, err := wire.EncodeControl(s.send[:0], wire.OpControlResp, rsp)
	if err != nil || len(b) > limit {
		msg := fmt.Sprintf("control response of %d bytes does not fit the %d-byte receive buffer", len(b), limit)
		if err != nil {
			msg = err.Error()
		}
		b, _ = wire.EncodeControl(s.send[:0], wire.OpControlResp,
			&wire.ControlResponse{Tag: s.ctl.Tag, Credits: 1, Sense: wire.SenseInternal, Error: msg})
	}
	if len(b) > len(s.send) || &b[0] != &s.send[0] {
		// EncodeControl outgrew the buffer and reallocated; copy what fits.
		n := copy(s.send, b)
		b = s.send[:n]
	}
	s.sges[0] = transport.SGE{Addr: s.sendAddr, Length: uint32(len(b)), LKey: c.p.iuLKey}
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindResp, int(s.idx)),
		Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: s.sges[0:1]})
	s.sigSeq = c.sqPosted
	c.outstanding--
	c.setSlot(s, slotResponding)
}

// ---- login ----

func (c *core) loginBuf() ([]byte, uint64) {
	off := len(c.slots) * iuSize
	return c.p.iu[off : off+iuSize], c.p.iuAddr + uint64(off)
}

func (c *core) sendLogin(op wire.Opcode, v any) {
	buf, addr := c.loginBuf()
	b, err := wire.EncodeControl(buf[:0], op, v)
	if err != nil || len(b) > iuSize || len(b) > c.iniRecvIU {
		c.close(fmt.Sprintf("cannot encode %s (%d bytes): %v", op, len(b), err), false)
		return
	}
	if !c.sqReserve(1) {
		return
	}
	c.loginSeq = c.sqPosted
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindLogin, 0), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: []transport.SGE{{Addr: addr, Length: uint32(len(b)), LKey: c.p.iuLKey}}})
}

// rejectGrace bounds how long a LoginReject may take to be acknowledged.
const rejectGrace = int64(2e9)

func (c *core) reject(reason wire.RejectReason, msg string) {
	rej := &wire.LoginReject{Reason: reason, Message: msg}
	if reason == wire.RejectVersion {
		rej.MinVersion, rej.MaxVersion = wire.Version, wire.Version
	}
	c.acts.rejected = true
	c.acts.reason = fmt.Sprintf("login rejected: %s: %s", reason, msg)
	c.sendLogin(wire.OpLoginReject, rej)
	if c.state == connClosed {
		return
	}
	c.setState(connRejecting)
	c.deadline = c.now + rejectGrace
}

const maxNonce = 256

func (c *core) onLogin(buf []byte) {
	var req wire.LoginRequest
	if err := wire.DecodeControl(buf, wire.OpLogin, &req); err != nil {
		c.reject(wire.RejectProtocol, "malformed login request: "+err.Error())
		return
	}
	c.initiator = req.Initiator
	c.reqTarget = req.Target
	c.session, c.channel = req.Session, req.Channel
	if req.MaxRecvIU != 0 {
		c.iniRecvIU = int(req.MaxRecvIU)
	}
	switch {
	case req.Version != wire.Version:
		c.reject(wire.RejectVersion, fmt.Sprintf("protocol version %d unsupported (want %d)", req.Version, wire.Version))
		return
	case req.Target != "" && req.Target != c.p.name:
		c.reject(wire.RejectAccessDenied, fmt.Sprintf("no target named %q here (this is %q)", req.Target, c.p.name))
		return
	case req.MaxIU > iuSize:
		c.reject(wire.RejectIUTooLarge, fmt.Sprintf("initiator IUs of up to %d bytes, target receives %d", req.MaxIU, iuSize))
		return
	case c.iniRecvIU < 256:
		c.iniRecvIU = iuSize // a reject must still be sendable
		c.reject(wire.RejectIUTooLarge, fmt.Sprintf("initiator receives IUs of %d bytes, target needs at least 256", req.MaxRecvIU))
		return
	case len(req.Nonce) > maxNonce:
		c.reject(wire.RejectProtocol, fmt.Sprintf("login nonce of %d bytes (max %d)", len(req.Nonce), maxNonce))
		return
	}
	if req.Credits > 0 {
		c.credits = min(int(req.Credits), c.p.credits)
	}
	if req.MaxTransfer > 0 {
		c.maxXfer = min(req.MaxTransfer, uint32(c.p.maxXfer))
	}
	if req.MaxDesc > 0 {
		c.maxDesc = min(int(req.MaxDesc), c.p.maxDesc)
	}
	c.remoteInv = req.RemoteInvalidate && c.p.offerInv
	c.maxImm = min(req.MaxImmediate, maxImmediate, c.maxXfer)
	if c.p.secrets != nil {
		secret, required := c.p.secrets(req.Initiator)
		c.authMark = c.mark(secret, required)
		if required {
			if len(secret) == 0 {
				c.reject(wire.RejectAuthFailed, "authentication required and no secret configured for this initiator")
				return
			}
			c.secret = secret
			c.iniNonce = append([]byte(nil), req.Nonce...)
			c.tgtNonce = make([]byte, 32)
			c.p.rand(c.tgtNonce)
			c.sendLogin(wire.OpLoginChallenge, &wire.LoginChallenge{Method: "hmac-sha256", Nonce: c.tgtNonce})
			if c.state != connClosed {
				c.setState(connChallenge)
			}
			return
		}
	}
	c.accept(nil)
}

func (c *core) onProof(buf []byte) {
	var p wire.LoginProof
	if err := wire.DecodeControl(buf, wire.OpLoginProof, &p); err != nil {
		c.reject(wire.RejectProtocol, "malformed login proof: "+err.Error())
		return
	}
	want := wire.LoginProofFor(c.secret, "initiator", c.initiator, c.reqTarget, c.iniNonce, c.tgtNonce)
	if !hmac.Equal(p.Proof, want) {
		c.reject(wire.RejectAuthFailed, "authentication failed")
		return
	}
	c.accept(wire.LoginProofFor(c.secret, "target", c.initiator, c.reqTarget, c.iniNonce, c.tgtNonce))
}

func (c *core) accept(proof []byte) {
	c.sendLogin(wire.OpLoginResponse, &wire.LoginResponse{
		Version: wire.Version, Target: c.p.name, Credits: uint32(c.credits),
		MaxIU: iuSize, MaxRecvIU: uint32(min(iuSize, c.iniRecvIU)),
		MaxTransfer: c.maxXfer, MaxDesc: uint8(c.maxDesc), RemoteInvalidate: c.remoteInv,
		SessionID: c.p.id, Proof: proof, MaxImmediate: c.maxImm, Instance: c.p.instance,
	})
	if c.state == connClosed {
		return
	}
	c.setState(connActive)
	c.secret = nil
	c.acts.loggedIn = true
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

// openVolumes returns every volume the connection still holds, for the
// shell to close at teardown.
func (c *core) openVolumes() []*openVol {
	var out []*openVol
	for _, ov := range c.handles {
		if ov != nil && !ov.revoked {
			out = append(out, ov)
		}
	}
	return out
}

// ---- policy ----

// mark is the keyed digest of a Config.Secrets answer (see authMark).
func (c *core) mark(secret []byte, required bool) [sha256.Size]byte {
	if c.markKey == nil {
		c.markKey = make([]byte, 32)
		c.p.rand(c.markKey)
	}
	h := hmac.New(sha256.New, c.markKey)
	if required {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	h.Write(secret)
	var m [sha256.Size]byte
	h.Sum(m[:0])
	return m
}

// policyChanged re-evaluates the session against the current ACL and
// secrets (Target.SetACL, Target.PolicyChanged). A session whose
// initiator's secret changed or went away ends: it must log in again
// and prove the new one (a login waiting for its proof is rejected). A
// handle whose volume the ACL no longer allows is revoked: its volume is
// closed and its commands are answered AccessDenied; one narrowed to
// read-only answers writes WriteProtected. Commands the volume is
// already running finish. Wider access is not granted to open handles:
// the initiator asked for, and was told, what it has.
func (c *core) policyChanged(now int64) {
	c.now = now
	switch c.state {
	case connChallenge, connActive, connDraining:
	default:
		// Not logged in yet (the login reads the policy afresh), or
		// ending anyway.
		return
	}
	if c.p.secrets != nil {
		if secret, required := c.p.secrets(c.initiator); c.mark(secret, required) != c.authMark {
			const why = "the initiator's secret changed or was removed: it must log in again"
			c.acts.policy = append(c.acts.policy, policyEffect{reason: why})
			if c.state == connChallenge {
				c.reject(wire.RejectAuthFailed, why)
				return
			}
			c.close(why, false)
			return
		}
	}
	if c.state == connChallenge {
		return
	}
	acl := c.p.acl()
	for _, ov := range c.handles {
		if ov == nil || ov.revoked {
			continue
		}
		switch acc := acl.Allow(c.initiator, ov.name); {
		case acc == AccessNone:
			ov.revoked = true
			c.acts.closeVols = append(c.acts.closeVols, ov)
			c.acts.policy = append(c.acts.policy, policyEffect{volume: ov.name, handle: ov.handle, access: AccessNone,
				reason: "access revoked: volume closed"})
		case acc == AccessReadOnly && !ov.ro:
			ov.ro = true
			c.acts.policy = append(c.acts.policy, policyEffect{volume: ov.name, handle: ov.handle, access: AccessReadOnly,
				reason: "access narrowed to read-only"})
		}
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
