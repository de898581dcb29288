package target

// Returning an SRP channel's credits outside a response (SRP r16a 6.10,
// 6.11): SRP_CRED_REQ, answered SRP_CRED_RSP.
//
// An aborted command gets no SRP_RSP (core_srp_tmf.go), and its credit
// is owed to the channel's next SRP_RSP. But a LOGICAL UNIT RESET,
// which ib_srp sends on its first channel, aborts the LUN's commands on
// every channel of the nexus, and ib_srp frees the aborted requests
// without giving their credits back (srp_reset_device, srp_finish_req:
// srp_free_req with a delta of 0), while it sends a command only while
// its request limit is above one (__srp_get_tx_iu keeps one for task
// management). A channel whose commands were all aborted, the common case
// after the SCSI error handler timed out a stalled queue, can then send
// nothing, gets no SRP_RSP, and would never see its credits again: that
// hardware queue would hang. So when a channel owes credits and holds no
// request whose SRP_RSP would carry them, the core sends them in an
// SRP_CRED_REQ; ib_srp adds its REQUEST LIMIT DELTA and answers
// SRP_CRED_RSP (srp_process_cred_req).
//
// One SRP_CRED_REQ is outstanding at a time: it is sent from the send
// buffer of the login phase, which an SRP session never uses (its login
// is answered in the CM exchange), and credits owed meanwhile wait for
// its answer, or ride on an SRP_RSP if a request comes first. Neither
// queue overflows: the send queue holds every slot's work requests and
// one more SEND (conn.go), and the receive queue of an SRP session has
// a buffer, beyond the credits' and a logout's, for the SRP_CRED_RSP,
// which costs the initiator no credit. Nor does the initiator's receive
// queue: an SRP_CRED_REQ stands for requests that got no SRP_RSP, so
// the target never has more IUs on their way to the initiator than the
// requests it has sent, at most the credits granted.

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/transport"
)

// srpCredit is the state of a session's SRP_CRED_REQ.
type srpCredit struct {
	// tag is that of the SRP_CRED_REQ awaiting its SRP_CRED_RSP, 0 for
	// none; last is the last tag drawn.
	tag, last uint64
	// sending says its SEND has not completed (the buffer is in use);
	// seq is its send-queue sequence number.
	sending bool
	seq     uint64
	sge     [1]transport.SGE
}

// srpReturnCredits sends the credits the channel owes in an
// SRP_CRED_REQ when no SRP_RSP would carry them: no request is
// outstanding, none is outstanding already, and the session is live.
func (c *core) srpReturnCredits() {
	x := c.srp
	if x == nil || x.owed == 0 || c.outstanding > 0 || x.cred.tag != 0 || x.cred.sending ||
		c.state != connActive || c.loggedOut {
		return
	}
	buf, addr := c.loginBuf()
	r := srp.CredReq{ReqLimDelta: x.owed, Tag: x.cred.last + 1}
	n, err := r.Encode(buf)
	if err != nil {
		c.noteBug(fmt.Errorf("target: encode SRP_CRED_REQ: %w", err))
		c.close("internal error: "+err.Error(), false)
		return
	}
	if !c.sqReserve(1) {
		return
	}
	x.owed = 0
	x.cred.last, x.cred.tag, x.cred.sending, x.cred.seq = r.Tag, r.Tag, true, c.sqPosted
	x.cred.sge[0] = transport.SGE{Addr: addr, Length: uint32(n), LKey: c.p.iuLKey}
	c.acts.send = append(c.acts.send, transport.SendWR{ID: makeWRID(c.p.gen, kindCredReq, 0), Opcode: transport.OpSend,
		Flags: transport.FlagSignaled, SGL: x.cred.sge[:]})
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("SRP_CRED_REQ tag=%d returns %d credits", r.Tag, r.ReqLimDelta))
	}
}

// srpCredSent takes the completion of the SRP_CRED_REQ's SEND: its
// buffer is free again.
func (c *core) srpCredSent() {
	if c.srp == nil || !c.srp.cred.sending {
		c.close("SRP_CRED_REQ completion (none was sent)", false)
		return
	}
	c.reclaim(c.srp.cred.seq)
	c.srp.cred.sending = false
	c.srpReturnCredits()
}

// srpCredAnswered takes the SRP_CRED_RSP buf in receive buffer idx: it
// costs no credit and takes no slot (the buffer is reposted at once),
// and must answer the outstanding SRP_CRED_REQ by its tag (SRP r16a
// 6.11); a malformed, unsolicited or mismatched one ends the connection
// as a protocol violation.
func (c *core) srpCredAnswered(idx int32, buf []byte) {
	var r srp.TargetRsp
	x := &c.srp.cred
	err := r.Decode(buf)
	switch {
	case err != nil:
		c.close("malformed SRP_CRED_RSP: "+err.Error(), true)
	case x.tag == 0:
		c.close(fmt.Sprintf("SRP_CRED_RSP tag=%d with no SRP_CRED_REQ outstanding", r.Tag), true)
	case r.Tag != x.tag:
		c.close(fmt.Sprintf("SRP_CRED_RSP tag=%d, but the SRP_CRED_REQ outstanding is tag=%d", r.Tag, x.tag), true)
	}
	if c.state == connClosed {
		return
	}
	c.repost(idx) // buf is read
	x.tag = 0
	if c.p.trace != nil {
		c.p.trace(fmt.Sprintf("SRP_CRED_RSP tag=%d", r.Tag))
	}
	c.srpReturnCredits()
}
