package target

import (
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport/emu"
)

func fuzzSeeds(f *testing.F) {
	enc := func(op wire.Opcode, v any) []byte {
		b, err := wire.EncodeControl(nil, op, v)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	cmd := func(c wire.Command) []byte {
		b := make([]byte, c.EncodedLen())
		c.Encode(b)
		return b
	}
	login := wire.LoginRequest{Version: wire.Version, Initiator: "fz", Credits: 4, MaxIU: 296, MaxRecvIU: 4096,
		MaxTransfer: 1 << 20, MaxDesc: 16, RemoteInvalidate: true}
	rd := wire.Command{Op: wire.OpRead, Volume: 1, Length: 4096, NDesc: 1}
	rd.Desc[0] = wire.Descriptor{VA: 0x1000, RKey: 0x77, Len: 4096}
	wr := rd
	wr.Op, wr.Flags, wr.InvalidateKey = wire.OpWrite, wire.FlagInvalidate|wire.FlagFUA, 0x77
	imm := cmd(wire.Command{Op: wire.OpWrite, Flags: wire.FlagImmediate, Volume: 1, Length: 1024})
	imm = append(imm, make([]byte, 1024)...)
	for phase := byte(0); phase < 3; phase++ {
		f.Add(phase, enc(wire.OpLogin, &login))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlList}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "vol0"}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlClose, Handle: 1}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlReserveOut, Handle: 1, Action: wire.ActionRegister, NewKey: 1}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlReserveIn, Handle: 1}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "mem", Exclusive: true}))
		f.Add(phase, enc(wire.OpControl, &wire.ControlRequest{Op: wire.ControlExtents, Handle: 1, Offset: 4096, Length: 1 << 20}))
		f.Add(phase, cmd(rd))
		f.Add(phase, cmd(wr))
		f.Add(phase, imm)
		f.Add(phase, cmd(wire.Command{Op: wire.OpDiscard, Volume: 1, Offset: 1 << 40, Length: 4096}))
		f.Add(phase, []byte{byte(wire.OpLogout)})
		f.Add(phase, []byte{byte(wire.OpLoginProof), 0x80})
		f.Add(phase, []byte{0xff, 0xff, 0xff})
		f.Add(phase, []byte{byte(wire.OpControl), 0xdf, 0xff, 0xff, 0xff, 0xff})
	}
}

// FuzzIU sends one arbitrary IU at a chosen point of a real connection
// (before login, after login, after an OPEN) over the emu loop wire. The
// target must answer it or disconnect, never panic or hang, and must still
// serve a well-behaved client afterwards.
func FuzzIU(f *testing.F) {
	fuzzSeeds(f)
	r := newRig(f, env{emu.WireLoop, "strict"}, Config{Credits: 4, MaxTransfer: 64 << 10, LoginTimeout: 2 * time.Second})
	f.Fuzz(func(t *testing.T, phase byte, iu []byte) {
		if len(iu) == 0 || len(iu) > 4096 {
			return
		}
		c := r.dial(t)
		var h uint32
		if phase%3 >= 1 {
			c.login("fz")
		}
		if phase%3 == 2 {
			h = c.open("vol0", false)
		}
		if err := c.sendIU(iu); err != nil {
			t.Fatal(err)
		}
		// Follow with a FLUSH (after login) and read until its answer or
		// the disconnect.
		const tag = 0xf1f1f1f1
		if phase%3 >= 1 {
			var b [wire.MaxCommandLen]byte
			cmd := wire.Command{Op: wire.OpFlush, Volume: h, Tag: tag}
			n, _ := cmd.Encode(b[:])
			c.sendIU(b[:n])
		}
		for {
			b, _, err := c.next(5 * time.Second)
			if errors.Is(err, errDisconnected) {
				break
			}
			if err != nil {
				t.Fatalf("target neither answered nor disconnected: %v", err)
			}
			var rsp wire.Response
			if phase%3 == 0 || (rsp.Decode(b) == nil && rsp.Tag == tag) {
				break
			}
		}
		c.close()
		// The target still serves a good client.
		g := r.dial(t)
		g.login("good")
		gh := g.open("vol1", false)
		rsp, _ := g.do(g.io(wire.OpRead, gh, 0, 0, 4096, 1))
		expectGood(t, rsp)
		g.close()
	})
}

// FuzzCore feeds arbitrary IU sequences straight into a connection core:
// it must never panic, and every step must leave its accounting sane.
func FuzzCore(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, phase byte, iu []byte) {
		if len(iu) == 0 || len(iu) > recvSize {
			return
		}
		h := newCoreHarness(t, 4)
		if phase%3 >= 1 {
			req := wire.LoginRequest{Version: wire.Version, Initiator: "i", Credits: 4, MaxIU: 296, MaxRecvIU: 4096, MaxImmediate: 2048}
			b, _ := wire.EncodeControl(nil, wire.OpLogin, &req)
			h.deliver(0, b)
			h.step()
		}
		if phase%3 == 2 {
			b, _ := wire.EncodeControl(nil, wire.OpControl, &wire.ControlRequest{Op: wire.ControlOpen, Volume: "mem"})
			h.deliver(1, b)
			h.step()
		}
		h.feed(t, iu, 2)
	})
}

// feed delivers iu up to three times from receive buffer first on, until
// the core disconnects, and fails if the core refused its own move or its
// accounting went wrong.
func (h *coreHarness) feed(t *testing.T, iu []byte, first int) {
	for i := 0; i < 3 && !h.c.acts.disconnect; i++ {
		h.deliver(first+i, iu)
		h.stepLenient()
	}
	if h.c.bug != nil {
		t.Fatalf("core refused its own move: %v", h.c.bug)
	}
	if h.c.outstanding < 0 || h.c.outstanding > h.c.credits+1 || h.c.sqPosted < h.c.sqDone {
		t.Fatalf("accounting: outstanding %d, sq %d/%d", h.c.outstanding, h.c.sqPosted, h.c.sqDone)
	}
}

// stepLenient is step that stops at a disconnect instead of failing.
func (h *coreHarness) stepLenient() {
	for !h.c.acts.disconnect && (len(h.c.acts.jobs) > 0 || len(h.c.acts.send) > 0) {
		h.step1()
	}
}
