package emu

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// rawTCPPeer connects to a tcp listener of p without a NIC of its own,
// so the test can write any frame, and returns the socket and the
// accepted side's connection.
func rawTCPPeer(t *testing.T, p *Provider, ctx context.Context) (net.Conn, transport.Conn) {
	t.Helper()
	nc, c, _ := rawTCPPeerOffering(t, p, ctx, transport.ReadCredit{Out: 1, In: 1})
	return nc, c
}

// rawTCPPeerOffering is rawTCPPeer with the READ credit the raw peer
// offers in its connect request, and the accepted side's QP.
func rawTCPPeerOffering(t *testing.T, p *Provider, ctx context.Context, offer transport.ReadCredit) (net.Conn, transport.Conn, transport.QP) {
	t.Helper()
	l, err := p.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	nc, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if err := writeCM(nc, cmReq, []byte("raw"), offer); err != nil {
		t.Fatal(err)
	}
	r, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := p.OpenDevice("")
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	q, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	c, err := r.Accept(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hb [headerLen]byte
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		t.Fatalf("no CM reply: %v", err)
	}
	return nc, c, q
}

func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestTCPFrameHeaderAllocatesOnlyWhatArrives: a frame header claiming a
// 64 MiB payload, followed by a few bytes and then nothing, must not make
// the reader allocate 64 MiB; and a header beyond the largest message
// closes the connection as malformed, allocating nothing either.
func TestTCPFrameHeaderAllocatesOnlyWhatArrives(t *testing.T) {
	for _, tc := range []struct {
		name   string
		paylen uint32
		bad    bool
	}{{"max", maxMsgSize, false}, {"over", maxMsgSize + 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newNIC(t, Config{Wire: WireTCP, Logger: slog.New(slog.DiscardHandler)})
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			nc, c := rawTCPPeer(t, p, ctx)
			bad := p.Counters().BadFrames
			frame := make([]byte, headerLen+1000)
			putHeader(frame, &header{kind: pktWrite, paylen: tc.paylen})
			before := totalAlloc()
			if _, err := nc.Write(frame); err != nil {
				t.Fatal(err)
			}
			if !tc.bad {
				nc.Close() // the rest of the payload never comes
			}
			select {
			case <-c.Done():
			case <-ctx.Done():
				t.Fatal("the connection did not end")
			}
			grew := totalAlloc() - before
			if grew > 1<<20 {
				t.Errorf("the reader allocated %d bytes for a header claiming %d", grew, tc.paylen)
			}
			if got := p.Counters().BadFrames - bad; tc.bad != (got == 1) {
				t.Errorf("BadFrames grew by %d", got)
			}
			t.Logf("allocated %d bytes; connection ended: %v", grew, c.Err())
		})
	}
}

// TestTCPReadBeyondCredit: an RDMA READ from a peer that was granted no
// READ credit (it offered to issue none) is an invalid request: the
// responder NAKs it as such, as rxe's check_resource does, and its QP
// goes to ERR; with credit, the same READ is served (here NAKed for its
// bogus key, which shows it was looked at).
func TestTCPReadBeyondCredit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offer   transport.ReadCredit
		wantNak uint8
	}{
		{"no credit", transport.ReadCredit{Out: 0, In: 1}, nakInvReq},
		{"credit", transport.ReadCredit{Out: 1, In: 1}, nakAccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newNIC(t, Config{Wire: WireTCP, Logger: slog.New(slog.DiscardHandler)})
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			nc, c, q := rawTCPPeerOffering(t, p, ctx, tc.offer)
			if got := c.ReadCredit().In; got != tc.offer.Out {
				t.Fatalf("accepted side serves %d READs, want %d", got, tc.offer.Out)
			}
			frame := make([]byte, headerLen)
			putHeader(frame, &header{kind: pktRead, psn: 0, key: 0x123456, va: 4096, length: 512})
			if _, err := nc.Write(frame); err != nil {
				t.Fatal(err)
			}
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			var hb [headerLen]byte
			if _, err := io.ReadFull(nc, hb[:]); err != nil {
				t.Fatalf("no answer to the READ: %v", err)
			}
			var h header
			if err := decodeHeader(hb[:], &h); err != nil {
				t.Fatal(err)
			}
			if h.kind != pktNak || h.nak != tc.wantNak {
				t.Fatalf("answer %v NAK %d, want NAK %d", h.kind, h.nak, tc.wantNak)
			}
			if st := q.State(); st != transport.QPErr {
				t.Errorf("responder QP in %v after the bad READ, want ERR", st)
			}
		})
	}
}
