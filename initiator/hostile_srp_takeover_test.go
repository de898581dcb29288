package initiator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/target/targettest"
)

// cdbMaintOut is MAINTENANCE OUT; service action 0x0A is SET TARGET PORT
// GROUPS (SPC-4 6.37).
const cdbMaintOut = 0xA4

func isSTPG(c []byte) bool { return c[0] == cdbMaintOut && c[1]&0x1f == 0x0a }

// takeoverLie is a way a standby SRP gateway that claims ALUA lies to,
// or stalls, a host's takeover open (OpenOptions.Takeover: REPORT TARGET
// PORT GROUPS, then SET TARGET PORT GROUPS), and what the open must make
// of it.
type takeoverLie struct {
	name string
	// cdb picks the command lied about.
	cdb func(cdb []byte) bool
	// cmd rewrites the command's SRP_CMD in place before the target
	// sees it; nil leaves it.
	cmd func(iu []byte)
	// rsp rewrites the command's SRP_RSP; act is what becomes of it.
	// once: only the command's first response is touched.
	rsp  func(r *srp.Rsp)
	act  targettest.Action
	once bool
	// failErr is the error the open must fail with; nil: it succeeds.
	failErr error
}

var takeoverLies = []takeoverLie{
	{name: "honest", cdb: isSTPG},
	// The gateway answers GOOD to a list it never saw: the parameter list
	// length rewritten to zero, which asks nothing (SPC-4 6.37). The host
	// believes the volume active; its first write must fail ErrStandby,
	// and reach nothing.
	{name: "stpg-good-not-done", cdb: isSTPG, cmd: func(iu []byte) { binary.BigEndian.PutUint32(iu[32+6:], 0) }},
	// The takeover happened, its answer says it failed: the open fails,
	// and a later open finds the truth.
	{name: "stpg-check-condition", cdb: isSTPG, failErr: initiator.ErrStandby, rsp: func(r *srp.Rsp) { r.Status = 0x02 }},
	{name: "stpg-busy", cdb: isSTPG, failErr: initiator.ErrStandby, rsp: func(r *srp.Rsp) { r.Status = 0x08 }},
	// The answer does not come, or the connection ends in its place:
	// once, and the command's re-issue on the next connection does it;
	// ever, and the command fails after five I/O timeouts, well before
	// the open's deadline.
	{name: "stpg-dropped-once", cdb: isSTPG, act: targettest.Drop, once: true},
	{name: "stpg-disconnect-once", cdb: isSTPG, act: targettest.Disconnect, once: true},
	{name: "rtpg-dropped-once", cdb: isRTPG, act: targettest.Drop, once: true},
	{name: "stpg-dropped", cdb: isSTPG, act: targettest.Drop, failErr: os.ErrDeadlineExceeded},
	{name: "rtpg-dropped", cdb: isRTPG, act: targettest.Drop, failErr: os.ErrDeadlineExceeded},
}

// TestHostileSRPTakeover: a host opens with Takeover a LUN whose gateway
// is standby (another client of the cluster holds the volume's lock),
// and the gateway lies in, or never sends, the answers of the takeover:
// SET TARGET PORT GROUPS answered GOOD but never done, answered failed
// though done, dropped once or always, the connection ended in its
// place; REPORT TARGET PORT GROUPS never answered. Whatever it does:
// the open ends before its deadline (a command never answered fails
// after five I/O timeouts); a write the host's volume accepts is
// one the gateway made after it truly took the lock (checked against
// the cluster, not the gateway's word), and otherwise fails ErrStandby
// and leaves the lock holder's data alone; a later open on the same
// session reports the state the cluster is in.
func TestHostileSRPTakeover(t *testing.T) {
	for _, tc := range takeoverLies {
		t.Run(tc.name, func(t *testing.T) { testHostileSRPTakeover(t, tc, emuNICs) })
	}
}

func testHostileSRPTakeover(t *testing.T, tc takeoverLie, nics nics) {
	cl := aluaCluster(t)
	holder := cl.Client()
	hv, err := holder.OpenShared("vol0")
	if err != nil {
		t.Fatal(err)
	}
	defer hv.Close()
	if err := holder.AcquireLock("vol0"); err != nil {
		t.Fatal(err)
	}
	old := make([]byte, 4096)
	pattern(old, 1, 1, 1)
	if _, err := hv.WriteAt(old, 4096); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	tags := map[uint64]bool{} // SRP_CMD tags of the command lied about
	lies, touched := 0, false
	script := targettest.Script{
		Swallow: func(iu []byte) bool {
			if len(iu) < srp.CmdLen || srp.Opcode(iu[0]) != srp.OpCmd || !tc.cdb(iu[32:48]) {
				return false
			}
			mu.Lock()
			defer mu.Unlock()
			tags[binary.BigEndian.Uint64(iu[8:])] = true
			if tc.cmd != nil {
				tc.cmd(iu) // the target sees the rewritten command
				lies++
			}
			return false
		},
		Respond: func(r *targettest.Response) targettest.Action {
			iu := r.IU()
			if len(iu) < srp.RspLen || srp.Opcode(iu[0]) != srp.OpRsp {
				return targettest.Pass
			}
			mu.Lock()
			defer mu.Unlock()
			if !tags[binary.BigEndian.Uint64(iu[8:])] || (tc.once && touched) {
				return targettest.Pass
			}
			if tc.rsp == nil && tc.act == targettest.Pass {
				lies++ // the honest case counts the answers it let pass
				return targettest.Pass
			}
			touched = true
			lies++
			if tc.rsp != nil {
				putRsp(iu, tc.rsp)
			}
			return tc.act
		},
	}
	tp, ip := nics(t)
	addr := aluaGateway(t, cl, tp, script)
	s := dial(t, initiator.Config{Provider: ip, Addr: addr, Name: "victim", Logger: quiet, Protocol: initiator.ProtocolSRP,
		SRPTargetPortID: srpPort, IOTimeout: 500 * time.Millisecond, LossTimeout: 5 * time.Second})
	const deadline = 8 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{Takeover: true})
	took := time.Since(start)
	mu.Lock()
	n := lies
	mu.Unlock()
	if n == 0 {
		t.Fatal("the script never lied: the open sent no such command (was the gateway standby?)")
	}
	t.Logf("open: %v after %v", err, took.Round(time.Millisecond))
	switch {
	case ctx.Err() != nil:
		t.Fatalf("the open took its whole deadline (%v): %v", deadline, err)
	case tc.failErr != nil && !errors.Is(err, tc.failErr):
		t.Fatalf("open: %v, want %v", err, tc.failErr)
	case tc.failErr == nil && err != nil:
		t.Fatalf("open: %v", err)
	}
	gw := cl.Owner("vol0")
	tookOver := gw != holder.ID() && gw != 0
	if v != nil {
		checkTakeoverWrite(t, ctx, v, hv, tookOver)
		v.Close()
	}
	if tc.act != targettest.Pass && !tc.once {
		return // the same lie would answer the next open
	}
	// A later open on the same session, honest this time or asking
	// nothing lied about, tells the cluster's truth.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	v2, err := s.Open(ctx2, "lun0", initiator.OpenOptions{})
	if err != nil {
		t.Fatalf("open after: %v", err)
	}
	defer v2.Close()
	if v2.Standby() == tookOver {
		t.Fatalf("open after: standby %v, but the gateway took the lock: %v", v2.Standby(), tookOver)
	}
	if !tookOver {
		got := make([]byte, 4096)
		if _, err := hv.ReadAt(got, 4096); err != nil || !bytes.Equal(got, old) {
			t.Fatalf("the lock holder's block after the lies: %v, equal %v", err, bytes.Equal(got, old))
		}
	}
}

// checkTakeoverWrite writes through v, which the takeover open returned,
// as the host would next: it must land if, and only if, the gateway
// truly took the lock (tookOver); otherwise it fails ErrStandby, v turns
// standby, and hv's block (the lock holder's) is untouched.
func checkTakeoverWrite(t *testing.T, ctx context.Context, v *initiator.Volume, hv io.ReaderAt, tookOver bool) {
	t.Helper()
	w := make([]byte, 4096)
	pattern(w, 1, 2, 1)
	_, err := v.WriteAtContext(ctx, w, 4096)
	switch {
	case tookOver && err != nil:
		t.Fatalf("write after a takeover the cluster saw: %v", err)
	case tookOver:
		r := make([]byte, 4096)
		if _, err := hv.ReadAt(r, 4096); err == nil {
			t.Fatal("the old lock holder still reads after the takeover: not fenced")
		}
	case !errors.Is(err, initiator.ErrStandby):
		t.Fatalf("write through a gateway that never took the lock: %v, want ErrStandby", err)
	case !v.Standby():
		t.Fatal("the volume is not standby after its write was refused so")
	}
}
