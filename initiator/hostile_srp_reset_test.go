package initiator_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/logsink"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// tmfHost is a host that speaks nothing but SRP task management: one
// channel on the raw transport, logged in with its own initiator port,
// sending one SRP_TSK_MGMT at a time and waiting for its answer, as fast
// as the target answers.
type tmfHost struct {
	pd    transport.PD
	cq    transport.CQ
	qp    transport.QP
	cm    transport.Conn
	arena *transport.Arena
	mr    transport.MR
	wcs   [8]transport.WC
	tag   uint64
}

const (
	tmfRecvN = 16
	tmfIU    = 256
)

// dialTMFHost logs port in at addr through p, read-write or not as the
// target's ACL says; the test's cleanup ends the connection.
func dialTMFHost(t *testing.T, p *emu.Provider, addr string, port [16]byte) *tmfHost {
	t.Helper()
	d, err := p.OpenDevice("")
	if err != nil {
		t.Fatal(err)
	}
	h := &tmfHost{}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	h.pd, err = d.AllocPD()
	must(err)
	t.Cleanup(func() { h.pd.Close() })
	h.cq, err = d.CreateCQ(64)
	must(err)
	t.Cleanup(func() { h.cq.Close() })
	h.qp, err = h.pd.CreateQP(transport.QPConfig{SendCQ: h.cq, RecvCQ: h.cq, MaxSendWR: 8, MaxRecvWR: tmfRecvN, MaxSendSGE: 1, MaxRecvSGE: 1})
	must(err)
	t.Cleanup(func() { h.qp.Close() })
	h.arena, err = transport.NewArena((tmfRecvN+1)*tmfIU, transport.ArenaOptions{})
	must(err)
	t.Cleanup(func() { h.arena.Close() })
	h.mr, err = h.pd.RegMR(h.arena, 0, h.arena.Len(), transport.AccessLocalWrite)
	must(err)
	t.Cleanup(func() { h.mr.Close() })
	must(h.qp.Modify(transport.QPInit))
	for i := range tmfRecvN {
		must(h.repost(i))
	}
	ep, err := p.Resolve(context.Background(), addr)
	must(err)
	req := srp.LoginRequest{Tag: 0xb0b, MaxITIULen: 64, BufFormats: srp.BufFormatDirect | srp.BufFormatIndirect,
		Flags: srp.MultiChanSingle, InitiatorPortID: port, TargetPortID: srpPort}
	b := make([]byte, srp.LoginRequestRDMALen)
	_, err = req.EncodeRDMA(b)
	must(err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.cm, err = ep.Connect(ctx, h.qp, b)
	must(err)
	t.Cleanup(func() { h.cm.Disconnect() })
	return h
}

func (h *tmfHost) repost(i int) error {
	sge := []transport.SGE{{Addr: h.mr.Addr() + uint64(i*tmfIU), Length: tmfIU, LKey: h.mr.LKey()}}
	_, err := h.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: sge}})
	return err
}

// send posts iu from the send buffer (one IU in flight at a time).
func (h *tmfHost) send(iu []byte) error {
	off := tmfRecvN * tmfIU
	n := copy(h.arena.Bytes()[off:off+tmfIU], iu)
	sgl := []transport.SGE{{Addr: h.mr.Addr() + uint64(off), Length: uint32(n), LKey: h.mr.LKey()}}
	_, err := h.qp.PostSend([]transport.SendWR{{ID: 1 << 32, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: sgl}})
	return err
}

// taskMgmt sends fn for lun and waits for its answer; it returns the
// response code (SRP r16a table 24). An SRP_CRED_REQ on the way is
// answered as ib_srp answers it.
func (h *tmfHost) taskMgmt(ctx context.Context, fn srp.TaskFunc, lun uint16) (uint8, error) {
	h.tag++
	tm := srp.TaskMgmt{Tag: h.tag, LUN: scsi.EncodeLUN(lun), Function: fn}
	var b [srp.TaskMgmtLen]byte
	if _, err := tm.Encode(b[:]); err != nil {
		return 0, err
	}
	if err := h.send(b[:]); err != nil {
		return 0, err
	}
	for {
		iu, err := h.next(ctx)
		if err != nil {
			return 0, err
		}
		switch op, _ := srp.PeekOpcode(iu); op {
		case srp.OpCredReq:
			var q srp.CredReq
			if err := q.Decode(iu); err != nil {
				return 0, err
			}
			var a [srp.TargetRspLen]byte
			(&srp.TargetRsp{Op: srp.OpCredRsp, Tag: q.Tag}).Encode(a[:])
			if err := h.send(a[:]); err != nil {
				return 0, err
			}
		case srp.OpRsp:
			var r srp.Rsp
			if err := r.Decode(iu); err != nil {
				return 0, err
			}
			if r.Tag != tm.Tag || len(r.Resp) != 4 {
				return 0, fmt.Errorf("%s answered %+v", fn, r)
			}
			return r.Resp[3], nil
		default:
			return 0, fmt.Errorf("%s: unexpected %s", fn, op)
		}
	}
}

// next waits for the next IU the target sends.
func (h *tmfHost) next(ctx context.Context) ([]byte, error) {
	for {
		n, err := h.cq.Poll(h.wcs[:1])
		if err != nil {
			return nil, err
		}
		if n == 1 {
			wc := h.wcs[0]
			if wc.Status != transport.StatusSuccess {
				return nil, fmt.Errorf("tmf host: %v", &wc)
			}
			if wc.ID>>32 == 1 {
				continue
			}
			i := int(wc.ID)
			iu := append([]byte(nil), h.arena.Bytes()[i*tmfIU:i*tmfIU+int(wc.ByteLen)]...)
			return iu, h.repost(i)
		}
		if err := h.cq.Wait(ctx); err != nil {
			return nil, err
		}
	}
}

// TestHostileSRPResetFlood: host B, allowed only to read the volume,
// loops LOGICAL UNIT RESET (every fourth an ABORT TASK SET) as fast as
// the target answers, while host A, allowed to write it, runs a fixed
// count of verified writes through the gosrp SRP initiator at QD 8
// (every block stamped with its LBA and a generation, read back after
// the write, and the whole region checked at the end). Each reset
// aborts A's running commands (SAM-5 6.3.3), which srpd answers TASK
// ABORTED (TAS) and A re-issues, and raises a unit attention for A's
// nexus, which A's next command reports and re-issues too. A must see
// no I/O error and no mismatch; A's commands must have been aborted,
// or the run proved nothing; every reset is answered FUNCTION
// COMPLETE (SAM and SPC do not tie task management to access rights);
// and the target logs a few dozen lines about the flood, not one per
// reset and connection.
func TestHostileSRPResetFlood(t *testing.T) {
	for _, profile := range emu.Profiles() {
		t.Run(profile, func(t *testing.T) { resetFlood(t, profile) })
	}
}

// resetFlood is TestHostileSRPResetFlood on one emu profile.
func resetFlood(t *testing.T, profile string) {
	const (
		workers = 8
		perW    = 100 // writes per worker, each read back
		region  = 64  // blocks per worker
		bs      = 4096
	)
	seed := testSeed(t)
	var aborted, attentions atomic.Int64
	script := targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		// Only A sends commands; B's answers are task management
		// responses, GOOD.
		var r srp.Rsp
		if iu := rsp.IU(); len(iu) < srp.RspLen || srp.Opcode(iu[0]) != srp.OpRsp || r.Decode(iu) != nil {
			return targettest.Pass
		}
		switch sn, err := scsi.ParseSense(r.Sense); {
		case r.Status == uint8(scsi.StatusTaskAborted):
			aborted.Add(1)
		case r.Status == uint8(scsi.StatusCheckCondition) && err == nil && sn.Key == scsi.KeyUnitAttention:
			attentions.Add(1)
		}
		return targettest.Pass
	}}
	portB := initiator.SRPPortID("resetter")
	acl := &target.ACL{Rules: []target.ACLRule{{Initiator: hex.EncodeToString(portB[:]), Volume: "vol0", Access: target.AccessReadOnly}}}
	var logs logsink.Buffer
	r := newHostileRigWith(t, profile, script, target.Config{SRPTargetPortID: srpPort, ACL: acl,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s := dial(t, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "writer", Logger: quiet, Protocol: initiator.ProtocolSRP,
		SRPTargetPortID: srpPort, Credits: 16})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := dialTMFHost(t, r.ip, r.addr, portB)

	var done atomic.Bool
	var resets, sets atomic.Int64
	flood := make(chan error, 1)
	// The writers start once the first reset is answered, so that the
	// flood covers the whole run.
	started := make(chan struct{})
	go func() {
		defer func() {
			select {
			case <-started:
			default:
				close(started)
			}
		}()
		for i := 0; !done.Load(); i++ {
			fn := srp.TaskLUNReset
			if i%4 == 3 {
				fn = srp.TaskAbortTaskSet
			}
			code, err := b.taskMgmt(ctx, fn, 0)
			if err == nil && code != 0 {
				err = fmt.Errorf("%s answered response code %d, want FUNCTION COMPLETE", fn, code)
			}
			if err != nil {
				flood <- err
				return
			}
			if fn == srp.TaskLUNReset {
				if resets.Add(1) == 1 {
					close(started)
				}
			} else {
				sets.Add(1)
			}
		}
		flood <- nil
	}()

	// The model: gens is each block's last generation written; known is
	// the last one known to be there, below gens while a write that
	// failed may or may not have landed.
	gens, known := make([]uint32, workers*region), make([]uint32, workers*region)
	verify := func(b []byte, lba int) error {
		if gens[lba] == known[lba] {
			return check(b, uint64(lba), gens[lba])
		}
		g := binary.LittleEndian.Uint32(b[8:])
		if g < known[lba] || g > gens[lba] {
			g = gens[lba]
		}
		if err := check(b, uint64(lba), g); err != nil {
			return err
		}
		known[lba] = g
		gens[lba] = g
		return nil
	}
	var ioErrs, mismatches atomic.Int64
	var firstErr sync.Once
	<-started
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			buf, got := make([]byte, 4*bs), make([]byte, 4*bs)
			base := w * region
			for range perW {
				n := 1 + 3*rng.IntN(2) // immediate data and registered buffers
				lba := base + rng.IntN(region-n+1)
				for k := range n {
					gens[lba+k]++
					pattern(buf[k*bs:(k+1)*bs], uint64(lba+k), gens[lba+k], uint64(seed))
				}
				_, werr := v.WriteAt(buf[:n*bs], int64(lba)*bs)
				if werr == nil {
					copy(known[lba:lba+n], gens[lba:lba+n])
				}
				_, rerr := v.ReadAt(got[:n*bs], int64(lba)*bs)
				for _, err := range []error{werr, rerr} {
					if err != nil {
						ioErrs.Add(1)
						firstErr.Do(func() { t.Errorf("worker %d: %v", w, err) })
					}
				}
				if rerr != nil {
					continue
				}
				for k := range n {
					if err := verify(got[k*bs:(k+1)*bs], lba+k); err != nil {
						mismatches.Add(1)
						t.Errorf("worker %d: %v", w, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	done.Store(true)
	if err := <-flood; err != nil {
		t.Errorf("host B: %v", err)
	}
	// The whole region, against the model.
	all := make([]byte, len(gens)*bs)
	if _, err := v.ReadAt(all, 0); err != nil {
		t.Fatalf("final read: %v", err)
	}
	for lba := range gens {
		if err := verify(all[lba*bs:(lba+1)*bs], lba); err != nil {
			mismatches.Add(1)
			t.Errorf("final: %v", err)
		}
	}
	st := s.Stats()
	t.Logf("A: %d writes read back at QD %d: %d I/O errors, %d mismatches, %d commands answered TASK ABORTED and %d UNIT ATTENTION, %d connections lost; "+
		"B: %d LOGICAL UNIT RESETs, %d ABORT TASK SETs", workers*perW, workers, ioErrs.Load(), mismatches.Load(), aborted.Load(), attentions.Load(),
		st.ConnectionsLost, resets.Load(), sets.Load())
	lines := strings.Count(logs.String(), `msg="SRP`)
	t.Logf("target: %d log lines about task management", lines)
	if lines > 2*32+2 { // target's tmfLogBurst a minute on each connection
		t.Errorf("the target logged %d lines about task management: the flood fills its log", lines)
	}
	if aborted.Load() == 0 {
		t.Fatal("no command of A's was aborted: the test proves nothing")
	}
	if st.ConnectionsLost != 0 {
		t.Errorf("A lost %d connections under the flood", st.ConnectionsLost)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the run did not complete in its minute")
	}
}
