package target

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// TestCoreTraces drives a connection's core through the traces in
// testdata/core: each command is an event (an IU from the initiator, a
// send completion, a finished backend job, a tick, a drain, the peer
// vanishing) and the output is every state change the core made and what
// it asked the shell for. The harness plays NIC and worker without a
// device. Run with -rewrite after a deliberate change, and read the diff.
func TestCoreTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/core", func(t *testing.T, path string) {
		var h *traceHarness
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.Cmd == "init" {
				credits := 2
				td.MaybeScanArgs(t, "credits", &credits)
				h = &traceHarness{coreHarness: newCoreHarness(t, credits)}
				h.c.p.replays = td.HasArg("replays")
				h.c.p.trace = func(change string) { h.printf("%s\n", change) }
				return "ok"
			}
			if h == nil {
				t.Fatalf("%s: init first", td.Pos)
			}
			out := h.run(t, td)
			if h.c.bug != nil {
				t.Fatalf("%s: the core refused its own move: %v\n%s", td.Pos, h.c.bug, out)
			}
			return out
		})
	})
}

type traceHarness struct {
	*coreHarness
	b      strings.Builder
	nextRx int                // the receive buffer the next IU lands in
	sent   []transport.SendWR // send WRs posted, by label-1
	wcBuf  transport.WC
	// catalogGen numbers the trace's catalog changes.
	catalogGen uint64
}

func (h *traceHarness) printf(format string, args ...any) { fmt.Fprintf(&h.b, format, args...) }

func (h *traceHarness) run(t *testing.T, td *datadriven.TestData) string {
	h.b.Reset()
	c := h.c
	switch td.Cmd {
	case "login":
		req := wire.LoginRequest{Version: wire.Version, Initiator: "i", Credits: 4, MaxIU: 296, MaxRecvIU: 4096, RemoteInvalidate: true}
		var credits int
		if td.MaybeScanArgs(t, "credits", &credits) {
			req.Credits = uint32(credits)
		}
		td.MaybeScanArgs(t, "initiator", &req.Initiator)
		var imm int
		if td.MaybeScanArgs(t, "imm", &imm) {
			req.MaxImmediate = uint32(imm)
		}
		req.Notices = td.HasArg("notices")
		req.PathNotices = td.HasArg("path-notices")
		h.iu(t, wire.OpLogin, &req)
	case "control":
		var op string
		td.ScanArgs(t, "op", &op)
		req := wire.ControlRequest{Op: op}
		td.MaybeScanArgs(t, "vol", &req.Volume)
		td.MaybeScanArgs(t, "tag", &req.Tag)
		var handle int
		if td.MaybeScanArgs(t, "handle", &handle) {
			req.Handle = uint32(handle)
		}
		td.MaybeScanArgs(t, "off", &req.Offset)
		td.MaybeScanArgs(t, "len", &req.Length)
		prControlArgs(t, td, &req) // core_pr_trace_test.go
		h.iu(t, wire.OpControl, &req)
	case "cmd":
		h.cmd(t, td)
	case "srp-login":
		h.srpLogin(t, td)
	case "srp-cmd":
		h.srpCmd(t, td)
	case "srp-iu":
		h.srpIU(t, td)
	case "srp-tmf":
		h.srpTMF(t, td)
	case "srp-answer":
		h.srpAnswer(t, td)
	case "logout":
		h.raw(t, []byte{byte(wire.OpLogout)})
	case "garbage":
		h.raw(t, []byte{0xff, 0xee})
	case "wc":
		h.wc(t, td)
	case "job":
		if len(c.acts.jobs) == 0 {
			t.Fatalf("%s: no job pending", td.Pos)
		}
		idx := c.acts.jobs[0]
		c.acts.jobs = c.acts.jobs[1:]
		runJob(&c.slots[idx], h.cat)
		c.backendDone(idx, 2)
	case "tick":
		var ms int64
		td.ScanArgs(t, "ms", &ms)
		c.tick(ms * 1e6)
	case "resize":
		var vol string
		var size int64
		td.ScanArgs(t, "vol", &vol)
		td.ScanArgs(t, "size", &size)
		c.volumeResized(vol, size)
	case "peer-abort":
		// Another channel of the nexus aborts this one's commands of
		// the LUN; with other-nexus, a LOGICAL UNIT RESET of another
		// I_T nexus on the LUN's volume; with all, another channel's
		// overlapped command, on every unit.
		if td.HasArg("all") {
			c.srpPeerAbort(nil, false, "peer")
			break
		}
		var lun int
		td.ScanArgs(t, "lun", &lun)
		u := c.srpUnitOf(uint16(lun))
		if td.HasArg("other-nexus") {
			u = newSRPNexus(nil, "other").unit(u.name, lun, u.blocks.Load(), false, gwActive, 0, false)
		}
		c.srpPeerAbort(u, td.HasArg("other-nexus"), "peer")
	case "peers-done":
		// The other channels report their commands stopped.
		var slot int
		td.ScanArgs(t, "slot", &slot)
		c.srpPeersDone(int32(slot))
	case "path":
		var vol string
		td.ScanArgs(t, "vol", &vol)
		st := gwActive
		switch {
		case td.HasArg("fenced"):
			st = gwFenced
		case td.HasArg("standby"):
			st = gwStandby
		}
		c.pathChanged(vol, st)
	case "catalog-changed":
		h.catalogChanged(t, td) // core_srp_test.go
	case "pr", "pr-check", "pr-open", "pr-close", "pr-show", "pr-table":
		h.prTrace(t, td) // core_pr_trace_test.go
	case "drain":
		c.drain(3)
	case "peer-gone":
		c.peerGone("peer went away")
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	h.report()
	if h.b.Len() == 0 {
		return "ok"
	}
	return h.b.String()
}

// raw delivers an IU into the next receive buffer and completes it.
func (h *traceHarness) raw(t *testing.T, iu []byte) {
	idx := h.nextRx
	h.nextRx = (h.nextRx + 1) % len(h.c.recvWR)
	h.deliver(idx, iu)
}

func (h *traceHarness) iu(t *testing.T, op wire.Opcode, v any) {
	b, err := wire.EncodeControl(nil, op, v)
	if err != nil {
		t.Fatal(err)
	}
	h.raw(t, b)
}

func (h *traceHarness) cmd(t *testing.T, td *datadriven.TestData) {
	var op string
	td.ScanArgs(t, "op", &op)
	cmd := wire.Command{Op: map[string]wire.Op{"read": wire.OpRead, "write": wire.OpWrite, "flush": wire.OpFlush, "discard": wire.OpDiscard}[op]}
	var handle, off, n, desc int
	td.ScanArgs(t, "handle", &handle)
	td.MaybeScanArgs(t, "tag", &cmd.Tag)
	td.MaybeScanArgs(t, "off", &off)
	td.MaybeScanArgs(t, "len", &n)
	td.MaybeScanArgs(t, "desc", &desc)
	cmd.Volume, cmd.Offset, cmd.Length = uint32(handle), uint64(off), uint32(n)
	for i := 0; i < desc; i++ {
		cmd.Desc[i] = wire.Descriptor{VA: 0x100000 + uint64(i*n/desc), RKey: 0x1234, Len: uint32(n / desc)}
	}
	cmd.NDesc = desc
	if td.HasArg("inv") {
		cmd.Flags |= wire.FlagInvalidate
		cmd.InvalidateKey = 0x1234
	}
	if td.HasArg("fua") {
		cmd.Flags |= wire.FlagFUA
	}
	b := make([]byte, cmd.EncodedLen())
	if _, err := cmd.Encode(b); err != nil {
		t.Fatal(err)
	}
	if td.HasArg("imm") {
		cmd.Flags |= wire.FlagImmediate
		b = make([]byte, cmd.EncodedLen())
		cmd.Encode(b)
		b = append(b, make([]byte, n)...)
	}
	h.raw(t, b)
}

var traceStatus = map[string]transport.Status{
	"success": transport.StatusSuccess, "flush": transport.StatusWRFlushErr,
	"rem-access": transport.StatusRemAccessErr, "retry-exc": transport.StatusRetryExcErr,
}

// wc completes the posted send WR with the given label (and, on
// success, the unsignaled ones before it).
func (h *traceHarness) wc(t *testing.T, td *datadriven.TestData) {
	var l int
	td.ScanArgs(t, "wr", &l)
	if l < 1 || l > len(h.sent) {
		t.Fatalf("%s: no posted WR #%d", td.Pos, l)
	}
	st := "success"
	td.MaybeScanArgs(t, "status", &st)
	status, ok := traceStatus[st]
	if !ok {
		t.Fatalf("%s: unknown status %q", td.Pos, st)
	}
	if status == transport.StatusSuccess {
		h.readRemote(&h.sent[l-1])
	}
	h.wcBuf = transport.WC{ID: h.sent[l-1].ID, Status: status}
	h.c.completion(&h.wcBuf, 3)
}

// report prints and clears what the core asked for.
func (h *traceHarness) report() {
	a := &h.c.acts
	if len(a.recv) > 0 {
		var idx []string
		for _, r := range a.recv {
			_, _, i := splitWRID(r.ID)
			idx = append(idx, fmt.Sprint(i))
		}
		h.printf("post recv %s\n", strings.Join(idx, " "))
	}
	for i := range a.send {
		wr := a.send[i]
		h.sent = append(h.sent, wr)
		h.printf("post #%d %s\n", len(h.sent), h.describe(&wr))
	}
	for _, j := range a.jobs {
		h.printf("job slot %d %s\n", j, jobName(h.c.slots[j].job))
	}
	if a.loggedIn {
		h.printf("logged in\n")
	}
	for _, x := range a.srpAborts {
		what := "every unit"
		if x.unit != nil {
			what = x.unit.name
		}
		h.printf("abort on the other channels of the nexus: %s, for slot %d\n", what, x.slot)
	}
	for _, tok := range a.peerAborted {
		h.printf("%s abort finished here\n", tok)
	}
	if a.disconnect {
		kind := ""
		if a.violation {
			kind = " (violation)"
		}
		if a.rejected {
			kind = " (rejected)"
		}
		h.printf("disconnect%s: %s\n", kind, a.reason)
	}
	jobs := append([]int32(nil), a.jobs...)
	disc, reason, viol, rej := a.disconnect, a.reason, a.violation, a.rejected
	a.reset()
	// Jobs stay pending until a "job" command runs them; the disconnect
	// stays set, as the shell acts on it once.
	a.jobs = append(a.jobs, jobs...)
	a.disconnect, a.reason, a.violation, a.rejected = disc, reason, viol, rej
}

func (h *traceHarness) describe(wr *transport.SendWR) string {
	_, kind, idx := splitWRID(wr.ID)
	sig := ""
	if wr.Flags&transport.FlagSignaled != 0 {
		sig = " signaled"
	}
	switch wr.Opcode {
	case transport.OpRDMARead, transport.OpRDMAWrite:
		return fmt.Sprintf("%s slot=%d raddr=%#x rkey=%s len=%d%s", wr.Opcode, idx, wr.RemoteAddr, wr.RKey, wr.SGL[0].Length, sig)
	case transport.OpSend, transport.OpSendWithInv:
		off := int(wr.SGL[0].Addr - h.c.p.iuAddr)
		b := h.c.p.iu[off : off+int(wr.SGL[0].Length)]
		inv := ""
		if wr.Opcode == transport.OpSendWithInv {
			inv = fmt.Sprintf(" inv=%s", wr.InvalidateKey)
		}
		op, _ := wire.PeekOpcode(b)
		var what string
		if h.c.srp != nil {
			op = wire.Opcode(0) // an SRP_RSP, never a gosrp IU
			what = describeSRPRsp(b)
		}
		switch op {
		case 0:
		case wire.OpResponse:
			var rsp wire.Response
			rsp.Decode(b)
			what = fmt.Sprintf("RESPONSE tag=%d status=%d sense=%s credits=%d", rsp.Tag, rsp.Status, rsp.Sense, rsp.Credits)
			if rsp.Flags&wire.RespCapacityChanged != 0 {
				what += fmt.Sprintf(" capacity-changed size=%d", rsp.Size)
			}
		case wire.OpControlResp:
			var rsp wire.ControlResponse
			wire.DecodeControl(b, op, &rsp)
			what = fmt.Sprintf("CONTROL_RESP tag=%d handle=%d error=%q credits=%d", rsp.Tag, rsp.Handle, rsp.Error, rsp.Credits)
			for _, e := range rsp.Extents {
				what += fmt.Sprintf(" extent=%d/%d", e.Length, e.Flags)
			}
		case wire.OpLoginResponse:
			var rsp wire.LoginResponse
			wire.DecodeControl(b, op, &rsp)
			what = fmt.Sprintf("LOGIN_RESP credits=%d max-transfer=%d remote-inv=%v", rsp.Credits, rsp.MaxTransfer, rsp.RemoteInvalidate)
			if rsp.Notices {
				what += " notices"
			}
			if rsp.PathNotices {
				what += " path-notices"
			}
		case wire.OpPathNotice:
			n, err := wire.DecodePathNotice(b)
			what = fmt.Sprintf("PATH_NOTICE handle=%d state=%s err=%v", n.Handle, n.State, err)
		case wire.OpLoginReject:
			var rej wire.LoginReject
			wire.DecodeControl(b, op, &rej)
			what = fmt.Sprintf("LOGIN_REJECT %s: %s", rej.Reason, rej.Message)
		default:
			what = op.String()
		}
		if kind == kindCredReq { // the login buffer: no slot's
			return fmt.Sprintf("%s %s %s%s", wr.Opcode, kind, what, sig)
		}
		return fmt.Sprintf("%s %s slot=%d %s%s%s", wr.Opcode, kind, idx, what, inv, sig)
	}
	return fmt.Sprintf("%s %s slot=%d%s", wr.Opcode, kind, idx, sig)
}

// TestCoreRefusesImpossibleMoves: the state setters refuse a move their
// lifecycle does not allow, record it as the core's own bug and end the
// connection, whatever the move.
func TestCoreRefusesImpossibleMoves(t *testing.T) {
	for _, tc := range []struct {
		name string
		move func(c *core)
	}{
		{"conn ACTIVE from CLOSED", func(c *core) { c.close("test", false); c.setState(connActive) }},
		{"conn DRAINING from LOGIN", func(c *core) { c.setState(connDraining) }},
		{"slot FREE -> RESPONDING", func(c *core) { c.setSlot(&c.slots[0], slotResponding) }},
		{"slot FREE -> FREE", func(c *core) { c.setSlot(&c.slots[1], slotFree) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newCoreHarness(t, 2)
			tc.move(h.c)
			if h.c.bug == nil {
				t.Fatal("the move was taken")
			}
			if h.c.state != connClosed || !h.c.acts.disconnect {
				t.Fatalf("state %s, disconnect %v: want the connection closed", h.c.state, h.c.acts.disconnect)
			}
		})
	}
}
