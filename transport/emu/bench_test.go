package emu

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// roundTrip posts wrs on A and polls until A has n completions and B has m.
func (x *pair) roundTrip(tb testing.TB, wrs []transport.SendWR, recv []transport.RecvWR, na, nb int) {
	if recv != nil {
		if _, err := x.qb.PostRecv(recv); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := x.qa.PostSend(wrs); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	for na > 0 || nb > 0 {
		ka, kb := 0, 0
		if na > 0 {
			ka = x.poll(tb, x.cqa)
			na -= ka
		}
		if nb > 0 {
			kb = x.poll(tb, x.cqb)
			nb -= kb
		}
		if ka+kb == 0 {
			if na > 0 {
				x.cqa.Wait(ctx)
			} else {
				x.cqb.Wait(ctx)
			}
		}
	}
}

// poll polls c once and fails the test on an error completion.
func (x *pair) poll(tb testing.TB, c transport.CQ) int {
	k, err := c.Poll(x.wcs)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range k {
		if x.wcs[i].Status != transport.StatusSuccess {
			tb.Fatalf("completion %v", x.wcs[i].String())
		}
	}
	return k
}

func sendWR(x *pair, n uint32) []transport.SendWR {
	return []transport.SendWR{{ID: 1, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{{Addr: x.mra.Addr(), Length: n, LKey: x.mra.LKey()}}}}
}

func recvWR(x *pair) []transport.RecvWR {
	return []transport.RecvWR{{ID: 2, SGL: []transport.SGE{{Addr: x.mrb.Addr(), Length: 4096, LKey: x.mrb.LKey()}}}}
}

func rdmaWR(x *pair, op transport.Opcode, n uint32) []transport.SendWR {
	return []transport.SendWR{{ID: 3, Opcode: op, Flags: transport.FlagSignaled,
		SGL:        []transport.SGE{{Addr: x.mra.Addr(), Length: n, LKey: x.mra.LKey()}},
		RemoteAddr: x.mrb.Addr(), RKey: x.mrb.RKey()}}
}

// TestSteadyStateAllocs asserts that a SEND/RECV round trip and 4 KiB RDMA
// WRITE and READ allocate nothing per work request on every wire.
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are measured in full runs")
	}
	for _, wire := range []string{WireLoop, WireShm, WireTCP} {
		t.Run(wire, func(t *testing.T) {
			x := newPair(t, Config{Wire: wire}, 1<<20)
			s, r := sendWR(x, 64), recvWR(x)
			w, rd := rdmaWR(x, transport.OpRDMAWrite, 4096), rdmaWR(x, transport.OpRDMARead, 4096)
			// 64 KiB: on tcp, a payload written from where it lies.
			w64 := rdmaWR(x, transport.OpRDMAWrite, 64<<10)
			for name, f := range map[string]func(){
				"send-recv":      func() { x.roundTrip(t, s, r, 1, 1) },
				"rdma-write":     func() { x.roundTrip(t, w, nil, 1, 0) },
				"rdma-write-64k": func() { x.roundTrip(t, w64, nil, 1, 0) },
				"rdma-read":      func() { x.roundTrip(t, rd, nil, 1, 0) },
			} {
				f() // warm up staging buffers (and hand the arenas over on shm)
				if a := testing.AllocsPerRun(200, f); a != 0 {
					t.Errorf("%s: %.1f allocations per work request, want 0", name, a)
				}
			}
		})
	}
}

func benchPair(b *testing.B, wire string, f func(x *pair)) {
	x := newPair(b, Config{Wire: wire}, 1<<20)
	f(x)
}

func BenchmarkSendRecv(b *testing.B) {
	for _, wire := range Wires() {
		b.Run("wire="+wire, func(b *testing.B) {
			benchPair(b, wire, func(x *pair) {
				s, r := sendWR(x, 64), recvWR(x)
				b.ReportAllocs()
				for b.Loop() {
					x.roundTrip(b, s, r, 1, 1)
				}
			})
		})
	}
}

func BenchmarkRDMA4K(b *testing.B) {
	for _, wire := range Wires() {
		for _, op := range []transport.Opcode{transport.OpRDMAWrite, transport.OpRDMARead} {
			b.Run("wire="+wire+"/op="+op.String(), func(b *testing.B) {
				benchPair(b, wire, func(x *pair) {
					w := rdmaWR(x, op, 4096)
					b.SetBytes(4096)
					b.ReportAllocs()
					for b.Loop() {
						x.roundTrip(b, w, nil, 1, 0)
					}
				})
			})
		}
	}
}

// BenchmarkStream64K streams 64 KiB RDMA WRITEs (16 in flight, every 16th
// signaled) on every wire and compares them with a raw TCP loopback copy
// of the same bytes, in the same run.
func BenchmarkStream64K(b *testing.B) {
	const size, depth = 64 << 10, 16
	for _, wire := range Wires() {
		b.Run("rdma-write/wire="+wire, func(b *testing.B) {
			x := newPair(b, Config{Wire: wire}, 4<<20)
			wrs := make([]transport.SendWR, depth)
			for i := range wrs {
				wrs[i] = rdmaWR(x, transport.OpRDMAWrite, size)[0]
				wrs[i].SGL[0].Addr += uint64(i * size)
				wrs[i].RemoteAddr += uint64(i * size)
				wrs[i].Flags = 0
			}
			wrs[depth-1].Flags = transport.FlagSignaled
			b.SetBytes(size * depth)
			b.ReportAllocs()
			for b.Loop() {
				x.roundTrip(b, wrs, nil, 1, 0)
			}
		})
	}
	b.Run("raw-tcp", func(b *testing.B) {
		c := rawTCP(b, func(c net.Conn) {
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf[:1]); err != nil { // one ack per message batch below
					return
				}
			}
		})
		buf := make([]byte, size)
		ack := make([]byte, depth)
		b.SetBytes(size * depth)
		b.ReportAllocs()
		for b.Loop() {
			for range depth {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := io.ReadFull(c, ack); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// rawTCP connects to a loopback TCP server running serve on the accepted
// connection; the cleanup closes the client and waits for serve to return.
func rawTCP(b *testing.B, serve func(net.Conn)) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c.Close()
		<-done
	})
	return c
}

// BenchmarkTCPFloor4K measures the least any request/response design over
// loopback TCP can cost on this machine, as a floor for the tcp wire and
// for NBD servers alike: a client keeps 32 requests of 32 bytes in flight,
// a server answers each with 4 KiB, and both sides batch, with one read
// and one write per burst. No protocol, no verbs, no copy beyond the
// socket's own; each op is one 4 KiB read served.
func BenchmarkTCPFloor4K(b *testing.B) {
	const depth, reqLen, respLen = 32, 32, 4096
	c := rawTCP(b, func(c net.Conn) {
		in := make([]byte, depth*reqLen)
		out := make([]byte, depth*respLen)
		have := 0
		for {
			n, err := c.Read(in[have:])
			if err != nil {
				return
			}
			have += n
			k := have / reqLen
			if k == 0 {
				continue
			}
			copy(in, in[k*reqLen:have])
			have -= k * reqLen
			if _, err := c.Write(out[:k*respLen]); err != nil {
				return
			}
		}
	})
	req := make([]byte, depth*reqLen)
	resp := make([]byte, depth*respLen)
	if _, err := c.Write(req); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(respLen)
	b.ReportAllocs()
	b.ResetTimer()
	for got, have := 0, 0; got < b.N; {
		// Read whatever answers arrived; issue that many new requests.
		n, err := c.Read(resp[have:])
		if err != nil {
			b.Fatal(err)
		}
		have += n
		k := have / respLen
		have -= k * respLen
		got += k
		if k > 0 {
			if _, err := c.Write(req[:k*reqLen]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
}
