package emu

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// TestReplayOnErr: under Quirks.ReplayOnErr a QP that enters ERR after a
// SEND_WITH_INV whose completion its consumer has not polled yet carries
// it out again for each receive still posted, as rxe on Linux 6.12.95
// does, and each second invalidation of the now FREE window is counted as
// the kernel oops it is there. Without the quirk the receives flush; once
// the consumer has polled the completion, they flush too.
func TestReplayOnErr(t *testing.T) {
	for _, tc := range []struct {
		name           string
		replay, polled bool
	}{
		{"replay", true, false},
		{"replay-after-poll", true, true},
		{"strict", false, false},
	} {
		replay := tc.replay
		t.Run(tc.name, func(t *testing.T) {
			x := newPair(t, Config{Seed: 1, Quirks: &transport.Quirks{ReplayOnErr: replay}}, 4*transport.PageSize)
			mw, err := x.pdb.AllocMW()
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Close()
			key := mw.Key().Bump()
			if _, err := x.qb.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpBindMW, Flags: transport.FlagSignaled, Bind: transport.BindWR{
				MW: mw, Key: key, MR: x.mrb, Addr: x.mrb.Addr(), Length: uint64(transport.PageSize), Access: transport.AccessRemoteWrite}}}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqb); wc.ID != 1 || wc.Status != transport.StatusSuccess {
				t.Fatalf("bind: %+v", wc)
			}
			recvs := make([]transport.RecvWR, 3)
			for i := range recvs {
				recvs[i] = transport.RecvWR{ID: uint64(10 + i), SGL: []transport.SGE{{Addr: x.ab.Addr() + uint64(transport.PageSize*(1+i)), Length: 64, LKey: x.mrb.LKey()}}}
			}
			if _, err := x.qb.PostRecv(recvs); err != nil {
				t.Fatal(err)
			}
			copy(x.aa.Bytes(), "answer")
			if _, err := x.qa.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: key,
				SGL: []transport.SGE{{Addr: x.aa.Addr(), Length: 6, LKey: x.mra.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			// The sender's completion says the receiver carried the SEND
			// out; the receiver's consumer has not polled it yet when its
			// QP enters ERR, as in rxe's window.
			if wc := x.wait(t, x.cqa); wc.ID != 2 || wc.Status != transport.StatusSuccess {
				t.Fatalf("SEND_WITH_INV: %+v", wc)
			}
			first := func() {
				if wc := x.wait(t, x.cqb); wc.ID != 10 || wc.Status != transport.StatusSuccess || wc.Flags&transport.WCWithInv == 0 {
					t.Fatalf("first receive: %+v", wc)
				}
			}
			if tc.polled {
				first()
			}
			if err := x.qb.Modify(transport.QPErr); err != nil {
				t.Fatal(err)
			}
			if !tc.polled {
				first()
			}
			replayed := replay && !tc.polled
			want := transport.StatusWRFlushErr
			if replayed {
				want = transport.StatusSuccess
			}
			for id := uint64(11); id <= 12; id++ {
				if wc := x.wait(t, x.cqb); wc.ID != id || wc.Status != want {
					t.Fatalf("receive %d after ERR: %+v, want status %s", id, wc, want)
				}
			}
			c := x.pa.Counters()
			if want := uint64(map[bool]int{true: 2}[replayed]); c.KernelOopses != want || c.Replays != want {
				t.Fatalf("%d kernel oopses and %d replays counted, want %d of each", c.KernelOopses, c.Replays, want)
			}
		})
	}
}
