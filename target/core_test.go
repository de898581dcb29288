package target

import (
	"strings"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

func TestStateNames(t *testing.T) {
	for s := slotFree; s <= slotFetchingTable; s++ {
		if n := s.String(); n == "" || strings.HasPrefix(n, "slotState(") {
			t.Errorf("slot state %d has no name", s)
		}
	}
	for s := connLogin; s <= connClosed; s++ {
		if n := s.String(); n == "" || strings.HasPrefix(n, "connState(") {
			t.Errorf("conn state %d has no name", s)
		}
	}
	for k := kindRecv; k <= kindCredReq; k++ {
		if strings.HasPrefix(k.String(), "wrKind(") {
			t.Errorf("kind %d has no name", k)
		}
	}
	if slotState(99).String() != "slotState(99)" || AccessReadOnly.String() != "read-only" {
		t.Error("fallback names")
	}
}

func TestWRID(t *testing.T) {
	for _, tc := range []struct {
		gen uint32
		k   wrKind
		idx int
	}{{1, kindRecv, 0}, {0xffffff, kindResp, 1023}, {0x1000001, kindRead, 7}, {42, kindLogin, 0}} {
		g, k, i := splitWRID(makeWRID(tc.gen, tc.k, tc.idx))
		if g != tc.gen&0xffffff || k != tc.k || int(i) != tc.idx {
			t.Errorf("%+v round-trips to %d %s %d", tc, g, k, i)
		}
	}
}

func TestHistogram(t *testing.T) {
	var c ioCounters
	for _, ns := range []int64{10, 999, 1000, 1999, 2000, 1e6, 1 << 62} {
		c.record(wire.OpRead, 4096, false, ns)
	}
	s := c.load()
	if s.Latency.Count() != 7 || s.Latency.Buckets[0] != 2 || s.Latency.Buckets[1] != 2 || s.Latency.Buckets[2] != 1 ||
		s.Latency.Buckets[HistogramBuckets-1] != 1 || s.Read.Ops != 7 || s.Read.Bytes != 7*4096 {
		t.Fatalf("%+v", s)
	}
	if q := s.Latency.Quantile(0.5); q != 2 {
		t.Fatalf("median bound %d", q)
	}
}

// TestCoreStateMachine walks one WRITE through the core by hand and checks
// each slot state and the actions at every step.
func TestCoreStateMachine(t *testing.T) {
	h := newCoreHarness(t, 2)
	req := wire.LoginRequest{Version: wire.Version, Initiator: "i", Credits: 2, MaxIU: 296, MaxRecvIU: 4096, RemoteInvalidate: true}
	iu, _ := wire.EncodeControl(nil, wire.OpLogin, &req)
	h.deliver(0, iu)
	if len(h.c.acts.send) != 1 || len(h.c.acts.recv) != 1 || h.c.state != connActive {
		t.Fatalf("login: %d sends, %d reposts, state %s", len(h.c.acts.send), len(h.c.acts.recv), h.c.state)
	}
	h.step()
	iu, _ = wire.EncodeControl(nil, wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "mem"})
	h.deliver(1, iu)
	h.step()
	w := wire.Command{Op: wire.OpWrite, Volume: 1, Length: 8192, NDesc: 2, Flags: wire.FlagInvalidate, InvalidateKey: 0x4242}
	w.Desc[0] = wire.Descriptor{VA: 0x1000, RKey: 0x4242, Len: 4096}
	w.Desc[1] = wire.Descriptor{VA: 0x3000, RKey: 0x4242, Len: 4096}
	var b [wire.MaxCommandLen]byte
	n, _ := w.Encode(b[:])
	h.deliver(2, b[:n])
	s := &h.c.slots[h.c.acts.send[0].ID&0xffffffff]
	if s.state != slotReadingData || len(h.c.acts.send) != 2 || h.c.acts.send[0].Opcode != transport.OpRDMARead ||
		h.c.acts.send[0].Flags&transport.FlagSignaled != 0 || h.c.acts.send[1].Flags&transport.FlagSignaled == 0 {
		t.Fatalf("WRITE: slot %s, sends %+v", s.state, h.c.acts.send)
	}
	readID := h.c.acts.send[1].ID
	h.c.acts.reset()
	h.wc = transport.WC{ID: readID}
	h.c.completion(&h.wc, 5)
	if s.state != slotBackend || len(h.c.acts.jobs) != 1 || s.job != jobWrite {
		t.Fatalf("after READ: slot %s, jobs %v", s.state, h.c.acts.jobs)
	}
	h.c.acts.reset()
	runJob(s, h.cat)
	h.c.backendDone(s.idx, 6)
	if s.state != slotResponding || len(h.c.acts.send) != 1 || h.c.acts.send[0].Opcode != transport.OpSendWithInv ||
		h.c.acts.send[0].InvalidateKey != 0x4242 || h.c.outstanding != 0 {
		t.Fatalf("response: slot %s, sends %+v", s.state, h.c.acts.send)
	}
	var rsp wire.Response
	if err := rsp.Decode(s.send[:wire.ResponseLen]); err != nil || rsp.Status != wire.StatusGood || rsp.Credits != 1 {
		t.Fatalf("response %+v %v", rsp, err)
	}
	h.step()
	if s.state != slotFree || len(h.c.free) != 2 {
		t.Fatalf("end: slot %s, %d free", s.state, len(h.c.free))
	}
	// A failed RDMA READ ends the connection without a response.
	h.deliver(2, b[:n])
	id := h.c.acts.send[1].ID
	h.c.acts.reset()
	h.wc = transport.WC{ID: id, Status: transport.StatusRemAccessErr}
	h.c.completion(&h.wc, 7)
	if !h.c.acts.disconnect || !h.c.acts.violation || len(h.c.acts.send) != 0 {
		t.Fatalf("READ failure: %+v", h.c.acts)
	}
}

// TestCorePolicyInFlight: a policy change reaches requests already on
// their way. A WRITE whose data is being fetched when its volume is
// revoked is answered access denied and never handed to the volume; an
// OPEN that finishes after the ACL denied it is refused and its volume
// given to the shell to close.
func TestCorePolicyInFlight(t *testing.T) {
	h := newCoreHarness(t, 2)
	var acl *ACL
	h.c.p.acl = func() *ACL { return acl }
	req := wire.LoginRequest{Version: wire.Version, Initiator: "i", Credits: 2, MaxIU: 296, MaxRecvIU: 4096}
	iu, _ := wire.EncodeControl(nil, wire.OpLogin, &req)
	h.deliver(0, iu)
	h.step()
	iu, _ = wire.EncodeControl(nil, wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "mem"})
	h.deliver(1, iu)
	h.step()

	w := wire.Command{Op: wire.OpWrite, Volume: 1, Length: 4096, NDesc: 1}
	w.Desc[0] = wire.Descriptor{VA: 0x1000, RKey: 0x4242, Len: 4096}
	var b [wire.MaxCommandLen]byte
	n, _ := w.Encode(b[:])
	h.deliver(2, b[:n])
	s := &h.c.slots[h.c.acts.send[0].ID&0xffffffff]
	readID := h.c.acts.send[0].ID
	if s.state != slotReadingData {
		t.Fatalf("WRITE: slot %s", s.state)
	}
	h.c.acts.reset()
	acl = &ACL{DenyByDefault: true}
	h.c.policyChanged(3)
	if len(h.c.acts.closeVols) != 1 || h.c.acts.closeVols[0].name != "mem" || len(h.c.acts.policy) != 1 {
		t.Fatalf("revocation: close %v, effects %+v", h.c.acts.closeVols, h.c.acts.policy)
	}
	if len(h.c.openVolumes()) != 0 {
		t.Fatal("a revoked volume is still among those teardown closes")
	}
	h.c.acts.reset()
	h.wc = transport.WC{ID: readID}
	h.c.completion(&h.wc, 4)
	if len(h.c.acts.jobs) != 0 || s.state != slotResponding {
		t.Fatalf("after READ: slot %s, jobs %v", s.state, h.c.acts.jobs)
	}
	var rsp wire.Response
	if err := rsp.Decode(s.send[:wire.ResponseLen]); err != nil || rsp.Sense != wire.SenseAccessDenied {
		t.Fatalf("response %+v %v", rsp, err)
	}
	h.step()

	// An OPEN dispatched while allowed, finished after a deny.
	acl = nil
	iu, _ = wire.EncodeControl(nil, wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "mem"})
	h.deliver(1, iu)
	if len(h.c.acts.jobs) != 1 {
		t.Fatalf("OPEN: jobs %v", h.c.acts.jobs)
	}
	op := &h.c.slots[h.c.acts.jobs[0]]
	h.c.acts.reset()
	runJob(op, h.cat)
	acl = &ACL{DenyByDefault: true}
	h.c.backendDone(op.idx, 5)
	if len(h.c.acts.send) != 1 {
		t.Fatalf("late OPEN: sends %+v", h.c.acts.send)
	}
	var crsp wire.ControlResponse
	if err := wire.DecodeControl(op.send[:h.c.acts.send[0].SGL[0].Length], wire.OpControlResp, &crsp); err != nil || crsp.Sense != wire.SenseAccessDenied || crsp.Handle != 0 {
		t.Fatalf("late OPEN answered %+v %v", crsp, err)
	}
	if len(h.c.acts.closeVols) != 1 || h.c.acts.closeVols[0].vol == nil {
		t.Fatalf("the late OPEN's volume is not closed: %v", h.c.acts.closeVols)
	}
}
