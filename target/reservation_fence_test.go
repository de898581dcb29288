package target

import (
	"strings"
	"testing"
	"testing/synctest"

	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
)

// TestPreemptAbortFences: PREEMPT AND ABORT is answered only once the
// write the preempted host had already handed to the store is done, so
// that no write of the preempted host lands after the preemptor was
// told it holds the volume; the preempted host's next write is refused
// without reaching the store. Without the fence the preempt returns
// while the write is still in the store. A write the store never
// finishes holds the answer for fenceTimeout, which then says so.
func TestPreemptAbortFences(t *testing.T) {
	for _, hung := range []bool{false, true} {
		t.Run(map[bool]string{false: "write-finishes", true: "store-hangs"}[hung], func(t *testing.T) { testPreemptAbortFence(t, hung) })
	}
}

func testPreemptAbortFence(t *testing.T, hung bool) {
	synctest.Test(t, func(t *testing.T) {
		h := newCoreHarness(t, 4)
		h.loginOpen(t)
		v := h.c.p.pr.volume("mem")
		applyAll(t, v, []prStep{{"i", wire.ActionRegister, 0, 1}, {"i", wire.ActionReserve, 1, 0}, {"B", wire.ActionRegister, 0, 0xb}})
		write := func(tag uint64) {
			im := wire.Command{Op: wire.OpWrite, Flags: wire.FlagImmediate, Volume: 1, Tag: tag, Offset: 4096, Length: 4096}
			b := make([]byte, wire.CommandHeaderLen+4096)
			im.Encode(b)
			h.deliver(int(tag)%h.c.p.nrecv, b)
		}
		job, done := preemptDuringWrite(t, h, v, write)
		if v.allows("i", h.c.sessionKey(), true) {
			t.Fatal("the preempted host may still write while the fence waits")
		}
		if hung {
			// A store that never finishes the write: the preempt is
			// answered after fenceTimeout, saying so.
			out := <-done
			if out.sense != wire.SenseInternal || !strings.Contains(out.msg, "1 writes of the preempted hosts were still in the store") {
				t.Fatalf("PREEMPT AND ABORT over a hung write: %+v", out)
			}
			runJob(&h.c.slots[job], h.cat)
			h.c.backendDone(job, 2)
			return
		}
		runJob(&h.c.slots[job], h.cat)
		h.c.backendDone(job, 2)
		synctest.Wait()
		out := <-done
		if out.sense != wire.SenseNone || len(out.preempted) != 1 || out.preempted[0] != "i" {
			t.Fatalf("PREEMPT AND ABORT after the write: %+v", out)
		}
		h.step()
		write(3)
		if len(h.c.acts.jobs) != 0 {
			t.Fatal("the preempted host's write reached the store")
		}
	})
}

// TestPreemptAbortFencesSRP: the fence holds for an SRP host too. It
// registered and reserved through PERSISTENT RESERVE OUT and has a WRITE
// in the store when a gosrp host preempts it with abort: the preempt is
// answered only once that write is done, and the SRP host's next WRITE
// is refused (RESERVATION CONFLICT) without reaching the store. Without
// countWriters the SRP host's handle was no writer the fence knew of,
// and the preempt was answered with its write still in the store.
func TestPreemptAbortFencesSRP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSRPCoreHarness(t, 4)
		ov := h.c.handles[0]
		countWriters(h.c.srpTakeAttached())
		v := ov.pr
		ini := h.c.initiator
		applyAll(t, v, []prStep{{ini, wire.ActionRegister, 0, 1}, {ini, wire.ActionReserve, 1, 0}, {"B", wire.ActionRegister, 0, 0xb}})
		write := func(tag uint64) {
			h.deliver(int(tag)%h.c.p.nrecv, srpIU(t, srp.Cmd{Tag: tag, CDB: rw10(0x2A, 1, 1, false),
				DataOut: srp.DataBuffer{Format: srp.FormatImmediate, Total: 4096, Imm: make([]byte, 4096)}}))
		}
		job, done := preemptDuringWrite(t, h, v, write)
		runJob(&h.c.slots[job], h.cat)
		h.c.backendDone(job, 2)
		synctest.Wait()
		if out := <-done; out.sense != wire.SenseNone || len(out.preempted) != 1 || out.preempted[0] != ini {
			t.Fatalf("PREEMPT AND ABORT after the write: %+v", out)
		}
		h.step()
		write(3)
		if len(h.c.acts.jobs) != 0 {
			t.Fatal("the preempted SRP host's write reached the store")
		}
	})
}

// preemptDuringWrite has the reservation holder's write (write(2)) handed
// to the store, then starts host B's PREEMPT AND ABORT of key 1 on a
// goroutine of the synctest bubble and checks that it is not answered
// while the write is in the store. It returns the write's job and where
// the preempt's outcome will come.
func preemptDuringWrite(t *testing.T, h *coreHarness, v *prVolume, write func(uint64)) (int32, chan prOutcome) {
	t.Helper()
	write(2)
	if len(h.c.acts.jobs) != 1 {
		t.Fatalf("the holder's write was not handed to the store: %d jobs", len(h.c.acts.jobs))
	}
	job := h.c.acts.jobs[0]
	h.c.acts.reset()
	done := make(chan prOutcome)
	go func() {
		out, _ := v.apply("B", &wire.ControlRequest{Action: wire.ActionPreemptAbort, Key: 0xb, NewKey: 1, Type: wire.ResWriteExclusive})
		done <- out
	}()
	synctest.Wait()
	select {
	case out := <-done:
		t.Fatalf("PREEMPT AND ABORT answered (%+v) with the preempted host's write still in the store", out)
	default:
	}
	return job, done
}
