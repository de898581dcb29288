package initiator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// srpLie rewrites the bytes of an SRP_RSP the target is about to send;
// writing says whether the round in flight writes. It returns what the
// kit does with the response then.
type srpLie func(iu []byte, writing bool, prevTag uint64) targettest.Action

// srpLieCase is a way an SRP target lies in the content of its responses,
// and what the initiator must make of it.
type srpLieCase struct {
	name string
	// every lies in every SRP_RSP rather than in every 25th.
	every bool
	lie   srpLie
	// failErr is the error a request the target lied to completes with;
	// nil: the lie ends the connection and the request is re-issued on
	// the next, so it completes without error.
	failErr error
	// churn reports that the lie costs connections.
	churn bool
	// cfg adjusts the initiator's configuration.
	cfg func(*initiator.Config)
	// rounds of I/O, if not the default 40.
	rounds int
}

// putRsp rewrites an SRP_RSP in place through f, keeping its length.
func putRsp(iu []byte, f func(*srp.Rsp)) {
	var r srp.Rsp
	if r.Decode(iu) != nil {
		return
	}
	// Encode writes over the bytes Decode's slices point into: copy them.
	r.Resp, r.Sense = bytes.Clone(r.Resp), bytes.Clone(r.Sense)
	f(&r)
	_, _ = r.Encode(iu)
}

var srpLieCases = []srpLieCase{
	{name: "unknown-tag", churn: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		binary.BigEndian.PutUint64(iu[8:], 0x7fff_dead_0000_0000|binary.BigEndian.Uint64(iu[8:])&0xffff)
		return targettest.Pass
	}},
	{name: "completed-tag", churn: true, lie: func(iu []byte, _ bool, prev uint64) targettest.Action {
		if prev == 0 {
			return targettest.Duplicate
		}
		binary.BigEndian.PutUint64(iu[8:], prev)
		return targettest.Pass
	}},
	{name: "duplicate", churn: true, lie: func([]byte, bool, uint64) targettest.Action { return targettest.Duplicate }},
	{name: "sense-len-overrun", churn: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		iu[18] |= srp.SnsValid
		iu[19] = 0x02 // CHECK CONDITION
		binary.BigEndian.PutUint32(iu[28:], 0xffff_fff0)
		return targettest.Pass
	}},
	{name: "resp-len-overrun", churn: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		iu[18] |= srp.RspValid
		binary.BigEndian.PutUint32(iu[32:], uint32(len(iu)))
		return targettest.Pass
	}},
	{name: "read-resid-over-buffer", churn: true, lie: func(iu []byte, writing bool, _ uint64) targettest.Action {
		if !writing {
			putRsp(iu, func(r *srp.Rsp) { r.Flags, r.DataInResid = r.Flags|srp.DIUnder, 1<<20 })
		}
		return targettest.Pass
	}},
	{name: "diover-on-write", churn: true, lie: func(iu []byte, writing bool, _ uint64) targettest.Action {
		if writing {
			putRsp(iu, func(r *srp.Rsp) { r.Flags, r.DataInResid = r.Flags|srp.DIOver, 512 })
		}
		return targettest.Pass
	}},
	{name: "good-read-nothing-moved", failErr: initiator.ErrShortTransfer, lie: func(iu []byte, writing bool, _ uint64) targettest.Action {
		if !writing {
			// GOOD, and a residual that says the whole buffer was not
			// written: the buffer must not come back as read.
			putRsp(iu, func(r *srp.Rsp) { r.Flags, r.DataInResid = r.Flags|srp.DIUnder, 4096 })
		}
		return targettest.Pass
	}},
	// Not a lie: another host's LOGICAL UNIT RESET aborted the command
	// (srpd answers TASK ABORTED, TAS); it is re-issued and completes.
	{name: "task-aborted", lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		putRsp(iu, func(r *srp.Rsp) { r.Status = uint8(scsi.StatusTaskAborted) })
		return targettest.Pass
	}},
	// Every command answered TASK ABORTED: it is re-issued until its I/O
	// timeout and then fails, rather than looping forever.
	{name: "task-aborted-forever", every: true, failErr: os.ErrDeadlineExceeded, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		putRsp(iu, func(r *srp.Rsp) { r.Status = uint8(scsi.StatusTaskAborted) })
		return targettest.Pass
	}, cfg: func(c *initiator.Config) { c.IOTimeout = time.Second }, rounds: 2},
	// Not a lie either: a draining srpd answers BUSY, a full LIO queue
	// TASK SET FULL (SAM-5 5.3); the command never ran, and Linux's
	// midlayer asks again after a pause (scsi_queue_insert). So must the
	// initiator, without an error and without losing the connection.
	{name: "busy", lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		putRsp(iu, func(r *srp.Rsp) { r.Status = uint8(scsi.StatusBusy) })
		return targettest.Pass
	}},
	{name: "task-set-full", lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		putRsp(iu, func(r *srp.Rsp) { r.Status = uint8(scsi.StatusTaskSetFull) })
		return targettest.Pass
	}},
	// A target busy forever: each command is asked again until its I/O
	// timeout and then fails, rather than looping or failing at once.
	{name: "busy-forever", every: true, failErr: os.ErrDeadlineExceeded, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		putRsp(iu, func(r *srp.Rsp) { r.Status = uint8(scsi.StatusBusy) })
		return targettest.Pass
	}, cfg: func(c *initiator.Config) { c.IOTimeout = time.Second }, rounds: 2},
	{name: "t-logout-mid-io", churn: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		clear(iu)
		l := srp.TLogout{Reason: 0x1}
		_, _ = l.Encode(iu)
		return targettest.Pass
	}},
	{name: "req-lim-2^31", every: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		binary.BigEndian.PutUint32(iu[4:], 1<<31)
		return targettest.Pass
	}},
	{name: "req-lim-0-forever", every: true, churn: true, lie: func(iu []byte, _ bool, _ uint64) targettest.Action {
		binary.BigEndian.PutUint32(iu[4:], 0)
		return targettest.Pass
	}, cfg: func(c *initiator.Config) { c.IOTimeout = 300 * time.Millisecond }, rounds: 6},
}

// TestHostileSRPContent: a live SRP target (srpd's SRP personality behind
// the hostile-peer kit, over a real emu connection) lies in the content
// of its SRP_RSPs: answers for a tag not outstanding or already
// completed, SENSEDATALEN or RESPDATALEN beyond the IU, residuals that
// contradict the transfer, GOOD for a READ whose residual says nothing
// was moved, SRP_T_LOGOUT in the middle of the I/O, credit lies
// (req_lim_delta 2^31, and 0 forever), and answers a command is asked
// again for (TASK ABORTED, BUSY, TASK SET FULL; now and then, or
// forever). On every profile the initiator must not panic, must complete
// every request exactly once, with an error only where the lie leaves
// nothing to re-issue on a new connection, must not hang past its
// timeouts, must leave no completed request's key valid (every
// descriptor the target was ever handed is fired at it whenever nothing
// is in flight), and every write acknowledged GOOD must read back; and
// once the lies stop, the session must serve a write and its read.
func TestHostileSRPContent(t *testing.T) {
	for _, tc := range srpLieCases {
		for _, profile := range emu.Profiles() {
			t.Run(tc.name+"/"+profile, func(t *testing.T) { testHostileSRPContent(t, tc, profile) })
		}
	}
}

func testHostileSRPContent(t *testing.T, tc srpLieCase, profile string) {
	var armed, writing atomic.Bool
	var mu sync.Mutex
	var prevTag uint64
	var n, lies atomic.Int64
	script := targettest.Script{Respond: func(rsp *targettest.Response) targettest.Action {
		iu := rsp.IU()
		if !armed.Load() || len(iu) < srp.RspLen || srp.Opcode(iu[0]) != srp.OpRsp {
			return targettest.Pass
		}
		mu.Lock()
		prev := prevTag
		prevTag = binary.BigEndian.Uint64(iu[8:])
		mu.Unlock()
		if !tc.every && n.Add(1)%25 != 0 {
			return targettest.Pass
		}
		lies.Add(1)
		return tc.lie(iu, writing.Load(), prev)
	}}
	r := newHostileRigWith(t, profile, script, target.Config{SRPTargetPortID: srpPort})
	cfg := initiator.Config{Provider: r.ip, Addr: r.addr, Name: "victim", Logger: quiet, Protocol: initiator.ProtocolSRP,
		SRPTargetPortID: srpPort, Credits: 4, LossTimeout: 20 * time.Second}
	if tc.cfg != nil {
		tc.cfg(&cfg)
	}
	s := dial(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A lie the initiator sees ends the connection at once; one it
	// cannot see (no credit back) at its I/O timeout: each request is
	// answered or re-issued by then, a reconnect and slack later.
	bound := min(2*cfg.IOTimeout, 10*time.Second) + 10*time.Second
	const depth, stride = 8, 16384
	rounds := 40
	if tc.rounds > 0 {
		rounds = tc.rounds
	}
	model := make([]byte, 64*stride)
	done := make(chan *initiator.Request, 2*depth)
	bufs := make([][]byte, depth)
	for k := range bufs {
		// Even slots immediate data (4 KiB), odd ones registered.
		bufs[k] = make([]byte, 4096*(1+3*(k%2)))
	}
	sentinel := byte(0xA5)
	failed := 0
	armed.Store(true)
	for round := range rounds {
		op := initiator.OpWrite
		if round%2 == 1 {
			op = initiator.OpRead
		}
		writing.Store(op == initiator.OpWrite)
		base := (round / 2 * depth) % 56
		for k, b := range bufs {
			if op == initiator.OpWrite {
				for j := range b {
					b[j] = byte(round*7 + k + j)
				}
			} else {
				for j := range b {
					b[j] = sentinel
				}
			}
			req := &initiator.Request{Op: op, Buf: b, Offset: int64(base+k) * stride, Done: done}
			if err := v.Submit(req); err != nil {
				t.Fatal(err)
			}
		}
		seen := map[*initiator.Request]bool{}
		for range depth {
			var req *initiator.Request
			select {
			case req = <-done:
			case <-time.After(bound):
				t.Fatalf("round %d: a %s still outstanding after %s (I/O timeout %s): the initiator hangs", round, op, bound, cfg.IOTimeout)
			}
			if seen[req] {
				t.Fatalf("round %d: %s at %d completed twice", round, req.Op, req.Offset)
			}
			seen[req] = true
			off := req.Offset
			switch {
			case req.Err != nil:
				if tc.failErr == nil || !errors.Is(req.Err, tc.failErr) {
					t.Fatalf("round %d: %s at %d: %v (want %v)", round, req.Op, off, req.Err, tc.failErr)
				}
				failed++
				if op == initiator.OpRead && !bytes.Equal(req.Buf, bytes.Repeat([]byte{sentinel}, len(req.Buf))) {
					t.Fatalf("round %d: a read that failed (%v) handed back bytes in its buffer", round, req.Err)
				}
				if op == initiator.OpWrite {
					// Not acknowledged: what the volume holds is unknown.
					copy(model[off:], bytes.Repeat([]byte{0xFF}, len(req.Buf)))
				}
			case op == initiator.OpWrite:
				copy(model[off:], req.Buf)
			case !bytes.Equal(req.Buf, model[off:off+int64(len(req.Buf))]) && model[off] != 0xFF:
				t.Fatalf("round %d: read at %d differs from what was written", round, off)
			}
		}
		select {
		case req := <-done:
			t.Fatalf("round %d: an extra completion of %s at %d", round, req.Op, req.Offset)
		default:
		}
		probeStale(t, r, round)
	}
	armed.Store(false)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	serves(ctx, t, v, "once the target stopped lying")
	st := s.Stats()
	t.Logf("%d lies, %d requests failed, connections lost %d, reconnects %d", lies.Load(), failed, st.ConnectionsLost, st.Reconnects)
	if lies.Load() == 0 {
		t.Fatal("the target never lied: the test proves nothing")
	}
	if tc.failErr != nil && failed == 0 {
		t.Fatalf("no request failed with %v", tc.failErr)
	}
	if tc.churn != (st.ConnectionsLost > 0) {
		t.Fatalf("connections lost %d; want some: %v", st.ConnectionsLost, tc.churn)
	}
}

// probeStale fires every descriptor the target was ever handed at the
// initiator's live QP while nothing is in flight, as staleProbe does
// while a response is: a completed request's key must be dead, so none
// may be served.
func probeStale(t *testing.T, r *hostileRig, round int) {
	t.Helper()
	q := r.victimQP()
	if q == nil {
		return
	}
	for _, d := range r.h.Descriptors() {
		if ok, _, _ := r.ip.Probe(q, transport.OpRDMAWrite, d.RKey, d.VA, staleJunk); ok {
			t.Fatalf("round %d: the key %s@%#x of a completed request is still served", round, d.RKey, d.VA)
		}
	}
}

// TestHostileSRPLogin: an SRP_LOGIN_RSP with an absurd request limit
// (0, 1, 2^32-1) or IU lengths too small for a command or a response
// (0, 1) is refused at login with a one-line error that is ErrProtocol,
// on every profile. Large IU lengths are no lie and are taken: ib_srpt
// answers the request's req_it_iu_len as its max_ti_iu_len, and the
// initiator never sends more than it asked.
func TestHostileSRPLogin(t *testing.T) {
	for _, tc := range []struct {
		field string
		off   int
		val   uint32
		ok    bool
	}{
		{"req_lim", 4, 0, false},
		{"req_lim", 4, 1, false},
		{"req_lim", 4, 1<<32 - 1, false},
		{"max_it_iu_len", 16, 0, false},
		{"max_it_iu_len", 16, 1, false},
		{"max_it_iu_len", 16, 1<<32 - 1, true},
		{"max_ti_iu_len", 20, 0, false},
		{"max_ti_iu_len", 20, 1, false},
		{"max_ti_iu_len", 20, 1<<32 - 1, true}, // ib_srpt echoes req_it_iu_len (8260 with immediate data)
	} {
		for _, profile := range emu.Profiles() {
			t.Run(fmt.Sprintf("%s=%d/%s", tc.field, tc.val, profile), func(t *testing.T) {
				var logins atomic.Int64
				r := newHostileRigWith(t, profile, targettest.Script{Accept: func(priv []byte) []byte {
					if len(priv) >= srp.LoginResponseLen && srp.Opcode(priv[0]) == srp.OpLoginRsp {
						logins.Add(1)
						binary.BigEndian.PutUint32(priv[tc.off:], tc.val)
					}
					return priv
				}}, target.Config{SRPTargetPortID: srpPort})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				s, err := initiator.Dial(ctx, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "victim", Logger: quiet,
					Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Credits: 4, ConnectTimeout: 5 * time.Second})
				if logins.Load() == 0 {
					t.Fatalf("no SRP_LOGIN_RSP went by (%v): the test proves nothing", err)
				}
				if tc.ok {
					if err != nil {
						t.Fatalf("login refused: %v", err)
					}
					defer s.Close()
					v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
					if err != nil {
						t.Fatal(err)
					}
					buf := bytes.Repeat([]byte{0x3C}, 8192)
					if _, err := v.WriteAt(buf, 0); err != nil {
						t.Fatal(err)
					}
					got := make([]byte, len(buf))
					if _, err := v.ReadAt(got, 0); err != nil || !bytes.Equal(got, buf) {
						t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, buf))
					}
					return
				}
				if err == nil {
					s.Close()
					t.Fatalf("login with %s %d succeeded", tc.field, tc.val)
				}
				if !errors.Is(err, initiator.ErrProtocol) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("err = %v, want a one-line ErrProtocol", err)
				}
				t.Log(err)
			})
		}
	}
}

// TestHostileSRPRequestFlood: with every response the target floods the
// initiator with requests of its own, SRP_CRED_REQ (granting 2^31
// credits) or SRP_AER_REQ (a capacity change it never makes), sent
// through the kit ahead of the response, and takes the answers away
// from srpd, while four writers keep the initiator's four slots busy.
// Every request is answered exactly once, with its tag (SRP r16a 6.11,
// 6.13); the credits granted never take the initiator past its slots
// (srpd ends a connection that sends more commands than it granted
// credits); the connection stays up, no completed request's key stays
// valid, and every write checked reads back, on every profile.
func TestHostileSRPRequestFlood(t *testing.T) {
	const perResponse = 2
	for _, kind := range []srp.Opcode{srp.OpCredReq, srp.OpAERReq} {
		for _, profile := range emu.Profiles() {
			t.Run(kind.String()+"/"+profile, func(t *testing.T) {
				var armed atomic.Bool
				var mu sync.Mutex
				var next uint64
				asked, answered := map[uint64]int{}, map[uint64]int{}
				var bad atomic.Value
				b := make([]byte, 64)
				script := targettest.Script{
					Respond: func(rsp *targettest.Response) targettest.Action {
						iu := rsp.IU()
						if !armed.Load() || len(iu) < srp.RspLen || srp.Opcode(iu[0]) != srp.OpRsp {
							return targettest.Pass
						}
						mu.Lock()
						defer mu.Unlock()
						for range perResponse {
							next++
							tag := 0xf100d<<32 | next
							var n int
							if kind == srp.OpCredReq {
								q := srp.CredReq{Tag: tag, ReqLimDelta: 1 << 31}
								n, _ = q.Encode(b)
							} else {
								q := srp.AERReq{Tag: tag, Sense: scsi.SenseCapacityChanged.AppendFixed(nil)}
								n, _ = q.Encode(b)
							}
							if err := rsp.Send(b[:n]); err != nil {
								bad.CompareAndSwap(nil, err.Error())
							}
							asked[tag]++
						}
						return targettest.Pass
					},
					Swallow: func(iu []byte) bool {
						op, err := srp.PeekOpcode(iu)
						if err != nil || op != srp.OpCredRsp && op != srp.OpAERRsp {
							return false
						}
						var a srp.TargetRsp
						if err := a.Decode(iu); err != nil || a.Op != kind-0x40 {
							bad.CompareAndSwap(nil, fmt.Sprintf("answer %s (%v) to %s", op, err, kind))
						}
						mu.Lock()
						answered[a.Tag]++
						mu.Unlock()
						return true
					},
				}
				// Two requests per response outrun the one receive the
				// initiator keeps for target requests (as ib_srp does),
				// so the target's SENDs meet RNR NAKs. Its NIC retries
				// them without limit, as ib_srp's CM request asks the
				// target's QP to (rnr_retry_count 7): the flood is paced,
				// however late a loaded machine runs the initiator.
				r := newHostileRigNIC(t, profile, script, target.Config{SRPTargetPortID: srpPort}, emu.RNRRetryForever)
				s := dial(t, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "victim", Logger: quiet, Protocol: initiator.ProtocolSRP,
					SRPTargetPortID: srpPort, Credits: 4})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
				if err != nil {
					t.Fatal(err)
				}
				armed.Store(true)
				const ios = 200
				// Three writers beside the checked writes and reads keep
				// every slot busy while the credits pour in.
				var wg sync.WaitGroup
				for w := range 3 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						b := make([]byte, 16384)
						for i := range ios {
							if _, err := v.WriteAt(b, int64(64+w*32+i%32)*16384); err != nil {
								t.Errorf("worker %d: %v", w, err)
								return
							}
						}
					}()
				}
				defer wg.Wait()
				buf, got := make([]byte, 16384), make([]byte, 16384)
				for i := range ios {
					n := 4096 * (1 + 3*(i%2)) // immediate and registered
					off := int64(i%32) * 16384
					for j := range buf[:n] {
						buf[j] = byte(i + j)
					}
					if _, err := v.WriteAt(buf[:n], off); err != nil {
						t.Fatalf("write %d: %v", i, err)
					}
					if _, err := v.ReadAt(got[:n], off); err != nil || !bytes.Equal(got[:n], buf[:n]) {
						t.Fatalf("read %d: %v, equal %v", i, err, bytes.Equal(got[:n], buf[:n]))
					}
				}
				wg.Wait()
				probeStale(t, r, ios)
				armed.Store(false)
				// The last answers may still be on the wire.
				deadline := time.Now().Add(10 * time.Second)
				for {
					mu.Lock()
					na, nq := len(answered), len(asked)
					mu.Unlock()
					if na == nq || time.Now().After(deadline) {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				if b := bad.Load(); b != nil {
					t.Fatal(b)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(asked) < 2*ios*perResponse {
					t.Fatalf("the target sent %d requests: the test proves little", len(asked))
				}
				for tag, n := range answered {
					if asked[tag] != 1 || n != 1 {
						t.Fatalf("tag %#x asked %d times, answered %d", tag, asked[tag], n)
					}
				}
				if len(answered) != len(asked) {
					var missing []string
					for tag := range asked {
						if answered[tag] == 0 {
							missing = append(missing, fmt.Sprintf("%#x", tag))
						}
					}
					t.Fatalf("%d requests, %d answered (missing %v); connections lost %d", len(asked), len(answered), missing, s.Stats().ConnectionsLost)
				}
				if err := s.Check(ctx); err != nil {
					t.Fatal(err)
				}
				st := s.Stats()
				t.Logf("%d requests answered; connections lost %d", len(answered), st.ConnectionsLost)
				if st.ConnectionsLost != 0 {
					t.Fatalf("connections lost %d under the flood", st.ConnectionsLost)
				}
			})
		}
	}
}
