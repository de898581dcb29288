package target

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
)

// catalogLUNs numbers a catalog's volumes as a new target does.
func catalogLUNs(cat Catalog) ([]string, error) {
	list, err := cat.List()
	if err != nil {
		return nil, err
	}
	var t lunTable
	byLUN, _, err := t.names(list)
	return byLUN, err
}

// newSRPCoreHarness is a core harness logged in with an SRP_LOGIN_REQ
// (immediate data at ib_srp's offset), its catalog's one volume at LUN 0.
func newSRPCoreHarness(tb testing.TB, credits int) *coreHarness {
	h := newCoreHarness(tb, credits)
	req := srpLoginReq(1)
	byLUN, err := catalogLUNs(h.cat)
	res := h.c.srpLogin(&req, byLUN, err, 0)
	if !res.ok || len(res.open) != 1 {
		tb.Fatalf("SRP login: %+v", res)
	}
	v, info, err := openVolume(h.cat, res.open[0])
	if err != nil {
		tb.Fatal(err)
	}
	h.c.srpAttach(nil, []srpVolume{{vol: v, info: info, pr: newPRTable().volume(res.open[0])}})
	h.c.acts.reset()
	return h
}

// srpIU encodes an SRP_CMD as the initiator sends it (immediate data at
// srpImmOffset).
func srpIU(tb testing.TB, cmd srp.Cmd) []byte {
	b := make([]byte, cmd.EncodedLen())
	if _, err := cmd.Encode(b); err != nil {
		tb.Fatal(err)
	}
	if cmd.DataOut.Format == srp.FormatImmediate {
		b = append(append(b, make([]byte, srpImmOffset-len(b))...), cmd.DataOut.Imm...)
	}
	return b
}

// TestSRPCoreAllocs: in an SRP session, WRITE(10) by RDMA READ, READ(16)
// and an immediate-data WRITE(10) with FUA allocate nothing in the core,
// as gosrp commands do not (TestCoreAllocs); nor do a READ and a WRITE
// through tables of 32 descriptors, moved in rounds, once the slots
// have their long lists.
func TestSRPCoreAllocs(t *testing.T) {
	h := newSRPCoreHarness(t, 4)
	d := srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: 0x9000, Key: 0x1234, Len: 16384}}
	w := srpIU(t, srp.Cmd{Tag: 1, CDB: rw10(0x2A, 2, 4, false), DataOut: d})
	r := srpIU(t, srp.Cmd{Tag: 2, CDB: rw16(0x88, 2, 4), DataIn: d})
	im := srpIU(t, srp.Cmd{Tag: 3, CDB: rw10(0x2A, 1, 1, true),
		DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 4096, Imm: make([]byte, 4096)}})
	// Tables of 32 descriptors, moved in two rounds each (core_srp_table.go):
	// a READ(16) through one wholly inline, a WRITE(10) through one
	// fetched with two inline.
	pieces := make([]srp.Descriptor, 32)
	h.remote = make([]byte, srpTableVA+len(pieces)*srp.DescriptorLen)
	for i := range pieces {
		pieces[i] = srp.Descriptor{VA: 0x9000 + uint64(i)*512, Key: 0x1234, Len: 512}
		pieces[i].Encode(h.remote[srpTableVA+i*srp.DescriptorLen:])
	}
	table := func(inline int, va uint64, key uint32) srp.DataBuffer {
		b := srp.DataBuffer{Format: srp.FormatIndirect, Total: 16384,
			Table: srp.Descriptor{VA: va, Key: key, Len: uint32(len(pieces) * srp.DescriptorLen)}}
		if err := b.SetPartial(pieces[:inline], make([]byte, inline*srp.DescriptorLen)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	lr := srpIU(t, srp.Cmd{Tag: 4, CDB: rw16(0x88, 2, 4), DataIn: table(len(pieces), 0x1000, 1)})
	lw := srpIU(t, srp.Cmd{Tag: 5, CDB: rw10(0x2A, 2, 4, false), DataOut: table(2, srpTableVA, srpTableKey)})
	i := 0
	run := func() {
		for _, b := range [][]byte{w, r, im, lr, lw} {
			h.deliver(i%h.c.p.nrecv, b)
			i++
			h.step()
		}
	}
	for tag, b := range [][]byte{w, r, im, lr, lw} {
		h.deliver(i%h.c.p.nrecv, b)
		i++
		h.step()
		var rsp srp.Rsp
		found := false
		for i := range h.c.slots {
			if rsp.Decode(h.c.slots[i].send[:srp.RspLen]) == nil && rsp.Tag == uint64(tag+1) {
				found = rsp.Status == uint8(scsi.StatusGood) && rsp.Flags == 0
			}
		}
		if !found {
			t.Fatalf("command tag %d was not answered GOOD with nothing left over", tag+1)
		}
	}
	if a := testing.AllocsPerRun(1000, run); a != 0 {
		t.Fatalf("core: %.1f allocations per SRP WRITE+READ+immediate WRITE+two long tables, want 0", a)
	}
	if h.c.outstanding != 0 || len(h.c.free) != 4 || h.c.sqPosted != h.c.sqDone {
		t.Fatalf("leak: outstanding %d, free %d, sq %d/%d", h.c.outstanding, len(h.c.free), h.c.sqPosted, h.c.sqDone)
	}
}

// TestSRPCoreCredits: the request limit the login granted is enforced:
// an SRP_CMD beyond the credits not yet returned by an SRP_RSP ends the
// connection as a violation, while one sent after a response returned a
// credit is served.
func TestSRPCoreCredits(t *testing.T) {
	h := newSRPCoreHarness(t, 2)
	tag := uint64(0)
	read := func() []byte { // under a tag of its own: one in use is an overlapped command
		tag++
		return srpIU(t, srp.Cmd{Tag: tag, CDB: rw10(0x28, 0, 1, false),
			DataIn: srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: 0x9000, Key: 1, Len: 4096}}})
	}
	h.deliver(0, read())
	h.deliver(1, read()) // two reads on their jobs: both credits in use
	if h.c.acts.disconnect || h.c.outstanding != 2 || len(h.c.acts.jobs) != 2 {
		t.Fatalf("within the limit: disconnect %t, outstanding %d, jobs %v", h.c.acts.disconnect, h.c.outstanding, h.c.acts.jobs)
	}
	jobs := append([]int32(nil), h.c.acts.jobs...)
	h.c.acts.reset()
	for _, j := range jobs { // both answered: two credits back
		runJob(&h.c.slots[j], h.cat)
		h.c.backendDone(j, 2)
	}
	h.c.acts.reset()
	h.deliver(2, read())
	h.deliver(0, read())
	if h.c.acts.disconnect {
		t.Fatalf("credits returned by responses were not counted: %s", h.c.acts.reason)
	}
	h.deliver(1, read())
	if !h.c.acts.disconnect || !h.c.acts.violation {
		t.Fatalf("a third request on two credits: disconnect %t violation %t", h.c.acts.disconnect, h.c.acts.violation)
	}
}

// FuzzSRPCore feeds arbitrary IUs into a core in an SRP session, after
// what before says: nothing (0), a well-formed READ answered (1), a
// READ aborted by another channel of the nexus, whose credit went back
// in SRP_CRED_REQ tag 1, still unanswered (2), so SRP_CRED_RSPs are
// fuzzed against one outstanding, or a READ tagged 1 still at the
// volume (3), so IUs under its tag are overlapped commands. The core must never panic or refuse
// its own move, and its accounting must stay sane. mem is the
// initiator's memory at srpTableVA: an indirect table the IU does not
// carry whole is fetched from there, so fetched tables are fuzzed too.
func FuzzSRPCore(f *testing.F) {
	d := srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: 0x9000, Key: 1, Len: 8192}}
	tbl := make([]byte, 3*srp.DescriptorLen)
	var partial [srp.DescriptorLen]byte
	for i, x := range []srp.Descriptor{{VA: 0x9000, Key: 1, Len: 4096}, {VA: 0xa000, Key: 1}, {VA: 0xb000, Key: 1, Len: 4096}} {
		x.Encode(tbl[i*srp.DescriptorLen:])
	}
	ind := srp.DataBuffer{Format: srp.FormatIndirect, Total: 8192, Table: srp.Descriptor{VA: srpTableVA, Key: srpTableKey, Len: uint32(len(tbl))}}
	ind.SetPartial([]srp.Descriptor{{VA: 0x9000, Key: 1, Len: 4096}}, partial[:])
	for _, cmd := range []srp.Cmd{
		{Tag: 10, CDB: rw10(0x2A, 2, 2, false), DataOut: ind},
		{Tag: 11, CDB: rw10(0x28, 2, 2, false), DataIn: ind},
		{Tag: 1, CDB: rw10(0x2A, 2, 2, true), DataOut: d},
		{Tag: 2, CDB: rw16(0x88, 0, 2), DataIn: d},
		{Tag: 3, CDB: []byte{0x12, 1, 0x83, 0, 255, 0}, DataIn: d},
		{Tag: 4, CDB: []byte{0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, DataIn: d},
		{Tag: 5, CDB: []byte{0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{Tag: 6, CDB: rw10(0x2A, 1, 1, false), DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 512, Imm: make([]byte, 512)}},
		{Tag: 7, CDB: unmapCDB(24), DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 24, Imm: unmapList([2]uint64{1, 2})}},
		{Tag: 8, CDB: writeSame16(0, 0, 3), DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 4096, Imm: pattern(4096, 1)}},
		{Tag: 9, CDB: writeSame16(0x09, 0, 3)},
		// PERSISTENT RESERVE OUT, REGISTER key 0xab; IN, READ KEYS.
		{Tag: 12, CDB: []byte{0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0}, DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 24,
			Imm: []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0, 0, 0, 0, 1, 0, 0, 0}}},
		{Tag: 13, CDB: []byte{0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0}, DataIn: d},
	} {
		b := make([]byte, cmd.EncodedLen())
		cmd.Encode(b)
		if cmd.DataOut.Format == srp.FormatImmediate {
			b = append(append(b, make([]byte, srpImmOffset-len(b))...), cmd.DataOut.Imm...)
		}
		f.Add(uint8(0), b, tbl)
		f.Add(uint8(1), b, tbl[:32])
		f.Add(uint8(2), b, tbl)
		if cmd.Tag == 1 || cmd.Tag == 2 {
			f.Add(uint8(3), b, tbl) // tag 1: overlapped
		}
	}
	var tm [srp.TaskMgmtLen]byte
	(&srp.TaskMgmt{Tag: 9, Function: srp.TaskAbortTask}).Encode(tm[:])
	f.Add(uint8(0), tm[:], []byte(nil))
	f.Add(uint8(1), []byte{byte(srp.OpILogout), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, []byte(nil))
	f.Add(uint8(0), []byte{byte(srp.OpCmd), 0, 0, 0, 0, 0x21, 0xff, 0xff}, []byte(nil))
	for _, tag := range []uint64{1, 2} {
		for _, op := range []srp.Opcode{srp.OpCredRsp, srp.OpAERRsp} {
			var a [srp.TargetRspLen]byte
			(&srp.TargetRsp{Op: op, Tag: tag}).Encode(a[:])
			f.Add(uint8(2), a[:], []byte(nil))
			f.Add(uint8(0), a[:], []byte(nil))
		}
	}
	f.Fuzz(func(t *testing.T, before uint8, iu, mem []byte) {
		if len(iu) == 0 || len(iu) > recvSize {
			return
		}
		h := newSRPCoreHarness(t, 4)
		h.remote = append(make([]byte, srpTableVA, srpTableVA+len(mem)), mem...)
		if mode := before % 4; mode > 0 {
			h.deliver(0, srpIU(t, srp.Cmd{Tag: 1, CDB: rw16(0x88, 0, 1), DataIn: srp.DataBuffer{Format: srp.FormatDirect,
				Direct: srp.Descriptor{VA: 0x9000, Key: 1, Len: 4096}}}))
			if mode == 2 {
				h.c.srpPeerAbort(h.c.srpUnitOf(0), false, "peer")
			}
			if mode != 3 { // 3: the READ's job stays pending, its tag in use
				h.step()
			}
			if mode == 2 && (h.c.srp.cred.tag != 1 || h.c.outstanding != 0) {
				t.Fatalf("aborted READ: SRP_CRED_REQ tag %d, outstanding %d", h.c.srp.cred.tag, h.c.outstanding)
			}
		}
		h.feed(t, iu, 1)
	})
}

// srpLogin (trace command srp-login) logs the harness core in with an
// SRP_LOGIN_REQ and attaches the catalog's volume: args credits, imm
// (request immediate data), itiu (MaxITIULen), port (initiator port's
// last byte).
func (h *traceHarness) srpLogin(t *testing.T, td *datadriven.TestData) {
	port, itiu := 1, srpImmOffset+maxImmediate
	td.MaybeScanArgs(t, "port", &port)
	td.MaybeScanArgs(t, "itiu", &itiu)
	req := srpLoginReq(byte(port))
	req.MaxITIULen = uint32(itiu)
	if !td.HasArg("imm") {
		req.Flags &^= srp.ImmediateRequested
	}
	byLUN, err := catalogLUNs(h.cat)
	res := h.c.srpLogin(&req, byLUN, err, 0)
	if !res.ok {
		var rej srp.LoginReject
		rej.Decode(res.priv)
		h.printf("SRP_LOGIN_REJ tag=%#x reason %s\n", rej.Tag, res.reason)
		return
	}
	var rsp srp.LoginResponse
	rsp.Decode(res.priv)
	h.printf("SRP_LOGIN_RSP req_lim=%d max_it_iu=%d max_ti_iu=%d flags=%#x luns=%q\n",
		rsp.ReqLimDelta, rsp.MaxITIULen, rsp.MaxTIIULen, rsp.Flags, res.open)
	v, info, err := openVolume(h.cat, res.open[0])
	if err != nil {
		t.Fatal(err)
	}
	h.c.srpAttach(nil, []srpVolume{{vol: v, info: info}})
}

// catalogChanged (trace command catalog-changed) plays the shell on a
// catalog change: the catalog numbered by LUN (luns=A,-,B: "-" for a
// number with no volume; the harness catalog's by default) goes to the
// core, the volumes of the LUNs it asks for are opened ("nosuch" fails
// to), and the core attaches them; the volumes it hands back are
// closed.
func (h *traceHarness) catalogChanged(t *testing.T, td *datadriven.TestData) {
	h.catalogGen++
	byLUN, err := catalogLUNs(h.cat)
	if err != nil {
		t.Fatal(err)
	}
	var luns string
	if td.MaybeScanArgs(t, "luns", &luns) {
		byLUN = strings.Split(luns, ",")
		for i, n := range byLUN {
			if n == "-" {
				byLUN[i] = ""
			}
		}
	}
	open := h.c.srpCatalog(h.catalogGen, byLUN, nil)
	h.closed()
	if len(open) == 0 {
		return
	}
	opened := make([]srpOpened, len(open))
	for i, l := range open {
		h.printf("open LUN %d %s\n", l.lun, l.name)
		opened[i].srpNewLUN = l
		if v, info, err := openVolume(h.cat, l.name); err == nil {
			opened[i].srpVolume = srpVolume{vol: v, info: info}
		}
	}
	h.c.srpAttachNew(h.catalogGen, opened)
	h.closed()
}

// closed prints and clears the volumes the core asked the shell to
// close.
func (h *traceHarness) closed() {
	for _, ov := range h.c.acts.closeVols {
		h.printf("close volume %s\n", ov.name)
	}
	h.c.acts.closeVols = nil
	h.c.acts.policy = nil
}

// srpTableVA is where trace and fuzz commands put an indirect table in
// the initiator's memory (coreHarness.remote); its key is srpTableKey.
const (
	srpTableVA  = 0x100
	srpTableKey = 0x5678
)

// srpTable (srp-cmd's table-in and table-out) is an indirect table of
// descriptors of the given lengths, one after the other at 0x100000 with
// key 0x1234, of which the first inline ride in the IU. The table itself
// is put in the initiator's memory at srpTableVA, with the lengths of
// mem instead when given (a table that changed under the command), and
// total overrides the data length the IU announces when not negative.
func (h *traceHarness) srpTable(lens, mem []uint32, inline, total int) srp.DataBuffer {
	descs := func(lens []uint32) []srp.Descriptor {
		var d []srp.Descriptor
		va := uint64(0x100000)
		for _, n := range lens {
			d = append(d, srp.Descriptor{VA: va, Key: 0x1234, Len: n})
			va += uint64(n)
		}
		return d
	}
	d := descs(lens)
	var sum uint32
	for _, n := range lens {
		sum += n
	}
	if total >= 0 {
		sum = uint32(total)
	}
	if mem == nil {
		mem = lens
	}
	h.remote = make([]byte, srpTableVA+len(mem)*srp.DescriptorLen)
	for i, x := range descs(mem) {
		x.Encode(h.remote[srpTableVA+i*srp.DescriptorLen:])
	}
	b := srp.DataBuffer{Format: srp.FormatIndirect, Total: sum,
		Table: srp.Descriptor{VA: srpTableVA, Key: srpTableKey, Len: uint32(len(d) * srp.DescriptorLen)}}
	if err := b.SetPartial(d[:inline], make([]byte, inline*srp.DescriptorLen)); err != nil {
		h.tb.Fatal(err)
	}
	return b
}

// lengths parses a comma-separated list of byte counts, NxK standing
// for K counts of N.
func lengths(t *testing.T, td *datadriven.TestData, key string) []uint32 {
	var x string
	if !td.MaybeScanArgs(t, key, &x) {
		return nil
	}
	var l []uint32
	for _, f := range strings.Split(x, ",") {
		f, rep, ok := strings.Cut(f, "x")
		k := uint64(1)
		var err error
		if ok {
			k, err = strconv.ParseUint(rep, 10, 16)
		}
		n, err2 := strconv.ParseUint(f, 10, 32)
		if err != nil || err2 != nil {
			t.Fatalf("%s: %s: %q: %v %v", td.Pos, key, f, err, err2)
		}
		for range k {
			l = append(l, uint32(n))
		}
	}
	return l
}

// srpCmd (trace command srp-cmd) sends an SRP_CMD: args cdb (hex), lun,
// tag, and one data buffer: in=N or out=N (a direct descriptor of N
// bytes), imm=N (N bytes of immediate data, zeros unless data gives
// their first bytes in hex), table-in=N,M,... or table-out=N,M,... (an
// indirect table of descriptors of those lengths, srpTable: inline=K of
// them in the IU, mem=... and total=N to make it lie).
func (h *traceHarness) srpCmd(t *testing.T, td *datadriven.TestData) {
	var cdb string
	td.ScanArgs(t, "cdb", &cdb)
	b, err := hex.DecodeString(cdb)
	if err != nil {
		t.Fatalf("%s: %v", td.Pos, err)
	}
	cmd := srp.Cmd{CDB: b}
	var lun, n int
	td.MaybeScanArgs(t, "lun", &lun)
	cmd.LUN = scsi.EncodeLUN(uint16(lun))
	td.MaybeScanArgs(t, "tag", &cmd.Tag)
	desc := func(n int) srp.DataBuffer {
		return srp.DataBuffer{Format: srp.FormatDirect, Direct: srp.Descriptor{VA: 0x100000, Key: 0x1234, Len: uint32(n)}}
	}
	inline, total := 0, -1
	td.MaybeScanArgs(t, "inline", &inline)
	td.MaybeScanArgs(t, "total", &total)
	if l := lengths(t, td, "table-in"); l != nil {
		cmd.DataIn = h.srpTable(l, lengths(t, td, "mem"), inline, total)
	}
	if l := lengths(t, td, "table-out"); l != nil {
		cmd.DataOut = h.srpTable(l, lengths(t, td, "mem"), inline, total)
	}
	switch {
	case td.MaybeScanArgs(t, "in", &n):
		cmd.DataIn = desc(n)
	case td.MaybeScanArgs(t, "out", &n):
		cmd.DataOut = desc(n)
	case td.MaybeScanArgs(t, "imm", &n):
		cmd.DataOut = srp.DataBuffer{Format: srp.FormatImmediate, Total: uint32(n), Imm: make([]byte, n)}
		var x string
		if td.MaybeScanArgs(t, "data", &x) {
			if _, err := hex.Decode(cmd.DataOut.Imm, []byte(x)); err != nil {
				t.Fatalf("%s: data: %v", td.Pos, err)
			}
		}
	}
	h.raw(t, srpIU(t, cmd))
}

// srpIU (trace command srp-iu) delivers the IU given in hex.
func (h *traceHarness) srpIU(t *testing.T, td *datadriven.TestData) {
	var x string
	td.ScanArgs(t, "hex", &x)
	b, err := hex.DecodeString(x)
	if err != nil {
		t.Fatalf("%s: %v", td.Pos, err)
	}
	h.raw(t, b)
}

// describeSRPRsp renders an SRP_RSP, or an SRP_CRED_REQ, for a trace.
func describeSRPRsp(b []byte) string {
	if len(b) > 0 && srp.Opcode(b[0]) == srp.OpCredReq {
		var q srp.CredReq
		if err := q.Decode(b); err != nil {
			return fmt.Sprintf("not an SRP_CRED_REQ: %v", err)
		}
		return fmt.Sprintf("SRP_CRED_REQ tag=%d req_lim_delta=%d", q.Tag, q.ReqLimDelta)
	}
	var r srp.Rsp
	if err := r.Decode(b); err != nil {
		return fmt.Sprintf("not an SRP_RSP: %v", err)
	}
	s := fmt.Sprintf("SRP_RSP tag=%d status=%s req_lim_delta=%d", r.Tag, scsi.Status(r.Status), r.ReqLimDelta)
	for _, f := range []struct {
		bit   uint8
		name  string
		resid uint32
	}{{srp.DIUnder, "diunder", r.DataInResid}, {srp.DIOver, "diover", r.DataInResid},
		{srp.DOUnder, "dounder", r.DataOutResid}, {srp.DOOver, "doover", r.DataOutResid}} {
		if r.Flags&f.bit != 0 {
			s += fmt.Sprintf(" %s=%d", f.name, f.resid)
		}
	}
	if len(r.Sense) > 0 {
		sns, _ := scsi.ParseSense(r.Sense)
		s += fmt.Sprintf(" sense=%q", sns)
	}
	if len(r.Resp) == 4 {
		s += fmt.Sprintf(" tmf-response=%d", r.Resp[3])
	}
	return s
}

// srpAnswer (trace command srp-answer) sends the initiator's answer to
// a target request: args tag, and aer for an SRP_AER_RSP rather than an
// SRP_CRED_RSP.
func (h *traceHarness) srpAnswer(t *testing.T, td *datadriven.TestData) {
	a := srp.TargetRsp{Op: srp.OpCredRsp}
	td.MaybeScanArgs(t, "tag", &a.Tag)
	if td.HasArg("aer") {
		a.Op = srp.OpAERRsp
	}
	var b [srp.TargetRspLen]byte
	if _, err := a.Encode(b[:]); err != nil {
		t.Fatal(err)
	}
	h.raw(t, b[:])
}

// srpTMF (trace command srp-tmf) sends an SRP_TSK_MGMT: args tag, fn
// (the function code), task (the tag to abort), lun.
func (h *traceHarness) srpTMF(t *testing.T, td *datadriven.TestData) {
	var tm srp.TaskMgmt
	var fn, lun int
	td.ScanArgs(t, "fn", &fn)
	td.MaybeScanArgs(t, "tag", &tm.Tag)
	td.MaybeScanArgs(t, "task", &tm.TaskTag)
	td.MaybeScanArgs(t, "lun", &lun)
	tm.Function, tm.LUN = srp.TaskFunc(fn), scsi.EncodeLUN(uint16(lun))
	var b [srp.TaskMgmtLen]byte
	if _, err := tm.Encode(b[:]); err != nil {
		t.Fatal(err)
	}
	h.raw(t, b[:])
}
