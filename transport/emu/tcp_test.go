package emu

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// TestTCPBothWaysFull floods a tcp link from both ends at once with 1 MiB
// RDMA WRITEs and READs, far more than the sockets buffer, so both sides'
// writes find the socket full. Every WR must complete successfully and the
// bytes must arrive: a side whose reader blocked writing answers while the
// peer did the same would never read again, and the retry timer would end
// the connection instead.
func TestTCPBothWaysFull(t *testing.T) {
	const size, n, rounds = 1 << 20, 48, 2
	x := newPair(t, Config{Wire: WireTCP, RetryTimeout: 2 * time.Second, RetryCount: 7}, 2*size)
	for i := range size {
		x.aa.Bytes()[i] = byte(i * 7)
		x.ab.Bytes()[i] = byte(i * 13)
	}
	side := func(q transport.QP, c transport.CQ, local, remote transport.MR) error {
		wrs := make([]transport.SendWR, n)
		for i := range wrs {
			op := transport.OpRDMAWrite
			src, dst := local.Addr(), remote.Addr()+size
			if i%2 == 1 {
				// READ the peer's first half into our second half.
				op, src, dst = transport.OpRDMARead, local.Addr()+size, remote.Addr()
			}
			wrs[i] = transport.SendWR{ID: uint64(i), Opcode: op, Flags: transport.FlagSignaled,
				SGL:        []transport.SGE{{Addr: src, Length: size, LKey: local.LKey()}},
				RemoteAddr: dst, RKey: remote.RKey()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		wcs := make([]transport.WC, n)
		for range rounds {
			if _, err := q.PostSend(wrs); err != nil {
				return err
			}
			for got := 0; got < n; {
				k, err := c.Poll(wcs)
				if err != nil {
					return err
				}
				for _, wc := range wcs[:k] {
					if wc.Status != transport.StatusSuccess {
						t.Errorf("completion %s", wc.String())
					}
				}
				got += k
				if k == 0 {
					if err := c.Wait(ctx); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	errc := make(chan error, 1)
	go func() { errc <- side(x.qb, x.cqb, x.mrb, x.mra) }()
	if err := side(x.qa, x.cqa, x.mra, x.mrb); err != nil {
		t.Fatalf("side A: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("side B: %v", err)
	}
	// Each side's second half holds the other's first half, by WRITE and
	// by READ alike.
	if !bytes.Equal(x.aa.Bytes()[size:], x.ab.Bytes()[:size]) || !bytes.Equal(x.ab.Bytes()[size:], x.aa.Bytes()[:size]) {
		t.Fatal("data did not arrive intact")
	}
}
