package emu

import (
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestRNRRetry: a SEND to a QP with no receive posted ends in
// RNR_RETRY_EXC_ERR once a finite RNRRetry is spent, and with
// RNRRetryForever keeps retrying until a receive is posted, then lands,
// on every wire.
func TestRNRRetry(t *testing.T) {
	for _, wire := range Wires() {
		for _, tc := range []struct {
			retry int
			want  transport.Status
		}{
			{3, transport.StatusRNRRetryExcErr},
			{RNRRetryForever, transport.StatusSuccess},
		} {
			t.Run(wire+"/"+tc.want.String(), func(t *testing.T) {
				x := newPair(t, Config{Wire: wire, RNRTimeout: time.Millisecond, RNRRetry: tc.retry}, 4096)
				src := transport.SGE{Addr: x.mra.Addr(), Length: 64, LKey: x.mra.LKey()}
				if _, err := x.qa.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
					SGL: []transport.SGE{src}}}); err != nil {
					t.Fatal(err)
				}
				if tc.want == transport.StatusSuccess {
					// Many times the 3 ms a finite budget of 3 retries
					// lasts; then a receive.
					time.Sleep(50 * time.Millisecond)
					if n, _ := x.cqa.Poll(x.wcs[:1]); n != 0 {
						t.Fatalf("the SEND completed with %v before any receive was posted", x.wcs[0].Status)
					}
					if _, err := x.qb.PostRecv([]transport.RecvWR{{ID: 2, SGL: []transport.SGE{{Addr: x.mrb.Addr(), Length: 64, LKey: x.mrb.LKey()}}}}); err != nil {
						t.Fatal(err)
					}
				}
				if wc := x.wait(t, x.cqa); wc.ID != 1 || wc.Status != tc.want {
					t.Fatalf("SEND completed %v (ID %d), want %v", wc.Status, wc.ID, tc.want)
				}
			})
		}
	}
}
