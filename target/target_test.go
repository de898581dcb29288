package target

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/logsink"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

func TestIO(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{Name: "tgt"})
		c := r.dial(t)
		lr := c.login("ini")
		if lr.Target != "tgt" || lr.Credits != 8 || lr.MaxTransfer != 256<<10 || lr.MaxDesc != wire.MaxDescriptors || !lr.RemoteInvalidate {
			t.Fatalf("login response %+v", lr)
		}
		lst := c.control(wire.ControlRequest{Op: wire.ControlList})
		if len(lst.Volumes) != 3 || lst.Volumes[0].Name != "ro" || !lst.Volumes[0].ReadOnly || lst.Volumes[1].Size != volSize {
			t.Fatalf("list %+v", lst)
		}
		orsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: "vol0"})
		if orsp.Handle == 0 || orsp.Size != volSize || orsp.BlockSize != bs || orsp.ReadOnly || orsp.Caps&wire.CapDiscard == 0 {
			t.Fatalf("open %+v", orsp)
		}
		h := orsp.Handle

		// WRITE 64 KiB in 3 descriptors, READ it back in 5.
		want := pattern(64<<10, 1)
		copy(c.data(0, len(want)), want)
		rsp, _ := c.do(c.io(wire.OpWrite, h, 8*bs, 0, len(want), 3))
		expectGood(t, rsp)
		got := make([]byte, len(want))
		if _, err := r.openVol(t, "vol0").ReadAt(got, 8*bs); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("volume content after WRITE differs (err %v)", err)
		}
		clear(c.data(256<<10, len(want)))
		rsp, _ = c.do(c.io(wire.OpRead, h, 8*bs, 256<<10, len(want), 5))
		expectGood(t, rsp)
		if !bytes.Equal(c.data(256<<10, len(want)), want) {
			t.Fatal("READ returned other data")
		}
		// FUA write.
		cmd := c.io(wire.OpWrite, h, 0, 0, bs, 1)
		cmd.Flags = wire.FlagFUA
		rsp, _ = c.do(cmd)
		expectGood(t, rsp)
		// FLUSH.
		rsp, _ = c.do(wire.Command{Op: wire.OpFlush, Volume: h})
		expectGood(t, rsp)
		// DISCARD the first half, WRITE_ZEROES the next 4 KiB: they read zeros.
		rsp, _ = c.do(wire.Command{Op: wire.OpDiscard, Volume: h, Offset: 8 * bs, Length: 32 << 10})
		expectGood(t, rsp)
		rsp, _ = c.do(wire.Command{Op: wire.OpWriteZeroes, Volume: h, Offset: 16 * bs, Length: bs})
		expectGood(t, rsp)
		rsp, _ = c.do(c.io(wire.OpRead, h, 8*bs, 256<<10, len(want), 1))
		expectGood(t, rsp)
		exp := append(make([]byte, 36<<10), want[36<<10:]...)
		if !bytes.Equal(c.data(256<<10, len(want)), exp) {
			t.Fatal("discarded / zeroed range does not read zeros")
		}
		// CLOSE, then the handle is gone.
		if crsp := c.control(wire.ControlRequest{Op: wire.ControlClose, Handle: h}); crsp.Error != "" {
			t.Fatalf("close %+v", crsp)
		}
		rsp, _ = c.do(c.io(wire.OpRead, h, 0, 0, bs, 1))
		expectSense(t, rsp, wire.SenseNoSuchVolume)

		st := r.tgt.Stats()
		if st.Connections != 1 || len(st.Conns) != 1 || st.Conns[0].Initiator != "ini" || st.Conns[0].Credits != 8 {
			t.Fatalf("stats %+v", st)
		}
		cs := st.Conns[0]
		if cs.Write.Ops != 2 || cs.Write.Bytes != 64<<10+bs || cs.Read.Ops != 3 || cs.Read.Errors != 1 || cs.Flush.Ops != 1 ||
			cs.Discard.Ops != 1 || cs.WriteZeroes.Ops != 1 || cs.Latency.Count() != 8 {
			t.Fatalf("conn stats %+v", cs.IOStats)
		}
		var vs *VolumeStats
		for i := range st.Volumes {
			if st.Volumes[i].Name == "vol0" {
				vs = &st.Volumes[i]
			}
		}
		if vs == nil || vs.Write.Ops != 2 || vs.Read.Ops != 2 {
			t.Fatalf("volume stats %+v", st.Volumes)
		}
	})
}

// openVol opens a volume of the rig's store directly (not through the
// target), closed at cleanup.
func (r *rig) openVol(tb testing.TB, name string) Volume {
	v, err := r.store.Open(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { v.Close() })
	return v
}

func TestBadCommands(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{ACL: &ACL{Rules: []ACLRule{{Initiator: "ini", Volume: "vol1", Access: AccessReadOnly}}}})
		c := r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		// Out of range: no data touched either way.
		sentinel := pattern(2*bs, 9)
		copy(c.data(0, 2*bs), sentinel)
		rsp, _ := c.do(c.io(wire.OpRead, h, volSize-bs, 0, 2*bs, 1))
		expectSense(t, rsp, wire.SenseOutOfRange)
		if rsp.Residual != 2*bs {
			t.Fatalf("residual %d", rsp.Residual)
		}
		if !bytes.Equal(c.data(0, 2*bs), sentinel) {
			t.Fatal("out-of-range READ wrote client memory")
		}
		rsp, _ = c.do(c.io(wire.OpWrite, h, volSize, 0, bs, 1))
		expectSense(t, rsp, wire.SenseOutOfRange)
		rsp, _ = c.do(c.io(wire.OpWrite, h, 1<<62, 0, bs, 1))
		expectSense(t, rsp, wire.SenseOutOfRange)
		rsp, _ = c.do(wire.Command{Op: wire.OpDiscard, Volume: h, Offset: volSize - bs, Length: 2 * bs})
		expectSense(t, rsp, wire.SenseOutOfRange)
		got := make([]byte, bs)
		r.openVol(t, "vol0").ReadAt(got, volSize-bs)
		if !bytes.Equal(got, make([]byte, bs)) {
			t.Fatal("out-of-range WRITE touched the volume")
		}
		// Misaligned offset and length.
		rsp, _ = c.do(c.io(wire.OpWrite, h, 512, 0, bs, 1))
		expectSense(t, rsp, wire.SenseMisaligned)
		rsp, _ = c.do(c.io(wire.OpRead, h, 0, 0, 1000, 1))
		expectSense(t, rsp, wire.SenseMisaligned)
		// Longer than MaxTransfer.
		rsp, _ = c.do(c.io(wire.OpRead, h, 0, 0, 512<<10, 2))
		expectSense(t, rsp, wire.SenseInvalidField)
		// Unknown handle.
		rsp, _ = c.do(c.io(wire.OpRead, h+7, 0, 0, bs, 1))
		expectSense(t, rsp, wire.SenseNoSuchVolume)
		// Read-only volume (catalog), read-only open, read-only by ACL.
		for _, o := range []struct {
			name string
			ro   bool
		}{{"ro", false}, {"vol0", true}, {"vol1", false}} {
			orsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: o.name, ReadOnly: o.ro})
			if orsp.Error != "" || !orsp.ReadOnly || orsp.Caps != wire.CapFlush {
				t.Fatalf("open %s: %+v", o.name, orsp)
			}
			rsp, _ = c.do(c.io(wire.OpWrite, orsp.Handle, 0, 0, bs, 1))
			expectSense(t, rsp, wire.SenseWriteProtected)
			rsp, _ = c.do(wire.Command{Op: wire.OpWriteZeroes, Volume: orsp.Handle, Length: bs})
			expectSense(t, rsp, wire.SenseWriteProtected)
			rsp, _ = c.do(c.io(wire.OpRead, orsp.Handle, 0, 0, bs, 1))
			expectGood(t, rsp)
		}
		// Unknown volume and unknown control op.
		if orsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: "nope"}); orsp.Sense != wire.SenseNoSuchVolume || orsp.Error == "" {
			t.Fatalf("open nope: %+v", orsp)
		}
		if orsp := c.control(wire.ControlRequest{Op: "resize"}); orsp.Sense != wire.SenseUnsupported {
			t.Fatalf("resize: %+v", orsp)
		}
		// The session is still fine.
		rsp, _ = c.do(c.io(wire.OpRead, h, 0, 0, bs, 1))
		expectGood(t, rsp)
	})
}

func TestACL(t *testing.T) {
	acl := &ACL{DenyByDefault: true, Rules: []ACLRule{
		{Initiator: "ini", Volume: "vol0", Access: AccessReadWrite},
		{Initiator: "*", Volume: "ro", Access: AccessReadOnly},
		{Initiator: "ini", Volume: "*", Access: AccessReadOnly},
		{Initiator: "ini", Volume: "vol1", Access: AccessNone},
	}}
	for _, tc := range []struct {
		ini, vol string
		want     Access
	}{{"ini", "vol0", AccessReadWrite}, {"ini", "vol1", AccessNone}, {"ini", "ro", AccessReadOnly},
		{"ini", "other", AccessReadOnly}, {"x", "vol0", AccessNone}, {"x", "ro", AccessReadOnly}} {
		if got := acl.Allow(tc.ini, tc.vol); got != tc.want {
			t.Errorf("Allow(%s, %s) = %s, want %s", tc.ini, tc.vol, got, tc.want)
		}
	}
	if (*ACL)(nil).Allow("a", "b") != AccessReadWrite || (&ACL{}).Allow("a", "b") != AccessReadWrite {
		t.Error("nil / zero ACL must allow read-write")
	}
	r := newRig(t, envs[0], Config{ACL: acl})
	c := r.dial(t)
	c.login("ini")
	lst := c.control(wire.ControlRequest{Op: wire.ControlList})
	if len(lst.Volumes) != 2 || lst.Volumes[0].Name != "ro" || lst.Volumes[1].Name != "vol0" || lst.Volumes[1].ReadOnly {
		t.Fatalf("filtered list %+v", lst.Volumes)
	}
	rsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: "vol1"})
	if rsp.Handle != 0 || rsp.Sense != wire.SenseAccessDenied || rsp.Error == "" {
		t.Fatalf("denied open %+v", rsp)
	}
	t.Logf("denied open: %s", rsp.Error)
	c.open("vol0", false)
	c2 := r.dial(t)
	c2.login("stranger")
	if rsp := c2.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: "vol0"}); rsp.Handle != 0 || rsp.Error == "" {
		t.Fatalf("stranger opened vol0: %+v", rsp)
	}
}

// TestSnapshotACL: a snapshot's access is at most its volume's. A rule
// on the volume covers its snapshots, in LIST and OPEN; a rule on the
// snapshot narrows and never widens.
func TestSnapshotACL(t *testing.T) {
	acl := &ACL{Rules: []ACLRule{
		{Initiator: "host-b", Volume: "*", Access: AccessReadWrite},
		{Initiator: "host-b", Volume: "vol0", Access: AccessNone},
		{Initiator: "host-b", Volume: "vol0@s1", Access: AccessReadOnly}, // cannot widen
		{Initiator: "host-c", Volume: "vol1", Access: AccessReadOnly},
		{Initiator: "host-c", Volume: "vol1@s2", Access: AccessNone}, // narrows
		{Initiator: "*", Volume: "vol1@s1", Access: AccessReadWrite},
	}}
	for _, tc := range []struct {
		ini, vol string
		want     Access
	}{
		{"host-b", "vol0@s1", AccessNone}, {"host-b", "vol0@s2", AccessNone}, {"host-b", "vol1@s1", AccessReadWrite},
		{"host-c", "vol1@s1", AccessReadOnly}, {"host-c", "vol1@s2", AccessNone}, {"host-c", "vol0@s1", AccessReadWrite},
		{"other", "vol1@s1", AccessReadWrite},
	} {
		if got := acl.Allow(tc.ini, tc.vol); got != tc.want {
			t.Errorf("Allow(%s, %s) = %s, want %s", tc.ini, tc.vol, got, tc.want)
		}
	}
	deny := &ACL{DenyByDefault: true, Rules: []ACLRule{{Initiator: "host-a", Volume: "vol0@s1", Access: AccessReadWrite}}}
	if got := deny.Allow("host-a", "vol0@s1"); got != AccessNone {
		t.Errorf("a snapshot rule widened a denied volume to %s", got)
	}

	r := newRig(t, envs[0], Config{ACL: acl})
	for _, v := range []string{"vol0", "vol1"} {
		for _, s := range []string{"s1", "s2"} {
			if _, err := r.store.Snapshot(v, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := r.dial(t)
	c.login("host-b")
	lst := c.control(wire.ControlRequest{Op: wire.ControlList})
	var names []string
	for _, v := range lst.Volumes {
		names = append(names, v.Name)
	}
	if got, want := strings.Join(names, ","), "ro,vol1,vol1@s1,vol1@s2"; got != want {
		t.Errorf("host-b lists %s, want %s", got, want)
	}
	for _, name := range []string{"vol0@s1", "vol0@s2"} {
		if rsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: name, ReadOnly: true}); rsp.Handle != 0 || !strings.Contains(rsp.Error, "access denied") {
			t.Errorf("host-b opened %s of a volume it may not open: %+v", name, rsp)
		}
	}
	h := c.open("vol1@s1", false)
	rsp, _ := c.do(c.io(wire.OpRead, h, 0, 0, bs, 1))
	expectGood(t, rsp)
	rsp, _ = c.do(c.io(wire.OpWrite, h, 0, 0, bs, 1))
	expectSense(t, rsp, wire.SenseWriteProtected)
}

func TestAuth(t *testing.T) {
	secrets := func(ini string) ([]byte, bool) {
		switch ini {
		case "alice":
			return []byte("alice-secret"), true
		case "nokey":
			return nil, true
		}
		return nil, false
	}
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{Name: "tgt", Secrets: secrets})
		// Wrong secret.
		c := r.dial(t)
		op, b := c.loginWith(c.loginRequest("alice"), []byte("wrong"))
		var rej wire.LoginReject
		if op != wire.OpLoginReject || wire.DecodeControl(b, op, &rej) != nil || rej.Reason != wire.RejectAuthFailed {
			t.Fatalf("wrong secret answered %s %+v", op, rej)
		}
		c.expectDisconnect()
		// Nothing could be opened: the session never existed.
		if st := r.tgt.Stats(); st.Rejected == 0 {
			t.Fatalf("stats %+v", st)
		}
		// Required with no secret configured.
		c = r.dial(t)
		op, b = c.loginWith(c.loginRequest("nokey"), nil)
		if op != wire.OpLoginReject || wire.DecodeControl(b, op, &rej) != nil || rej.Reason != wire.RejectAuthFailed {
			t.Fatalf("no secret answered %s %+v", op, rej)
		}
		// Right secret, naming the target; the target proves itself.
		c = r.dial(t)
		req := c.loginRequest("alice")
		req.Target = "tgt"
		op, b = c.loginWith(req, []byte("alice-secret"))
		var lr wire.LoginResponse
		if op != wire.OpLoginResponse || wire.DecodeControl(b, op, &lr) != nil {
			t.Fatalf("right secret answered %s", op)
		}
		want := wire.LoginProofFor([]byte("alice-secret"), "target", "alice", "tgt", req.Nonce, c.tgtNonce)
		if !bytes.Equal(lr.Proof, want) {
			t.Fatal("target proof does not verify")
		}
		c.open("vol0", false)
		// Not required: no challenge.
		c = r.dial(t)
		if lr := c.login("bob"); lr.Proof != nil {
			t.Fatalf("unexpected proof %x", lr.Proof)
		}
	})
}

func TestLoginRejects(t *testing.T) {
	r := newRig(t, envs[0], Config{Name: "tgt", LoginTimeout: 200 * time.Millisecond})
	reject := func(req wire.LoginRequest, want wire.RejectReason) {
		t.Helper()
		c := r.dial(t)
		op, b := c.loginWith(req, nil)
		var rej wire.LoginReject
		if op != wire.OpLoginReject || wire.DecodeControl(b, op, &rej) != nil || rej.Reason != want {
			t.Fatalf("login %+v answered %s %+v, want %s", req, op, rej, want)
		}
		c.expectDisconnect()
	}
	c := r.dial(t)
	req := c.loginRequest("ini")
	req.Version = 9
	reject(req, wire.RejectVersion)
	req = c.loginRequest("ini")
	req.MaxIU = 1 << 20
	reject(req, wire.RejectIUTooLarge)
	req = c.loginRequest("ini")
	req.Target = "other"
	reject(req, wire.RejectAccessDenied)
	// Negotiation takes the minimum of both sides.
	req = c.loginRequest("ini")
	req.Credits, req.MaxTransfer, req.MaxDesc, req.RemoteInvalidate = 3, 64<<10, 2, false
	c.send(wire.OpLogin, &req)
	b, _ := c.mustNext()
	var lr wire.LoginResponse
	if err := wire.DecodeControl(b, wire.OpLoginResponse, &lr); err != nil {
		t.Fatal(err)
	}
	if lr.Credits != 3 || lr.MaxTransfer != 64<<10 || lr.MaxDesc != 2 || lr.RemoteInvalidate {
		t.Fatalf("negotiated %+v", lr)
	}
	// A command before login, and silence past the login timeout.
	c = r.dial(t)
	var cmd wire.Command
	cmd.Op = wire.OpFlush
	c.postCommand(&cmd)
	c.expectDisconnect()
	c = r.dial(t)
	start := time.Now()
	c.expectDisconnect()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("login timeout took %v", d)
	}
}

func TestHello(t *testing.T) {
	r := newRig(t, envs[0], Config{})
	_, err := r.dialHello(t, []byte("NOTGOSRP"))
	var rej *transport.RejectError
	if !errors.As(err, &rej) || len(rej.PrivateData) != 0 {
		t.Fatalf("bad magic: %v", err)
	}
	_, err = r.dialHello(t, wire.Hello{Version: 7}.Encode())
	if !errors.As(err, &rej) {
		t.Fatalf("bad version: %v", err)
	}
	h, err := wire.DecodeHello(rej.PrivateData)
	if err != nil || h.Version != wire.Version {
		t.Fatalf("version reject carries %x (%v)", rej.PrivateData, err)
	}
	if st := r.tgt.Stats(); st.Rejected != 2 {
		t.Fatalf("rejected %d", st.Rejected)
	}
}

func TestViolations(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		// A malformed IU after login.
		c := r.dial(t)
		c.login("ini")
		c.sendIU([]byte{byte(wire.OpCommand), 1, 2, 3})
		c.expectDisconnect()
		// An unknown opcode, a second LOGIN, a target-side opcode.
		for _, iu := range [][]byte{{0x7f, 1, 2}, {byte(wire.OpResponse)}, nil} {
			c = r.dial(t)
			c.login("ini")
			if iu == nil {
				c.send(wire.OpLogin, &wire.LoginRequest{Version: 1})
			} else {
				c.sendIU(iu)
			}
			c.expectDisconnect()
		}
		// An IU larger than the target's receive buffers (the receive fails
		// with a local length error).
		c = r.dial(t)
		c.login("ini")
		if _, err := c.qp.PostSend([]transport.SendWR{{ID: 1 << 32, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{{Addr: c.mr.Addr() + cliSendOff, Length: 6000, LKey: c.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		c.expectDisconnect()
		// A LOGOUT is not a violation: the target just disconnects.
		c = r.dial(t)
		c.login("ini")
		c.sendIU([]byte{byte(wire.OpLogout)})
		c.expectDisconnect()
		// An RDMA READ through a bad rkey kills the connection, without a
		// response.
		c = r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		cmd := c.io(wire.OpWrite, h, 0, 0, bs, 1)
		cmd.Desc[0].RKey ^= 0x55
		c.postCommand(&cmd)
		c.expectDisconnect()
		// The target still serves everyone else.
		c = r.dial(t)
		c.login("ini")
		h = c.open("vol0", false)
		rsp, _ := c.do(c.io(wire.OpRead, h, 0, 0, bs, 1))
		expectGood(t, rsp)
		waitFor(t, "violation count", func() bool { return r.tgt.Stats().Violations == 6 })
	})
}

func TestCreditOverrun(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{Credits: 2})
		gate, _ := r.gateReads()
		defer close(gate)
		c := r.dial(t)
		if lr := c.login("ini"); lr.Credits != 2 {
			t.Fatalf("credits %d", lr.Credits)
		}
		h := c.open("vol0", false)
		for i := 0; i < 3; i++ {
			cmd := c.io(wire.OpRead, h, uint64(i)*bs, i*bs, bs, 1)
			c.postCommand(&cmd)
		}
		c.expectDisconnect()
	})
}

// TestPendingSlots drives more requests than slots back to back: a new
// command may arrive (legitimately, its credit returned) before the
// previous response's SEND completion has been polled.
func TestPendingSlots(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{Credits: 4})
		c := r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		inflight, sent, done := 0, 0, 0
		for done < 400 {
			for inflight < 4 && sent < 400 {
				op := wire.OpWrite
				if sent%2 == 1 {
					op = wire.OpRead
				}
				cmd := c.io(op, h, uint64(sent%64)*bs, (sent%4)*bs, bs, 1)
				c.postCommand(&cmd)
				sent++
				inflight++
			}
			rsp, _ := c.readResponse()
			expectGood(t, rsp)
			inflight--
			done++
		}
	})
}

func TestShutdownDrains(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		gate, entered := r.gateReads()
		c := r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		want := pattern(bs, 3)
		r.openVol(t, "vol0").WriteAt(want, 0)
		cmd := c.io(wire.OpRead, h, 0, 0, bs, 1)
		c.postCommand(&cmd)
		<-entered
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- r.tgt.Shutdown(ctx)
		}()
		waitFor(t, "Serve to stop", func() bool {
			select {
			case err := <-r.serve:
				r.serve <- err
				return true
			default:
				return false
			}
		})
		// Serve returns once the listeners close, before the connection's
		// loop takes the drain signal; a command it polls before that is
		// served (and here gated), so wait for the drain to be taken.
		waitFor(t, "the connection to drain", func() bool {
			s := r.tgt.Stats()
			return len(s.Conns) == 1 && s.Conns[0].State == "DRAINING"
		})
		// A command arriving while draining is answered Busy.
		cmd2 := c.io(wire.OpRead, h, 0, bs, bs, 1)
		c.postCommand(&cmd2)
		rsp, _ := c.readResponse()
		if rsp.Status != wire.StatusBusy || rsp.Tag != cmd2.Tag {
			t.Fatalf("command during drain: %+v", rsp)
		}
		close(gate)
		rsp, _ = c.readResponse()
		expectGood(t, rsp)
		if !bytes.Equal(c.data(0, bs), want) {
			t.Fatal("drained READ data differs")
		}
		c.expectDisconnect()
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if _, err := r.dialHello(t, wire.Hello{Version: wire.Version}.Encode()); err == nil {
			t.Fatal("connected after shutdown")
		}
	})
}

func TestShutdownForced(t *testing.T) {
	r := newRig(t, envs[0], Config{})
	gate, entered := r.gateReads()
	c := r.dial(t)
	c.login("ini")
	h := c.open("vol0", false)
	cmd := c.io(wire.OpRead, h, 0, 0, bs, 1)
	c.postCommand(&cmd)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.tgt.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("forced shutdown: %v", err)
	}
	c.expectDisconnect()
	close(gate)
}

func TestRemoteInvalidate(t *testing.T) {
	for _, e := range envs {
		t.Run(e.String(), func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				name            string
				disable, iniOff bool
				flag            bool
				wantInv         bool
			}{
				{"allowed", false, false, true, true},
				{"not-asked", false, false, false, false},
				{"target-disabled", true, false, true, false},
				{"initiator-declined", false, true, true, false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r := newRig(t, e, Config{DisableRemoteInvalidate: tc.disable})
					c := r.dial(t)
					req := c.loginRequest("ini")
					req.RemoteInvalidate = !tc.iniOff
					op, b := c.loginWith(req, nil)
					var lr wire.LoginResponse
					if op != wire.OpLoginResponse || wire.DecodeControl(b, op, &lr) != nil || lr.RemoteInvalidate != (!tc.disable && !tc.iniOff) {
						t.Fatalf("login %s %+v", op, lr)
					}
					h := c.open("vol0", false)
					for _, dir := range []wire.Op{wire.OpWrite, wire.OpRead} {
						key, cmd := c.fastReg(dir, h)
						if tc.flag {
							cmd.Flags |= wire.FlagInvalidate
							cmd.InvalidateKey = uint32(key)
						}
						rsp, wc := c.do(cmd)
						expectGood(t, rsp)
						gotInv := wc.Flags&transport.WCWithInv != 0
						if gotInv != tc.wantInv || (gotInv && wc.InvalidatedKey != key) {
							t.Fatalf("%s: completion %v, want invalidate=%v of %s", dir, &wc, tc.wantInv, key)
						}
						info, _ := c.p.MRInfo(key.Index())
						if tc.wantInv != (info.State == "FREE") {
							t.Fatalf("%s: MR state %s after response", dir, info.State)
						}
						c.releaseFastReg(key, gotInv)
					}
				})
			}
		})
	}
}

// fastReg registers 8 KiB of client data with a fresh FRMR (REG_MR chained
// like an initiator does) and returns its key and a command using it.
func (c *client) fastReg(dir wire.Op, h uint32) (transport.Key, wire.Command) {
	c.tb.Helper()
	if c.frmr == nil {
		f, err := c.pd.AllocFastRegMR(8)
		if err != nil {
			c.tb.Fatal(err)
		}
		c.frmr = f
		c.frmrKey = f.Key()
		c.tb.Cleanup(func() { f.Close() })
	}
	c.frmrKey = c.frmrKey.Bump()
	iova := uint64(0x5a00_0000_0000_0000) + uint64(c.frmrKey.Variant())<<32
	if err := c.frmr.Map(c.arena, cliDataOff, 2*bs, iova); err != nil {
		c.tb.Fatal(err)
	}
	access := transport.AccessRemoteRead
	if dir == wire.OpRead {
		access = transport.AccessLocalWrite | transport.AccessRemoteWrite
	}
	if _, err := c.qp.PostSend([]transport.SendWR{{ID: 1 << 32, Opcode: transport.OpRegMR,
		Reg: transport.RegWR{MR: c.frmr, Key: c.frmrKey, Access: access}}}); err != nil {
		c.tb.Fatal(err)
	}
	cmd := wire.Command{Op: dir, Volume: h, Length: 2 * bs, NDesc: 1}
	cmd.Desc[0] = wire.Descriptor{VA: iova, RKey: uint32(c.frmrKey), Len: 2 * bs}
	return c.frmrKey, cmd
}

// releaseFastReg invalidates the FRMR locally when the target did not.
func (c *client) releaseFastReg(key transport.Key, invalidated bool) {
	c.tb.Helper()
	if invalidated {
		return
	}
	if _, err := c.qp.PostSend([]transport.SendWR{{ID: 2 << 32, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled,
		InvalidateKey: key}}); err != nil {
		c.tb.Fatal(err)
	}
	for {
		n, err := c.cq.Poll(c.wcs[:1])
		if err != nil {
			c.tb.Fatal(err)
		}
		if n == 1 && c.wcs[0].ID == 2<<32 {
			if c.wcs[0].Status != transport.StatusSuccess {
				c.tb.Fatalf("LOCAL_INV %v", &c.wcs[0])
			}
			return
		}
		if n == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// TestInstance: every login to one Target carries the same nonzero
// instance, and another Target (a restarted process) has another one.
func TestInstance(t *testing.T) {
	e := env{wire: "loop", profile: "strict"}
	r := newRig(t, e, Config{Name: "tgt"})
	first := r.dial(t).login("ini")
	second := r.dial(t).login("ini")
	if first.Instance == 0 || first.Instance != second.Instance || first.Instance != r.tgt.Instance() {
		t.Fatalf("instances %#x, %#x, target says %#x", first.Instance, second.Instance, r.tgt.Instance())
	}
	other := newRig(t, e, Config{Name: "tgt"})
	if got := other.dial(t).login("ini").Instance; got == first.Instance || got == 0 {
		t.Fatalf("a second target has instance %#x, the first %#x", got, first.Instance)
	}
}

// revokeWithin is how soon a policy change must reach an open session.
const revokeWithin = time.Second

// within polls cond (one request per try) until it holds, failing the
// test if that takes longer than revokeWithin.
func within(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > revokeWithin {
			tb.Fatalf("%s: not within %v", what, revokeWithin)
		}
		time.Sleep(time.Millisecond)
	}
	tb.Logf("%s after %v", what, time.Since(start).Round(time.Microsecond))
}

// TestRevocation: an ACL change reaches volumes a session has open. A
// volume the host may no longer open is closed (the store can delete
// it) and its commands, including a WRITE whose data was in flight,
// are answered access denied; one narrowed to read-only refuses
// writes; the handle stays reserved until the initiator closes it; the
// change is logged; another host's session is untouched.
func TestRevocation(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		var logs logsink.Buffer
		r := newRig(t, e, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		c := r.dial(t)
		c.login("host-b")
		h0, h1 := c.open("vol0", false), c.open("vol1", false)
		other := r.dial(t)
		other.login("host-c")
		oh := other.open("vol0", false)
		for _, h := range []uint32{h0, h1} {
			rsp, _ := c.do(c.io(wire.OpWrite, h, 0, 0, bs, 1))
			expectGood(t, rsp)
		}
		if err := r.store.Delete("vol0"); !errors.Is(err, block.ErrBusy) {
			t.Fatalf("delete of an open volume: %v", err)
		}

		r.tgt.SetACL(&ACL{Rules: []ACLRule{
			{Initiator: "host-b", Volume: "vol0", Access: AccessNone},
			{Initiator: "host-b", Volume: "vol1", Access: AccessReadOnly},
		}})
		within(t, "READ of a revoked volume denied", func() bool {
			rsp, _ := c.do(c.io(wire.OpRead, h0, 0, 0, bs, 1))
			return rsp.Status == wire.StatusError && rsp.Sense == wire.SenseAccessDenied
		})
		for _, cmd := range []wire.Command{c.io(wire.OpWrite, h0, 0, 0, bs, 1), {Op: wire.OpFlush, Volume: h0},
			{Op: wire.OpDiscard, Volume: h0, Length: bs}} {
			rsp, _ := c.do(cmd)
			expectSense(t, rsp, wire.SenseAccessDenied)
		}
		rsp, _ := c.do(c.io(wire.OpWrite, h1, 0, 0, bs, 1))
		expectSense(t, rsp, wire.SenseWriteProtected)
		rsp, _ = c.do(c.io(wire.OpRead, h1, 0, 0, bs, 1))
		expectGood(t, rsp)
		// host-c keeps its session and its read-write handle.
		rsp, _ = other.do(other.io(wire.OpWrite, oh, 0, 0, bs, 1))
		expectGood(t, rsp)
		// A new OPEN takes another number, and is refused anyway.
		if orsp := c.control(wire.ControlRequest{Op: wire.ControlOpen, Volume: "vol0"}); orsp.Sense != wire.SenseAccessDenied || orsp.Handle != 0 {
			t.Fatalf("open after revocation: %+v", orsp)
		}
		if orsp := c.control(wire.ControlRequest{Op: wire.ControlClose, Handle: h0}); orsp.Error != "" {
			t.Fatalf("close of a revoked handle: %+v", orsp)
		}
		rsp, _ = c.do(c.io(wire.OpRead, h0, 0, 0, bs, 1))
		expectSense(t, rsp, wire.SenseNoSuchVolume)
		// host-b's handle was the one keeping vol0 open but for host-c's.
		other.control(wire.ControlRequest{Op: wire.ControlClose, Handle: oh})
		waitFor(t, "vol0 closed by the target", func() bool { return r.store.Delete("vol0") == nil })
		log := logs.String()
		for _, want := range []string{"access rules changed", "access revoked: volume closed", "volume=vol0",
			"access narrowed to read-only", "volume=vol1", "initiator=host-b"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		if strings.Contains(log, "initiator=host-c") {
			t.Errorf("host-c's session was re-evaluated into a change:\n%s", log)
		}
	})
}

// TestSecretChangeEndsSession: changing or removing a host's secret ends
// its sessions, which must log in again with the new secret (the old one
// fails); a login waiting for its proof is rejected; other hosts'
// sessions stay.
func TestSecretChangeEndsSession(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]string{"alice": "old-secret"}
	secrets := func(ini string) ([]byte, bool) {
		mu.Lock()
		defer mu.Unlock()
		k, ok := keys[ini]
		return []byte(k), ok
	}
	set := func(ini, k string) {
		mu.Lock()
		defer mu.Unlock()
		if k == "" {
			delete(keys, ini)
		} else {
			keys[ini] = k
		}
	}
	var logs logsink.Buffer
	r := newRig(t, envs[0], Config{Name: "tgt", Secrets: secrets, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	login := func(c *client, secret string) wire.Opcode {
		op, _ := c.loginWith(c.loginRequest("alice"), []byte(secret))
		return op
	}
	a := r.dial(t)
	if op := login(a, "old-secret"); op != wire.OpLoginResponse {
		t.Fatalf("login answered %s", op)
	}
	ah := a.open("vol0", false)
	bob := r.dial(t)
	bob.login("bob")
	bh := bob.open("vol1", false)
	// A PolicyChanged with nothing changed ends nothing.
	r.tgt.PolicyChanged()
	rsp, _ := a.do(a.io(wire.OpRead, ah, 0, 0, bs, 1))
	expectGood(t, rsp)

	// A login that has its challenge and not yet sent its proof.
	pend := r.dial(t)
	pend.send(wire.OpLogin, pend.loginRequest("alice"))
	if b, _ := pend.mustNext(); wire.Opcode(b[0]) != wire.OpLoginChallenge {
		t.Fatalf("login answered %s, want a challenge", wire.Opcode(b[0]))
	}

	set("alice", "new-secret")
	start := time.Now()
	r.tgt.PolicyChanged()
	a.expectDisconnect()
	if d := time.Since(start); d > revokeWithin {
		t.Errorf("the session ended %v after the secret changed", d)
	}
	b, _ := pend.mustNext()
	var rej wire.LoginReject
	if wire.Opcode(b[0]) != wire.OpLoginReject || wire.DecodeControl(b, wire.OpLoginReject, &rej) != nil || rej.Reason != wire.RejectAuthFailed {
		t.Fatalf("pending login answered %s %+v, want an auth-failed reject", wire.Opcode(b[0]), rej)
	}
	if !strings.Contains(logs.String(), "session ended by a policy change") {
		t.Errorf("no log line for the ended session:\n%s", logs.String())
	}
	if op := login(r.dial(t), "old-secret"); op != wire.OpLoginReject {
		t.Fatalf("login with the old secret answered %s", op)
	}
	a = r.dial(t)
	if op := login(a, "new-secret"); op != wire.OpLoginResponse {
		t.Fatalf("login with the new secret answered %s", op)
	}
	rsp, _ = bob.do(bob.io(wire.OpWrite, bh, 0, 0, bs, 1))
	expectGood(t, rsp)

	// Removing the secret ends the session too.
	set("alice", "")
	r.tgt.PolicyChanged()
	a.expectDisconnect()
	rsp, _ = bob.do(bob.io(wire.OpRead, bh, 0, 0, bs, 1))
	expectGood(t, rsp)
	waitFor(t, "only bob's connection left", func() bool { return r.tgt.Stats().Connections == 1 })
}

// TestReadCredit: an initiator that serves no RDMA READs is refused at
// connect, over gosrp's hello and an SRP login alike, since every write
// the target fetched would wait for ever; one that serves a single READ
// and asks for none of its own (as the kernel's ib_srp) gets large
// writes done, several at once sharing that one credit.
func TestReadCredit(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		r.offer = &transport.ReadCredit{Out: transport.MaxReadCredit, In: 0}
		_, err := r.dialHello(t, wire.Hello{Version: wire.Version}.Encode())
		var rej *transport.RejectError
		if !errors.As(err, &rej) {
			t.Fatalf("gosrp hello without READ credit: %v, want a reject", err)
		}
		if got := r.srpReject(t, srpLoginReq(1)); got.Reason != srp.RejectInsufficientResources {
			t.Fatalf("SRP login without READ credit rejected for %v", got.Reason)
		}
		if st := r.tgt.Stats(); st.Rejected != 2 {
			t.Fatalf("rejected %d, want 2", st.Rejected)
		}

		r.offer = &transport.ReadCredit{Out: 0, In: 1}
		c := r.dial(t)
		c.login("ini")
		h := c.open("vol0", false)
		const n, size = 4, 64 << 10
		want := pattern(n*size, 9)
		copy(c.data(0, n*size), want)
		for i := range n {
			cmd := c.io(wire.OpWrite, h, uint64(i*size), i*size, size, 2)
			c.postCommand(&cmd)
		}
		for range n {
			rsp, _ := c.readResponse()
			expectGood(t, rsp)
		}
		clear(c.data(0, n*size))
		rsp, _ := c.do(c.io(wire.OpRead, h, 0, 0, n*size, 4))
		expectGood(t, rsp)
		if !bytes.Equal(c.data(0, n*size), want) {
			t.Fatal("data read back differs from what was written")
		}
	})
}
