package target

import (
	"context"
	"errors"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// sliceVolume is a trivial in-memory Volume that never allocates.
type sliceVolume struct {
	b  []byte
	bs int
}

func (v *sliceVolume) ReadAt(p []byte, off int64) (int, error)     { return copy(p, v.b[off:]), nil }
func (v *sliceVolume) WriteAt(p []byte, off int64) (int, error)    { return copy(v.b[off:], p), nil }
func (v *sliceVolume) WriteAtFUA(p []byte, off int64) (int, error) { return copy(v.b[off:], p), nil }
func (v *sliceVolume) Flush() error                                { return nil }
func (v *sliceVolume) Discard(off, n int64) error                  { clear(v.b[off : off+n]); return nil }
func (v *sliceVolume) WriteZeroes(off, n int64) error              { clear(v.b[off : off+n]); return nil }
func (v *sliceVolume) Size() int64                                 { return int64(len(v.b)) }
func (v *sliceVolume) BlockSize() int                              { return v.bs }
func (v *sliceVolume) Deallocates() bool                           { return true }

type sliceCatalog struct{ v *sliceVolume }

func (c sliceCatalog) List() ([]VolumeInfo, error) {
	return []VolumeInfo{{Name: "mem", Size: c.v.Size(), BlockSize: c.v.bs}}, nil
}

// OpenVolume opens any name but "nosuch", which does not exist.
func (c sliceCatalog) OpenVolume(name string) (Volume, error) {
	if name == "nosuch" {
		return nil, errors.New("block: not found")
	}
	return c.v, nil
}

// coreHarness drives a core directly, playing NIC and worker.
type coreHarness struct {
	tb   testing.TB
	c    *core
	cat  Catalog
	recv []byte
	wc   transport.WC
	// remote is the initiator's memory from VA 0, as far as the tests
	// give it: an RDMA READ within it copies its bytes into the slot's
	// data buffer (an indirect table); one beyond leaves the buffer be.
	remote []byte
}

func newCoreHarness(tb testing.TB, credits int) *coreHarness {
	const maxXfer = 64 << 10
	nrecv := credits + 1
	h := &coreHarness{tb: tb, cat: sliceCatalog{&sliceVolume{b: make([]byte, 1<<20), bs: 4096}}}
	h.recv = make([]byte, nrecv*recvSize)
	h.c = newCore(coreParams{gen: 5, id: 1, name: "t", credits: credits, maxXfer: maxXfer, maxDesc: wire.MaxDescriptors,
		offerInv: true, loginTO: 1e9, sqDepth: credits*(wire.MaxDescriptors+1) + 2, nrecv: nrecv,
		recv: h.recv, recvAddr: 0x10000, iu: make([]byte, (credits+1)*iuSize), iuAddr: 0x200000,
		data: make([]byte, credits*maxXfer), dataAddr: 0x1000000, rand: func(b []byte) {},
		volStats: func(string) *ioCounters { return &ioCounters{} }, connStats: &ioCounters{}})
	h.c.start(0)
	h.c.acts.reset()
	return h
}

// deliver puts an IU in receive buffer idx and completes the receive.
func (h *coreHarness) deliver(idx int, iu []byte) {
	copy(h.recv[idx*recvSize:], iu)
	h.wc = transport.WC{ID: makeWRID(5, kindRecv, idx), Opcode: transport.WCRecv, ByteLen: uint32(len(iu))}
	h.c.completion(&h.wc, 1)
}

// step plays NIC and worker until the core has nothing more to do: jobs
// run inline, and the last signaled send WR of each batch completes.
func (h *coreHarness) step() {
	for len(h.c.acts.jobs) > 0 || len(h.c.acts.send) > 0 {
		if h.c.acts.disconnect {
			h.tb.Fatalf("core disconnected: %s", h.c.acts.reason)
		}
		h.step1()
	}
}

func (h *coreHarness) step1() {
	if h.c.bug != nil {
		h.tb.Fatalf("core refused its own move: %v", h.c.bug)
	}
	jobs, sends := h.c.acts.jobs, h.c.acts.send
	var sig uint64
	for i := range sends {
		if sends[i].Flags&transport.FlagSignaled != 0 {
			sig = sends[i].ID
		}
	}
	var jobIdx int32 = -1
	if len(jobs) > 0 {
		jobIdx = jobs[0]
	}
	for i := range sends {
		h.readRemote(&sends[i])
	}
	h.c.acts.reset()
	if jobIdx >= 0 {
		runJob(&h.c.slots[jobIdx], h.cat)
		h.c.backendDone(jobIdx, 2)
		return
	}
	if sig != 0 {
		h.wc = transport.WC{ID: sig}
		h.c.completion(&h.wc, 3)
	}
}

// readRemote plays the initiator's memory for an RDMA READ within
// h.remote.
func (h *coreHarness) readRemote(wr *transport.SendWR) {
	if wr.Opcode != transport.OpRDMARead || wr.RemoteAddr+uint64(wr.SGL[0].Length) > uint64(len(h.remote)) {
		return
	}
	off := wr.SGL[0].Addr - h.c.p.dataAddr
	copy(h.c.p.data[off:off+uint64(wr.SGL[0].Length)], h.remote[wr.RemoteAddr:])
}

// loginOpen logs initiator "i" in (with 4096 bytes of immediate data)
// and opens "mem" as handle 1.
func (h *coreHarness) loginOpen(t testing.TB) {
	req := wire.LoginRequest{Version: wire.Version, Initiator: "i", Credits: 4, MaxIU: 296, MaxRecvIU: 4096, MaxImmediate: 4096}
	iu, _ := wire.EncodeControl(nil, wire.OpLogin, &req)
	h.deliver(0, iu)
	h.step()
	iu, _ = wire.EncodeControl(nil, wire.OpControl, &wire.ControlRequest{Tag: 1, Op: wire.ControlOpen, Volume: "mem"})
	h.deliver(1, iu)
	h.step()
	if h.c.state != connActive || h.c.nhandles != 1 {
		t.Fatalf("state %s, %d handles", h.c.state, h.c.nhandles)
	}
}

func TestCoreAllocs(t *testing.T) {
	h := newCoreHarness(t, 4)
	h.loginOpen(t)
	var wbuf, rbuf [wire.MaxCommandLen]byte
	w := wire.Command{Op: wire.OpWrite, Volume: 1, Offset: 8192, Length: 16384, NDesc: 2, Flags: wire.FlagInvalidate, InvalidateKey: 0x1234}
	w.Desc[0] = wire.Descriptor{VA: 0x9000, RKey: 0x1234, Len: 8192}
	w.Desc[1] = wire.Descriptor{VA: 0xb000, RKey: 0x1234, Len: 8192}
	nw, _ := w.Encode(wbuf[:])
	r := w
	r.Op = wire.OpRead
	nr, _ := r.Encode(rbuf[:])
	im := wire.Command{Op: wire.OpWrite, Flags: wire.FlagImmediate, Volume: 1, Offset: 4096, Length: 4096}
	imbuf := make([]byte, wire.CommandHeaderLen+4096)
	im.Encode(imbuf)
	i := 0
	run := func() {
		for _, b := range [][]byte{wbuf[:nw], rbuf[:nr], imbuf} {
			h.deliver(i%h.c.p.nrecv, b)
			i++
			h.step()
		}
	}
	run()
	if a := testing.AllocsPerRun(1000, run); a != 0 {
		t.Fatalf("core: %.1f allocations per WRITE+READ+immediate WRITE, want 0", a)
	}
	if h.c.outstanding != 0 || len(h.c.free) != 4 || h.c.sqPosted != h.c.sqDone {
		t.Fatalf("leak: outstanding %d, free %d, sq %d/%d", h.c.outstanding, len(h.c.free), h.c.sqPosted, h.c.sqDone)
	}
}

// TestLoopAllocs drives full WRITE and READ commands through a target on
// the emu loop wire with a lean scripted client and reports allocations
// per WRITE+READ pair for the whole process (target, NIC and client).
func TestLoopAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	vol := &sliceVolume{b: make([]byte, 1<<20), bs: 4096}
	r := newRig(t, env{emu.WireLoop, "strict"}, Config{Catalog: sliceCatalog{vol}})
	c := r.dial(t)
	c.login("ini")
	h := c.open("mem", false)
	var cmds [2][wire.MaxCommandLen]byte
	var lens [2]int
	for k, op := range []wire.Op{wire.OpWrite, wire.OpRead} {
		cmd := c.io(op, h, 4096, 0, 16<<10, 1)
		lens[k], _ = cmd.Encode(cmds[k][:])
		copy(c.arena.Bytes()[cliSendOff+k*4096:], cmds[k][:lens[k]])
	}
	sges := [2][]transport.SGE{}
	sends := [2][]transport.SendWR{}
	for k := range 2 {
		sges[k] = []transport.SGE{{Addr: c.mr.Addr() + uint64(cliSendOff+k*4096), Length: uint32(lens[k]), LKey: c.mr.LKey()}}
		sends[k] = []transport.SendWR{{ID: 1 << 32, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: sges[k]}}
	}
	recvSGE := make([]transport.SGE, cliRecvN)
	recvWR := make([]transport.RecvWR, cliRecvN)
	for i := range recvWR {
		recvSGE[i] = transport.SGE{Addr: c.mr.Addr() + uint64(i*4096), Length: 4096, LKey: c.mr.LKey()}
		recvWR[i] = transport.RecvWR{ID: uint64(i), SGL: recvSGE[i : i+1]}
	}
	ctx := context.Background()
	var rsp wire.Response
	wait := func() {
		for {
			n, err := c.cq.Poll(c.wcs[:1])
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				wc := &c.wcs[0]
				if wc.Status != transport.StatusSuccess {
					t.Fatalf("client completion %v", wc)
				}
				if wc.ID>>32 == 1 {
					continue
				}
				i := int(wc.ID)
				if err := rsp.Decode(c.arena.Bytes()[i*4096 : i*4096+int(wc.ByteLen)]); err != nil || rsp.Status != wire.StatusGood {
					t.Fatalf("response %+v %v", rsp, err)
				}
				c.qp.PostRecv(recvWR[i : i+1])
				return
			}
			c.cq.Wait(ctx)
		}
	}
	run := func() {
		for k := range 2 {
			if _, err := c.qp.PostSend(sends[k]); err != nil {
				t.Fatal(err)
			}
			wait()
		}
	}
	for range 50 {
		run()
	}
	a := testing.AllocsPerRun(500, run)
	t.Logf("loop wire: %.1f allocations per 16 KiB WRITE + READ (target, NIC and client together)", a)
	if a > 2 {
		t.Fatalf("%.1f allocations per WRITE+READ", a)
	}
}
