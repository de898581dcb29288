package initiator

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestCoreTraces drives a channel's core through the traces in
// testdata/core: each command is an event (a request, the outcome of a
// post, a completion, a receive the target sent, a tick, a teardown) and
// the output is what the core asked for. The harness plays the shell
// without a QP: it posts nothing, it only reports. Run with -rewrite to
// regenerate the expected output after a deliberate change, and read the
// diff.
func TestCoreTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/core", func(t *testing.T, path string) {
		var h *coreHarness
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.Cmd == "init" {
				h = newCoreHarness(t, td)
				return "ok"
			}
			if h == nil {
				t.Fatalf("%s: init first", td.Pos)
			}
			out := h.run(t, td)
			// Every step keeps the core's invariants, whatever the peer
			// did.
			if err := h.core.check(); err != nil {
				t.Fatalf("%s: after %s: %v\n%s", td.Pos, td.Cmd, err, out)
			}
			return out
		})
	})
}

// coreHarness is the shell's part in a trace: the buffers, the request
// queue and the names of things.
type coreHarness struct {
	prov    *emu.Provider
	pd      transport.PD
	msg     *transport.Arena
	msgMR   transport.MR
	data    *transport.Arena
	dataMR  transport.MR
	core    *core
	recvWRs []transport.RecvWR
	rqDepth int

	queue    []*Request
	reqs     map[string]*Request
	names    map[*Request]string
	vols     map[string]*Volume
	labels   []transport.SendWR // every WR posted, by label-1
	keys     map[string]transport.Key
	tags     map[string]uint64
	recvFree []int // receive buffers posted and not yet used
	b        strings.Builder
	srp      bool            // the core is in SRP mode (core_srp_test.go)
	invDone  map[uint32]bool // SRP: keys whose LOCAL_INV completed SUCCESS
}

func newCoreHarness(t testing.TB, td *datadriven.TestData) *coreHarness {
	credits, mech, profile := 2, "frmr", "strict"
	td.MaybeScanArgs(t, "credits", &credits)
	td.MaybeScanArgs(t, "mech", &mech)
	td.MaybeScanArgs(t, "profile", &profile)
	sqDepth := 3*credits + 8
	td.MaybeScanArgs(t, "sq", &sqDepth)
	prov, err := emu.New(emu.Config{Profile: profile, Wire: emu.WireLoop, Seed: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := prov.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	h := &coreHarness{prov: prov, pd: pd, rqDepth: credits + 1,
		reqs: map[string]*Request{}, names: map[*Request]string{}, vols: map[string]*Volume{},
		keys: map[string]transport.Key{}, tags: map[string]uint64{}}
	const maxXfer = 16 << 10
	h.msg, _ = transport.NewArena(h.rqDepth*recvIU+(credits+1)*sendIU, transport.ArenaOptions{})
	h.data, _ = transport.NewArena(credits*maxXfer, transport.ArenaOptions{})
	if h.msgMR, err = pd.RegMR(h.msg, 0, h.msg.Len(), transport.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if h.dataMR, err = pd.RegMR(h.data, 0, h.data.Len(), transport.AccessLocalWrite|transport.AccessMWBind); err != nil {
		t.Fatal(err)
	}
	m := frmr.FRMR
	if mech == "mw" {
		m = frmr.MW
	}
	pool, err := frmr.New(frmr.Config{PD: pd, Caps: dev.Attr().Caps, Mechanism: m, Size: credits,
		MaxPages: maxXfer/transport.PageSize + 1, BaseMR: h.dataMR, SQDepth: sqDepth, IOVATag: true, DeadlineTicks: 50})
	if err != nil {
		t.Fatal(err)
	}
	h.recvWRs = make([]transport.RecvWR, h.rqDepth)
	for i := range h.recvWRs {
		sge := []transport.SGE{{Addr: h.msgMR.Addr() + uint64(i*recvIU), Length: recvIU, LKey: h.msgMR.LKey()}}
		h.recvWRs[i] = transport.RecvWR{ID: recvID(i), SGL: sge}
		h.recvFree = append(h.recvFree, i)
	}
	h.core = newCore(coreParams{id: 0, credits: credits, sqDepth: sqDepth, ioTimeout: int64(time.Second), lossTimeout: int64(time.Minute),
		msg: h.msg.Bytes(), msgAddr: h.msgMR.Addr(), msgLKey: h.msgMR.LKey(),
		data: h.data.Bytes(), dataAddr: h.dataMR.Addr(), dataLKey: h.dataMR.LKey(), dataArena: h.data,
		zeroCopy: func([]byte) (frmr.Segment, bool) { return frmr.Segment{}, false },
		recvWRs:  h.recvWRs, pool: pool})
	if td.HasArg("srp") {
		h.srp, h.invDone = true, map[uint32]bool{}
		h.core.srp = newSRPCore(credits, h.rqDepth)
	}
	for i := range h.core.slots {
		h.core.slots[i].bounce = i * maxXfer
		h.core.slots[i].sendOff = h.rqDepth*recvIU + (i+1)*sendIU
	}
	t.Cleanup(func() {
		pool.Close()
		h.dataMR.Close()
		h.msgMR.Close()
		pd.Close()
		prov.Close()
		h.msg.Close()
		h.data.Close()
	})
	return h
}

func (h *coreHarness) printf(format string, args ...any) { fmt.Fprintf(&h.b, format, args...) }

func (h *coreHarness) run(t testing.TB, td *datadriven.TestData) string {
	h.b.Reset()
	postN, postErr := -1, error(nil)
	if td.HasArg("post") {
		td.ScanArgs(t, "post", &postN)
	}
	if td.HasArg("post-err") {
		var e string
		td.ScanArgs(t, "post-err", &e)
		postErr = map[string]error{"queue-full": transport.ErrQueueFull, "disconnected": transport.ErrDisconnected}[e]
	}
	c := h.core
	switch td.Cmd {
	case "connect":
		l := login{credits: len(c.slots)}
		td.MaybeScanArgs(t, "credits", &l.credits)
		td.MaybeScanArgs(t, "imm", &l.maxImm)
		l.remoteInv = td.HasArg("remote-inv")
		l.pathNotices = td.HasArg("path-notices")
		var ka, at int
		td.MaybeScanArgs(t, "keepalive-ms", &ka)
		td.MaybeScanArgs(t, "at-ms", &at)
		c.ka.timeout, l.at = int64(ka)*int64(time.Millisecond), int64(at)*int64(time.Millisecond)
		c.connected(l)
		h.recvFree = h.recvFree[:0]
		for i := range h.recvWRs {
			h.recvFree = append(h.recvFree, i)
		}
	case "open":
		var name string
		var handle int
		td.ScanArgs(t, "vol", &name)
		td.ScanArgs(t, "handle", &handle)
		v := h.vols[name]
		if v == nil {
			v = &Volume{name: name, bs: 4096}
			h.vols[name] = v
		}
		if td.HasArg("unmap") {
			v.caps |= wire.CapDiscard
		}
		c.setHandle(v, uint32(handle))
	case "submit":
		h.submit(t, td)
	case "abandon":
		var name string
		td.ScanArgs(t, "name", &name)
		h.printf("abandoned: %v\n", h.reqs[name].abandon())
	case "dispatch":
		// ms: the time of the pass (the shell's clock), 0 unless given.
		var ms int
		if td.HasArg("ms") {
			td.ScanArgs(t, "ms", &ms)
		}
		if c.stageInvalidations() {
			for c.canStart() && len(h.queue) > 0 {
				r := h.queue[0]
				h.queue = h.queue[1:]
				if r.abandoned() {
					h.printf("drop %s (abandoned)\n", h.names[r])
					continue
				}
				if !c.start(r, int64(ms)*int64(time.Millisecond)) {
					h.queue = slices.Insert(h.queue, 0, r)
					break
				}
			}
		}
	case "wc":
		h.wc(t, td)
	case "recv":
		h.recv(t, td)
	case "tick":
		var ms int
		td.ScanArgs(t, "ms", &ms)
		c.tick(int64(ms) * int64(time.Millisecond))
	case "teardown":
		// The shell's fail: QP to ERR, nothing drained, registrations
		// replaced, then the core forgets the connection. ms: the
		// shell's clock, 0 unless given.
		var ms int
		if td.HasArg("ms") {
			td.ScanArgs(t, "ms", &ms)
		}
		c.fail(errors.New("teardown"))
		c.acts.fail = nil
		c.pool.OnQPError()
		c.pool.Reset()
		if err := c.pool.Recover(); err != nil {
			h.printf("recover: %v\n", err)
		}
		c.reset(int64(ms) * int64(time.Millisecond))
	case "due":
		// When the shell must tick next (tickDue).
		switch at, every := c.tickDue(); {
		case every:
			h.printf("due: every tick\n")
		case at != 0:
			h.printf("due: at %v\n", time.Duration(at))
		default:
			h.printf("due: never\n")
		}
		return h.b.String()
	case "check":
		// The harness checks after every step; this names the moment.
	case "slots":
		for i := range c.slots {
			sl := &c.slots[i]
			h.printf("slot %d %s %s\n", i, sl.state, h.names[sl.req])
		}
		h.printf("avail %d/%d waiting %v inv-pending %v\n", c.avail, c.credits, c.waiting, c.invPending)
		return h.b.String()
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	h.apply(postN, postErr)
	if h.b.Len() == 0 {
		return "ok"
	}
	return h.b.String()
}

func (h *coreHarness) submit(t testing.TB, td *datadriven.TestData) {
	var name, op string
	td.ScanArgs(t, "name", &name)
	td.ScanArgs(t, "op", &op)
	vol := "v0"
	td.MaybeScanArgs(t, "vol", &vol)
	v := h.vols[vol]
	if v == nil {
		v = &Volume{name: vol, bs: 4096}
		h.vols[vol] = v
	}
	r := &Request{vol: v}
	var off, n int
	td.MaybeScanArgs(t, "off", &off)
	td.MaybeScanArgs(t, "len", &n)
	r.Offset = int64(off)
	r.FUA = td.HasArg("fua")
	switch op {
	case "read":
		r.Op, r.Buf = OpRead, make([]byte, n)
	case "write":
		r.Op, r.Buf = OpWrite, make([]byte, n)
	case "flush":
		r.Op = OpFlush
	case "discard":
		r.Op, r.Length = OpDiscard, int64(n)
	case "list":
		r.Op, r.ctrl = opControl, &wire.ControlRequest{Op: wire.ControlList}
	case "close":
		r.Op, r.ctrl = opControl, &wire.ControlRequest{Op: wire.ControlClose}
	default:
		t.Fatalf("%s: unknown op %q", td.Pos, op)
	}
	h.reqs[name], h.names[r] = r, name
	h.queue = append(h.queue, r)
}

// apply is the shell's apply without a device: receives are "reposted",
// the batch is "posted" (all of it, or the first postN WRs with postErr),
// and the rest is printed.
func (h *coreHarness) apply(postN int, postErr error) {
	c := h.core
	a := &c.acts
	for !a.empty() {
		for _, wr := range a.recv {
			idx := int(wr.ID & 0xffffff)
			h.recvFree = append(h.recvFree, idx)
			h.printf("repost recv %d\n", idx)
		}
		a.recv = a.recv[:0]
		if wrs := c.takeSend(); len(wrs) > 0 {
			n := len(wrs)
			if postN >= 0 && postN < n {
				n = postN
			}
			for i := range wrs {
				if i < n {
					h.labels = append(h.labels, wrs[i])
					h.printf("post #%d %s\n", len(h.labels), h.describe(&wrs[i]))
				} else {
					h.printf("refused %s\n", h.describe(&wrs[i]))
				}
			}
			var err error
			if n < len(wrs) {
				err = postErr
			}
			c.posted(n, err)
			postN = -1
		}
		for _, d := range a.done {
			if d.err != nil {
				h.printf("done %s: %v\n", h.names[d.req], d.err)
			} else {
				h.printf("done %s\n", h.names[d.req])
			}
		}
		clear(a.done)
		a.done = a.done[:0]
		if len(a.requeue) > 0 {
			var ns []string
			for _, r := range a.requeue {
				ns = append(ns, h.names[r])
			}
			h.printf("requeue %s\n", strings.Join(ns, " "))
			h.queue = append(slices.Clone(a.requeue), h.queue...)
			clear(a.requeue)
			a.requeue = a.requeue[:0]
		}
		if a.fail != nil {
			h.printf("fail: %v\n", a.fail)
			a.fail = nil
		}
		if a.ping {
			h.printf("ping\n")
			a.ping = false
		}
		for _, n := range a.paths {
			h.printf("path notice %s standby=%v\n", n.v.name, n.standby)
		}
		clear(a.paths)
		a.paths = a.paths[:0]
	}
}

// describe names a WR as a trace shows it; a command SEND is decoded, and
// the key it advertises is remembered under its request's name.
func (h *coreHarness) describe(wr *transport.SendWR) string {
	sig := ""
	if wr.Flags&transport.FlagSignaled != 0 {
		sig = " signaled"
	}
	switch wr.Opcode {
	case transport.OpRegMR:
		return fmt.Sprintf("REG_MR key=%s%s", wr.Reg.Key, sig)
	case transport.OpBindMW:
		return fmt.Sprintf("BIND_MW key=%s len=%d%s", wr.Bind.Key, wr.Bind.Length, sig)
	case transport.OpLocalInv:
		return fmt.Sprintf("LOCAL_INV key=%s%s", wr.InvalidateKey, sig)
	case transport.OpSend:
		if h.srp {
			return h.describeSRP(wr, sig)
		}
		si := int(wr.ID & 0xffffff)
		name := h.names[h.core.slots[si].req]
		off := int(wr.SGL[0].Addr - h.msgMR.Addr())
		iu := h.msg.Bytes()[off : off+int(wr.SGL[0].Length)]
		if len(wr.SGL) == 2 {
			// Immediate data: the target sees the IU and the data as
			// one message.
			doff := int(wr.SGL[1].Addr - h.dataMR.Addr())
			iu = append(slices.Clip(iu), h.data.Bytes()[doff:doff+int(wr.SGL[1].Length)]...)
		}
		op, _ := wire.PeekOpcode(iu)
		var what string
		switch op {
		case wire.OpControl:
			var req wire.ControlRequest
			if err := wire.DecodeControl(iu, op, &req); err != nil {
				what = err.Error()
			} else {
				h.tags[name] = req.Tag
				what = fmt.Sprintf("CONTROL %s handle=%d", req.Op, req.Handle)
			}
		default:
			var cmd wire.Command
			if err := cmd.Decode(iu); err != nil {
				what = err.Error()
				break
			}
			h.tags[name] = cmd.Tag
			what = fmt.Sprintf("%s handle=%d off=%d len=%d", cmd.Op, cmd.Volume, cmd.Offset, cmd.Length)
			if cmd.NDesc > 0 {
				h.keys[name] = transport.Key(cmd.Desc[0].RKey)
				what += fmt.Sprintf(" key=%s", transport.Key(cmd.Desc[0].RKey))
			}
			if cmd.Flags&wire.FlagInvalidate != 0 {
				what += " inv"
			}
			if cmd.Flags&wire.FlagImmediate != 0 {
				what += fmt.Sprintf(" immediate sge=%d", len(wr.SGL))
			}
			if cmd.Flags&wire.FlagFUA != 0 {
				what += " fua"
			}
		}
		return fmt.Sprintf("SEND %s slot=%d %s%s", name, si, what, sig)
	}
	return fmt.Sprintf("%s%s", wr.Opcode, sig)
}

func (h *coreHarness) label(t testing.TB, td *datadriven.TestData) transport.SendWR {
	var l string
	td.ScanArgs(t, "wr", &l)
	i, err := strconv.Atoi(strings.TrimPrefix(l, "#"))
	if err != nil || i < 1 || i > len(h.labels) {
		t.Fatalf("%s: no posted WR %s", td.Pos, l)
	}
	return h.labels[i-1]
}

var traceStatus = map[string]transport.Status{
	"success": transport.StatusSuccess, "flush": transport.StatusWRFlushErr,
	"rem-access": transport.StatusRemAccessErr, "retry-exc": transport.StatusRetryExcErr,
}

func (h *coreHarness) wc(t testing.TB, td *datadriven.TestData) {
	wr := h.label(t, td)
	st := "success"
	td.MaybeScanArgs(t, "status", &st)
	status, ok := traceStatus[st]
	if !ok {
		t.Fatalf("%s: unknown status %q", td.Pos, st)
	}
	if h.srp && wr.Opcode == transport.OpLocalInv && status == transport.StatusSuccess {
		h.invDone[uint32(wr.InvalidateKey)] = true
	}
	wcs := []transport.WC{{ID: wr.ID, Status: status}}
	h.core.completions(wcs)
}

// nextRecv takes the oldest posted receive buffer for an IU from the
// target and reads the arguments every kind of IU shares: name=NAME of
// the request it answers, tag=stale|unknown to answer with the slot's
// previous generation or a tag that names nothing, credits=N (1).
func (h *coreHarness) nextRecv(t testing.TB, td *datadriven.TestData) (idx int, buf []byte, name string, tag uint64, credits int) {
	if len(h.recvFree) == 0 {
		t.Fatalf("%s: no receive posted", td.Pos)
	}
	idx = h.recvFree[0]
	h.recvFree = h.recvFree[1:]
	buf = h.msg.Bytes()[idx*recvIU : (idx+1)*recvIU]
	td.MaybeScanArgs(t, "name", &name)
	tag = h.tags[name]
	if td.HasArg("tag") {
		var v string
		td.ScanArgs(t, "tag", &v)
		switch v {
		case "stale":
			tag -= 1 << 32 // the slot's previous generation
		case "unknown":
			tag = 0x7fff
		}
	}
	credits = 1
	td.MaybeScanArgs(t, "credits", &credits)
	return idx, buf, name, tag, credits
}

// recv delivers an IU from the target into the oldest posted receive
// buffer, as a gosrp target (recvGosrp) or an SRP target (recvSRP) would
// send it; inv=NAME|bogus completes the receive with an invalidation of
// NAME's advertised key, or of a key no one advertised.
func (h *coreHarness) recv(t testing.TB, td *datadriven.TestData) {
	idx, buf, name, tag, credits := h.nextRecv(t, td)
	var n int
	if h.srp {
		n = h.recvSRP(t, td, buf, name, tag, credits)
	} else {
		n = h.recvGosrp(t, td, buf, tag, credits)
	}
	wc := transport.WC{ID: recvID(idx), Status: transport.StatusSuccess, ByteLen: uint32(n)}
	if td.HasArg("inv") {
		var whose string
		td.ScanArgs(t, "inv", &whose)
		wc.Flags |= transport.WCWithInv
		k, ok := h.keys[whose]
		switch {
		case whose == "bogus" || h.srp && k == 0:
			// SRP has no invalidation for the core to get right, and
			// FuzzSRPCore names any request, with a key or not.
			k = 0x00abcd01
		case !ok:
			t.Fatalf("%s: no key advertised for %q", td.Pos, whose)
		}
		wc.InvalidatedKey = k
	}
	h.core.completions([]transport.WC{wc})
}

// recvGosrp writes an IU from a gosrp target into buf and returns its
// length: a response for the named request (or for a tag that names
// nothing), a control response, or garbage.
func (h *coreHarness) recvGosrp(t testing.TB, td *datadriven.TestData, buf []byte, tag uint64, credits int) int {
	st := "good"
	td.MaybeScanArgs(t, "status", &st)
	kind := "response"
	td.MaybeScanArgs(t, "kind", &kind)
	var n int
	switch kind {
	case "response":
		rsp := wire.Response{Tag: tag, Credits: uint32(credits)}
		switch st {
		case "good":
		case "busy":
			rsp.Status = wire.StatusBusy
		default:
			rsp.Status, rsp.Sense = wire.StatusError, wire.SenseMediumError
		}
		n, _ = rsp.Encode(buf)
	case "control":
		iu, err := wire.EncodeControl(buf[:0], wire.OpControlResp, &wire.ControlResponse{Tag: tag, Credits: uint32(credits)})
		if err != nil {
			t.Fatal(err)
		}
		n = len(iu)
	case "notice":
		var handle int
		td.ScanArgs(t, "handle", &handle)
		state := wire.PathActive
		if st == "standby" {
			state = wire.PathStandby
		}
		iu, err := (&wire.PathNotice{Handle: uint32(handle), State: state}).Encode(buf[:0])
		if err != nil {
			t.Fatal(err)
		}
		n = len(iu)
	case "garbage":
		n = copy(buf, []byte{0xff, 1, 2, 3})
	default:
		t.Fatalf("%s: unknown kind %q", td.Pos, kind)
	}
	return n
}
