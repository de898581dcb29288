package target

// Notices: the core tells the initiator, unasked, that a volume it has
// open was resized or changed path state at this gateway
// (wire.PathNotice).

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// noticeQueue holds the notices not yet sent. One is on the wire at a
// time, from the login buffer (free once the login response's SEND
// completed): the initiator keeps one receive beyond its credits for
// them (wire.PathNotice), so a second sent before it reposted that
// receive could meet none.
type noticeQueue struct {
	q    []wire.PathNotice
	busy bool
	seq  uint64 // the send queue sequence of the one on the wire
	sge  [1]transport.SGE
}

// pathChanged records that the volume named name is now standby (or
// active) at this gateway: each handle of it gets a notice, if the
// initiator asked for them at login; an SRP session's units of it with
// ALUA on change state (srpPathChanged).
func (c *core) pathChanged(name string, gs gwState) {
	if c.srp != nil && c.state != connClosed {
		c.srpPathChanged(name, gs)
	}
	if !c.pathNotices || (c.state != connActive && c.state != connDraining) {
		return
	}
	st := wire.PathActive
	if gs != gwActive {
		st = wire.PathStandby
	}
	for _, ov := range c.handles {
		if ov == nil || ov.revoked || ov.name != name {
			continue
		}
		c.notice.q = append(c.notice.q, wire.PathNotice{Handle: ov.handle, State: st})
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("handle %d %s now %s (notice queued)", ov.handle, name, st))
		}
	}
	c.sendNotice()
}

// sendNotice posts the next queued notice, unless one is on the wire or
// the login buffer is still in use.
func (c *core) sendNotice() {
	n := &c.notice
	if n.busy || len(n.q) == 0 || c.loginSeq > c.sqDone || (c.state != connActive && c.state != connDraining) {
		return
	}
	buf, addr := c.loginBuf()
	b, err := n.q[0].Encode(buf[:0])
	if err != nil || len(b) > len(buf) || &b[0] != &buf[0] {
		c.close(fmt.Sprintf("cannot encode a path notice: %v", err), false)
		return
	}
	if !c.sqReserve(1) {
		return
	}
	n.q = n.q[1:]
	n.busy, n.seq = true, c.sqPosted
	n.sge[0] = transport.SGE{Addr: addr, Length: uint32(len(b)), LKey: c.p.iuLKey}
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindNotice, 0), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: n.sge[:]})
}

// noticeSent handles the completion of a notice's SEND.
func (c *core) noticeSent() {
	if !c.notice.busy {
		c.close("a path notice completion with none on the wire", false)
		return
	}
	c.reclaim(c.notice.seq)
	c.notice.busy = false
	c.sendNotice()
}

// volumeResized records that the volume named name is now size bytes:
// every handle to it, and the one an OPEN still running will make,
// checks commands against the new size from now on
// (a command already past the check runs against the store, which has
// the new size too), and, if the initiator reads notices, the next
// response on the handle carries one (SPC-4's UNIT ATTENTION "capacity
// data has changed", ASC/ASCQ 2Ah/09h, raised per I_T nexus on each LU:
// here per handle).
func (c *core) volumeResized(name string, size int64) {
	if c.state == connClosed {
		return
	}
	for i := range c.slots {
		if s := &c.slots[i]; s.state == slotBackend && s.control && s.job == jobOpen && s.ctl.Volume == name {
			s.resizedTo = size
		}
	}
	for _, ov := range c.handles {
		if ov == nil || ov.revoked || ov.name != name || ov.size == size {
			continue
		}
		ov.size = size
		ov.resized = c.notices
		if c.p.trace != nil {
			c.p.trace(fmt.Sprintf("handle %d %s resized to %d (notice pending: %v)", ov.handle, name, size, ov.resized))
		}
	}
	if c.srp != nil {
		c.srpResized(name, size)
	}
}
