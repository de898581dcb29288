package emu

import (
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// TestRemoteInvalidateFreeWindow: a peer's SEND_WITH_INV names a window
// that is FREE under that key (bound, then invalidated by its own
// LOCAL_INV). The receive fails REM_INV_REQ_ERR everywhere; under
// Quirks.RemoteInvalidateAnyQP (the rxe profile) it is also counted as
// the kernel oops it is on rxe, whose rxe_invalidate_mw lets a FREE
// window through to rxe_do_invalidate_mw (transport/ibverbs' TestOops,
// GOSRP_RXE_OOPS=sendinv, killed the guest). No provider on the
// receiving host can stop a peer's, so the emulator must say so.
func TestRemoteInvalidateFreeWindow(t *testing.T) {
	for _, anyQP := range []bool{false, true} {
		name := map[bool]string{false: "strict", true: "RemoteInvalidateAnyQP"}[anyQP]
		t.Run(name, func(t *testing.T) {
			x := newPair(t, Config{Seed: 1, Quirks: &transport.Quirks{RemoteInvalidateAnyQP: anyQP}}, 4*transport.PageSize)
			mw, err := x.pdb.AllocMW()
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Close()
			key := mw.Key().Bump()
			if _, err := x.qb.PostSend([]transport.SendWR{
				{ID: 1, Opcode: transport.OpBindMW, Bind: transport.BindWR{
					MW: mw, Key: key, MR: x.mrb, Addr: x.mrb.Addr(), Length: uint64(transport.PageSize), Access: transport.AccessRemoteWrite}},
				{ID: 2, Opcode: transport.OpLocalInv, Flags: transport.FlagSignaled, InvalidateKey: key},
			}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqb); wc.ID != 2 || wc.Status != transport.StatusSuccess {
				t.Fatalf("bind and invalidate: %+v", wc)
			}
			if _, err := x.qb.PostRecv([]transport.RecvWR{{ID: 10, SGL: []transport.SGE{{Addr: x.ab.Addr() + uint64(transport.PageSize), Length: 64, LKey: x.mrb.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := x.qa.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.OpSendWithInv, Flags: transport.FlagSignaled, InvalidateKey: key,
				SGL: []transport.SGE{{Addr: x.aa.Addr(), Length: 8, LKey: x.mra.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if wc := x.wait(t, x.cqb); wc.ID != 10 || wc.Status != transport.StatusRemInvReqErr {
				t.Fatalf("receive of a SEND_WITH_INV naming a FREE window: %+v, want REM_INV_REQ_ERR", wc)
			}
			want := map[bool]uint64{false: 0, true: 1}[anyQP]
			if got := x.pb.Counters().KernelOopses; got != want {
				t.Fatalf("%d kernel oopses counted, want %d", got, want)
			}
		})
	}
}
