package emu

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
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

// TestTCPCoalescedACKs checks which answers the tcp link merges: an ACK
// queued right behind an earlier ACK replaces it, and nothing else does.
func TestTCPCoalescedACKs(t *testing.T) {
	type frame struct {
		kind pktKind
		psn  uint32
	}
	ack := func(psn uint32) frame { return frame{pktAck, psn} }
	take := frame{kind: 0xff} // the writer takes the pending batch
	tests := []struct {
		name string
		in   []frame
		want [][]frame // the batches written
	}{
		{"consecutive ACKs", []frame{ack(1), ack(2), ack(3)}, [][]frame{{ack(3)}}},
		{"NAK between", []frame{ack(1), {pktNak, 2}, ack(3), ack(4)}, [][]frame{{ack(1), {pktNak, 2}, ack(4)}}},
		{"READ response between", []frame{ack(1), {pktReadResp, 2}, ack(3)}, [][]frame{{ack(1), {pktReadResp, 2}, ack(3)}}},
		{"duplicate's older ACK", []frame{ack(5), ack(2), ack(3)}, [][]frame{{ack(5), ack(3)}}},
		{"PSN wrap", []frame{ack(1<<32 - 1), ack(0)}, [][]frame{{ack(0)}}},
		{"not into a batch being written", []frame{ack(1), take, ack(2), ack(3)}, [][]frame{{ack(1)}, {ack(3)}}},
		{"request after ACK", []frame{ack(1), {pktSend, 7}, ack(2)}, [][]frame{{ack(1), {pktSend, 7}, ack(2)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newBareLink()
			var got [][]frame
			parse := func(b []byte) {
				var fs []frame
				for len(b) > 0 {
					var h header
					if err := decodeHeader(b, &h); err != nil {
						t.Fatalf("batch does not parse: %v", err)
					}
					fs = append(fs, frame{h.kind, h.psn})
					b = b[headerLen+int(h.paylen):]
				}
				got = append(got, fs)
			}
			for _, f := range tc.in {
				if f == take {
					l.txMu.Lock()
					l.takeLocked()
					parse(l.out.b)
					continue
				}
				p := &packet{kind: f.kind, psn: f.psn}
				if f.kind == pktNak {
					p.nak = nakRNR
				}
				if f.kind == pktReadResp {
					p.payload = []byte("data")
				}
				if f.kind.isRequest() {
					l.sendRequest(p)
				} else {
					l.sendResponse(p)
				}
			}
			parse(l.pend.b)
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("batches %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTCPWriteInPlace writes batches whose large request payloads are
// referenced in place, through a socket too small to take a batch at
// once, so that writes stop short and resume mid-iovec: the peer must
// read exactly the frames, payloads included, in order.
func TestTCPWriteInPlace(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	unix.SetNonblock(fds[0], true)
	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	l := newBareLink()
	for i := range 40 {
		// Payloads below, at and above tcpRefMin, in one to three
		// pieces, some empty, and ACKs between.
		var pieces [][]byte
		for range 1 + rng.IntN(3) {
			b := make([]byte, rng.IntN(3*tcpRefMin/2))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			pieces = append(pieces, b)
		}
		p := &packet{kind: pktWrite, psn: uint32(i), key: 7, va: uint64(i) << 12, pieces: pieces}
		l.sendRequest(p)
		var h [headerLen]byte
		putHeader(h[:], &header{kind: pktWrite, psn: uint32(i), key: 7, va: uint64(i) << 12, paylen: uint32(p.dataLen())})
		want = append(want, h[:]...)
		for _, b := range pieces {
			want = append(want, b...)
		}
		if i%5 == 4 {
			l.sendResponse(&packet{kind: pktAck, psn: uint32(i)})
			putHeader(h[:], &header{kind: pktAck, psn: uint32(i)})
			want = append(want, h[:]...)
		}
	}
	if len(l.pend.refs) == 0 {
		t.Fatal("no payload was referenced in place")
	}
	if l.pend.size != len(want) {
		t.Fatalf("batch size %d, want %d", l.pend.size, len(want))
	}
	l.txMu.Lock()
	l.takeLocked()
	var got []byte
	buf := make([]byte, 1500)
	short := 0
	for l.w.pending() {
		l.w.err = nil
		l.w.try(uintptr(fds[0]))
		if l.w.err != nil && l.w.err != unix.EAGAIN {
			t.Fatal(l.w.err)
		}
		if l.w.err == unix.EAGAIN {
			short++
		}
		n, err := unix.Read(fds[1], buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	for len(got) < len(want) {
		n, err := unix.Read(fds[1], buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if short == 0 {
		t.Fatal("every write went whole: the resumption was not exercised")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("peer read %d bytes that differ from the %d written", len(got), len(want))
	}
}

// newBareLink is a tcp link's transmit side without a socket: frames are
// added and taken as the writer would, and a test writes them itself.
func newBareLink() *tcpLink {
	l := &tcpLink{ackAt: -1}
	l.txRoom.L = &l.txMu
	l.w.fn = l.w.try
	return l
}
