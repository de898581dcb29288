package initiator

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/enum"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// wr_id tags of the channel's own work requests; the pool uses 0xF7.
const (
	idRecv = 0xE1
	idSend = 0xE2
)

func sendID(slot int, gen uint32) uint64 { return idSend<<56 | uint64(gen)<<24 | uint64(slot) }
func recvID(i int) uint64                { return idRecv<<56 | uint64(i) }

type slotState uint8

const (
	slotFree      slotState = iota
	slotStaged              // chain built, not yet accepted by PostSend
	slotSent                // command posted, response outstanding
	slotResponded           // response in; waiting for the key to be proven dead
)

var slotStateNames = [...]string{slotFree: "FREE", slotStaged: "STAGED", slotSent: "SENT", slotResponded: "RESPONDED"}

func (s slotState) String() string { return enum.Name(slotStateNames[:], s, "slotState") }

// ioSlot is one credit: a send buffer, a bounce buffer and the request
// using them.
type ioSlot struct {
	state   slotState
	gen     uint32
	req     *Request
	reg     frmr.Reg
	hasReg  bool
	rsp     wire.Response
	bounce  int          // offset of the bounce buffer in the session arena
	base    transport.MR // MR over the bounce buffer alone (isolate), windows bind over it
	sendOff int          // offset of the send buffer in the channel arena
	started int64        // when its command was staged (the shell's clock)
	seq     uint64       // the core's count of commands staged, at this one
	sge     [2]transport.SGE
}

// coreParams are what a channel's core works with: the buffers the shell
// allocated and registered, and the session's limits.
type coreParams struct {
	id        int
	credits   int // slots (Config.Credits)
	sqDepth   int
	ioTimeout int64 // ns
	// lossTimeout (ns, Config.LossTimeout) bounds how long a request is
	// re-issued across connections that end with it on them.
	lossTimeout int64
	keepalive   int64  // ns: Config.KeepaliveTimeout, 0 off
	msg         []byte // the channel arena: receive buffers, then send buffers
	msgAddr     uint64
	msgLKey     transport.Key
	data        []byte // the session arena (bounce buffers, then AllocBuffer's)
	dataAddr    uint64
	dataLKey    transport.Key
	dataArena   *transport.Arena
	// zeroCopy reports whether a buffer lies in the session's registered
	// pool (and may be registered in place), and where.
	zeroCopy func([]byte) (frmr.Segment, bool)
	recvWRs  []transport.RecvWR
	pool     *frmr.Pool
}

// doneIO is a request the core has finished with: its slot is free again,
// and the shell delivers it (copying a read out of bounce first, if the
// request went through bounce). bounce is -1 for a request that never got
// a slot.
type doneIO struct {
	req    *Request
	err    error
	bounce int
	rsp    bool // the target answered (stats count it as an I/O)
	// size, if not 0, is the volume's new size from a capacity notice
	// in the response (wire.RespCapacityChanged).
	size int64
}

// coreActions are what the events since the last take asked the shell to
// do, in this order: post the receives, post send (one PostSend, whose
// outcome goes back through posted), deliver done, put requeue back at the
// front of the queue in order, then, if fail is set, tear the connection
// down.
type coreActions struct {
	recv []transport.RecvWR
	send []transport.SendWR
	// regs and regSends hold the registrations and the commands that
	// carry their keys where registrations are fenced
	// (frmr.Config.FenceRegistrations); takeSend puts them after the
	// rest of send, behind one fence, all registrations first.
	regs, regSends []transport.SendWR
	done           []doneIO
	requeue        []*Request
	fail           error
	// ping asks the shell to queue the channel's ping (keepalive.go).
	ping bool
	// paths are the path notices to hand to their volumes.
	paths []pathNote
}

// pathNote is a path notice for an open volume (wire.PathNotice).
type pathNote struct {
	v       *Volume
	standby bool
}

func (a *coreActions) empty() bool {
	return len(a.recv) == 0 && a.sends() == 0 && len(a.done) == 0 && len(a.requeue) == 0 && a.fail == nil && !a.ping &&
		len(a.paths) == 0
}

// sends is how many send WRs are staged, the fence aside.
func (a *coreActions) sends() int { return len(a.send) + len(a.regs) + len(a.regSends) }

// staged is one chain of the batch in acts.send: a command's (REG and)
// SEND, or a LOCAL_INV.
type staged struct {
	slot     int
	end      int // index in acts.send one past the chain
	localInv bool
	regSend  int // 1 + its command's index in regSends; 0 if it has none there
}

// core is a channel's I/O state machine. It takes events (a request to
// start, work completions, the outcome of a post, a tick, the connection
// coming up or going down) and returns actions (work requests to post,
// requests to deliver or re-queue, a reason to tear down). It starts no
// goroutines, reads no clock (the shell passes the time in) and calls no
// provider: the shell (channel) posts, polls and connects. Its one
// collaborator is the registration pool, whose Get, Invalidate and
// completion bookkeeping it drives; replacing MRs after a loss is the
// shell's (Recover allocates on the device).
//
// Rules it keeps, each checked by check and by the traces in
// testdata/core:
//   - a request completes only when its response has arrived, its SEND
//     has completed and its key is proven dead (remote invalidation of
//     exactly its key, or a LOCAL_INV that completed SUCCESS), so a
//     returned I/O leaves no key the target can use;
//   - anything a peer sends that the protocol does not allow (an unknown
//     or stale tag, a second answer, an invalidation of another key, an
//     invalidation for a request without data) ends the connection and
//     completes nothing;
//   - after fail, no event changes anything until reset.
//
// Its events are kept by direction: core_send.go stages and posts
// commands and LOCAL_INVs (start, takeSend, settle), core_recv.go takes
// work completions and responses (completions, onRecv, complete).
type core struct {
	p    coreParams
	pool *frmr.Pool

	up      bool // a connection is logged in and has not failed
	credits int  // granted at login
	avail   int
	// held: the target answered a command BUSY (or TASK SET FULL):
	// nothing is staged until the next tick (retryLater).
	held        bool
	maxImm      int  // largest WRITE sent as immediate data (0: none)
	pathNotices bool // the target sends wire.PathNotice IUs
	remoteInv   bool
	handles     map[*Volume]uint32
	// given are the handles the target's OPEN answers gave on this
	// connection that no CLOSE has named since: open at the target,
	// whether a volume here holds them or an abandoned OPEN's close is
	// on its way. An answer giving one of them again is the target's
	// mistake; taking it would send one volume's I/O to another.
	given       map[uint32]bool
	slots       []ioSlot
	free        []int
	waiting     []int // slots in slotResponded, waiting for their keys
	invPending  []int // responded slots whose LOCAL_INV is still to post
	batch       []staged
	staged      uint64 // commands staged so far (ioSlot.seq)
	order       []int  // reset's scratch
	cmd         wire.Command
	acts        coreActions
	lastFailure error
	// answered counts the I/O requests completed on this connection
	// (control requests do not count): one that ends with none gave the
	// channel nothing for its reconnect (channel.churn).
	answered uint64
	ka       keepalive
	srp      *srpCore // set for a ProtocolSRP session (core_srp.go)
}

func newCore(p coreParams) *core {
	c := &core{p: p, pool: p.pool, handles: map[*Volume]uint32{}, given: map[uint32]bool{}}
	c.ka.timeout = p.keepalive
	c.slots = make([]ioSlot, p.credits)
	c.free = make([]int, 0, p.credits)
	for i := range c.slots {
		c.free = append(c.free, i)
	}
	c.waiting = make([]int, 0, p.credits)
	c.invPending = make([]int, 0, p.credits)
	c.batch = make([]staged, 0, 2*p.credits)
	c.acts.regs = make([]transport.SendWR, 0, p.credits)
	c.acts.regSends = make([]transport.SendWR, 0, p.credits)
	c.order = make([]int, 0, p.credits)
	c.acts.recv = make([]transport.RecvWR, 0, len(p.recvWRs))
	c.acts.send = make([]transport.SendWR, 0, p.sqDepth)
	c.acts.done = make([]doneIO, 0, p.credits)
	c.acts.requeue = make([]*Request, 0, p.credits)
	return c
}

// login is what a successful login granted.
type login struct {
	credits   int
	remoteInv bool
	maxImm    int
	at        int64 // when (the shell's clock): silence counts from here
	// pathNotices: the target will send path notices.
	pathNotices bool
}

// ---- events ----

// connected is a login that succeeded: the connection may carry I/O.
func (c *core) connected(l login) {
	c.credits = min(l.credits, len(c.slots))
	c.avail = c.credits
	c.remoteInv = l.remoteInv
	c.maxImm = l.maxImm
	c.pathNotices = l.pathNotices
	c.up = true
	c.lastFailure = nil
	c.answered = 0
	c.ka.reset(l.at)
}

// setHandle records the handle a volume has on this connection; dropHandle
// forgets it.
func (c *core) setHandle(v *Volume, h uint32) { c.handles[v], c.given[h] = h, true }
func (c *core) dropHandle(v *Volume)          { delete(c.handles, v) }

// handleFree reports whether the target may give h to an OPEN now: not
// 0, and not given on this connection since a CLOSE last named it.
func (c *core) handleFree(h uint32) bool { return h != 0 && !c.given[h] }

// hasHandle reports whether v is open on this connection.
func (c *core) hasHandle(v *Volume) bool {
	_, ok := c.handles[v]
	return ok
}

// canStart reports whether a request could take a credit now.
func (c *core) canStart() bool { return c.up && c.avail > 0 && len(c.free) > 0 }

// tick is the passage of time: the pool's completion deadlines, the I/O
// timeout and the keepalive.
func (c *core) tick(now int64) {
	if !c.up {
		return
	}
	c.held = false // a tick later: the busy target is asked again
	if err := c.pool.Tick(); err != nil {
		c.fail(fmt.Errorf("initiator: %w", err))
		return
	}
	for i := range c.slots {
		if sl := &c.slots[i]; sl.state == slotSent && now-sl.started > c.p.ioTimeout {
			sl.req.timeouts++
			c.fail(fmt.Errorf("initiator: %s outstanding for %s (%w %s)", sl.req.Op, time.Duration(now-sl.started).Round(time.Millisecond), errIOTimeout, time.Duration(c.p.ioTimeout)))
			return
		}
	}
	if c.srp != nil {
		c.srpTick(now)
		if !c.up {
			return
		}
	}
	switch c.ka.tick(now) {
	case kaPing:
		c.acts.ping = true
	case kaDead:
		c.fail(fmt.Errorf("%w: nothing heard for %s (KeepaliveTimeout %s)", errSilent, c.ka.silence(now).Round(time.Millisecond), time.Duration(c.ka.timeout)))
	}
}

// tickDue is when the shell must next call tick. every asks for a tick
// each period while anything is timed: a request or a key not yet proven
// dead (the I/O timeout), a WR the pool waits for (its deadlines count
// ticks), an SRP target that has granted no credit (starvation) or an
// SRP answer still to send. Otherwise at is the keepalive's next
// decision, or 0: an idle channel without a keepalive sleeps until an
// event wakes it, so a host with hundreds of idle sessions spends no CPU
// on them.
func (c *core) tickDue() (at int64, every bool) {
	switch {
	case !c.up:
		return 0, false
	case !c.idle() || len(c.invPending) > 0 || c.pool.Waiting() || c.held:
		return 0, true
	case c.srp != nil && (c.avail == 0 || len(c.srp.answers) > 0):
		return 0, true
	}
	return c.ka.due()
}

// fail ends the connection: no event changes anything until reset.
func (c *core) fail(err error) {
	if !c.up {
		return
	}
	c.up = false
	c.acts.fail = err
	c.lastFailure = err
}

// maxIOTimeouts is how many I/O timeouts a request may end its
// connection with before it fails: the retries Linux's sd and NVMe
// hosts allow a command (SD_MAX_RETRIES, nvme_max_retries: 5), so a
// target that answers everything but one command cannot keep it, and
// its caller, waiting forever.
const maxIOTimeouts = 5

// errIOTimeout is the failure of a connection on which a request went
// unanswered for IOTimeout.
var errIOTimeout = errors.New("I/O timeout")

// unansweredError fails a request whose I/O timeout ended
// maxIOTimeouts connections. It is os.ErrDeadlineExceeded to callers;
// a Multipath takes it for a failed path (failsOver), as Linux's
// dm-multipath retries a timed-out command on another path
// (blk_path_error in include/linux/blk_types.h).
type unansweredError struct {
	what     string
	timeouts int
	timeout  time.Duration
}

func (e *unansweredError) Error() string {
	return fmt.Sprintf("initiator: %s unanswered through %d I/O timeouts of %s: %v", e.what, e.timeouts, e.timeout, os.ErrDeadlineExceeded)
}

// Is makes the error os.ErrDeadlineExceeded.
func (e *unansweredError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// lostError fails a request re-issued across connections that ended with
// it on them, whatever ended them, for Config.LossTimeout from the first.
// A target that breaks the protocol in its answer to a command (an
// invalidation it was not asked for, a malformed response), or cuts the
// connection that carries it, and takes every login again, would
// otherwise have it, and its caller, re-issued for ever: the loss
// timeout of the connection never runs out, since every reconnect
// succeeds. A count would not do: injected faults end five connections
// under one request in well under a second. It is ErrConnectionLost to
// callers (a Multipath fails over on it), and wraps what ended the last
// connection.
type lostError struct {
	what   string
	losses int
	over   time.Duration
	last   error
}

func (e *lostError) Error() string {
	return fmt.Sprintf("initiator: %s was on %d connections that ended in %s, the last with: %v", e.what, e.losses, e.over, e.last)
}

func (e *lostError) Unwrap() []error { return []error{ErrConnectionLost, e.last} }

// reset forgets the connection after the shell tore it down: every
// request that had not completed goes back to the queue in the order it
// was started (xprtrdma's and nvme-rdma's recovery: requests are
// re-issued, MRs never survive a connection), but one that its I/O
// timeout has now ended maxIOTimeouts connections fails, and so does one
// re-issued across ended connections for lossTimeout (lostError). now is
// the shell's clock.
func (c *core) reset(now int64) {
	c.up = false
	c.order = c.order[:0]
	for i := range c.slots {
		if c.slots[i].state != slotFree {
			c.order = append(c.order, i)
		}
	}
	slices.SortFunc(c.order, func(a, b int) int { return cmp.Compare(c.slots[a].seq, c.slots[b].seq) })
	for _, i := range c.order {
		sl := &c.slots[i]
		r := sl.req
		if r != nil && sl.state != slotStaged {
			if r.losses == 0 {
				r.lostAt = now
			}
			r.losses++
		}
		switch {
		case r != nil && r.timeouts >= maxIOTimeouts:
			c.finish(r, &unansweredError{r.what(), int(r.timeouts), time.Duration(c.p.ioTimeout)})
		case r != nil && r.losses > 1 && now-r.lostAt >= c.p.lossTimeout:
			last := c.lastFailure
			if last == nil {
				last = errors.New("initiator: connection torn down")
			}
			c.finish(r, &lostError{r.what(), int(r.losses), time.Duration(now - r.lostAt).Round(time.Millisecond), last})
		default:
			c.requeue(r)
		}
		sl.req, sl.hasReg, sl.state = nil, false, slotFree
	}
	c.free = c.free[:0]
	for i := range c.slots {
		c.free = append(c.free, i)
	}
	c.waiting, c.invPending, c.batch = c.waiting[:0], c.invPending[:0], c.batch[:0]
	c.acts.regs, c.acts.regSends = c.acts.regs[:0], c.acts.regSends[:0]
	c.acts.send = c.acts.send[:0]
	c.acts.recv = c.acts.recv[:0]
	c.avail, c.held = 0, false
	clear(c.handles)
	clear(c.given)
	if c.srp != nil {
		c.srp.reset()
	}
}

// idle reports whether no request holds a credit.
func (c *core) idle() bool { return len(c.free) == len(c.slots) }

// settled reports whether no request that a caller waits for holds a
// credit: those left hold only requests their callers abandoned (an
// Open whose context ended while the target was still opening the
// volume), whose answers nobody reads. Session.Close waits for a
// settled core, not an idle one; the teardown that follows ends what is
// left, as at the end of its wait.
func (c *core) settled() bool {
	for i := range c.slots {
		if sl := &c.slots[i]; sl.state != slotFree && (sl.req == nil || !sl.req.abandoned()) {
			return false
		}
	}
	return true
}

// unfinished are the requests still holding a credit (Close's last word).
func (c *core) unfinished() []*Request {
	var rs []*Request
	for i := range c.slots {
		if sl := &c.slots[i]; sl.req != nil {
			rs = append(rs, sl.req)
			sl.req = nil
		}
	}
	return rs
}

// check verifies the core's invariants: the pool's own (frmr's Check),
// and that every credit slot is accounted for exactly once (free, or
// holding the request it was started for), the responded ones waiting
// for their keys to die.
func (c *core) check() error {
	if err := c.pool.Check(); err != nil {
		return fmt.Errorf("initiator: channel %d: %w", c.p.id, err)
	}
	free := make([]bool, len(c.slots))
	for _, si := range c.free {
		if free[si] {
			return fmt.Errorf("initiator: channel %d: slot %d twice on the free list", c.p.id, si)
		}
		free[si] = true
	}
	waiting := make([]bool, len(c.slots))
	for _, si := range c.waiting {
		waiting[si] = true
	}
	for i := range c.slots {
		sl := &c.slots[i]
		switch {
		case free[i] != (sl.state == slotFree):
			return fmt.Errorf("initiator: channel %d: slot %d in %s, on the free list: %v", c.p.id, i, sl.state, free[i])
		case sl.state == slotFree && sl.req != nil:
			return fmt.Errorf("initiator: channel %d: free slot %d holds a request", c.p.id, i)
		case sl.state != slotFree && sl.req == nil:
			return fmt.Errorf("initiator: channel %d: slot %d in %s holds no request", c.p.id, i, sl.state)
		case sl.state == slotResponded && !waiting[i] && !slices.Contains(c.invPending, i):
			return fmt.Errorf("initiator: channel %d: responded slot %d neither waits for its key nor for its LOCAL_INV", c.p.id, i)
		case sl.state == slotStaged && c.acts.sends() == 0:
			return fmt.Errorf("initiator: channel %d: slot %d staged with nothing to post", c.p.id, i)
		}
	}
	if c.avail < 0 || c.avail > c.credits {
		return fmt.Errorf("initiator: channel %d: %d credits available of %d", c.p.id, c.avail, c.credits)
	}
	return nil
}
