package emu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
	"golang.org/x/sys/unix"
)

// The two-process tests re-execute the test binary as the target side.
const (
	childEnv = "GOSRP_EMU_SHM_CHILD" // serve | hang
	sockEnv  = "GOSRP_EMU_SHM_SOCK"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := shmChild(mode, os.Getenv(sockEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "shm child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const childArena = 1 << 20

// shmChild is the target process: it accepts one connection on sock,
// advertises a 1 MiB buffer (address and rkey in the accept's private
// data) and, in serve mode, answers each SEND of n (u32) with a SEND of
// sha256 of its buffer's first n bytes, until the initiator disconnects.
func shmChild(mode, sock string) error {
	p, err := New(Config{Wire: WireShm, RetryTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer p.Close()
	dev, _ := p.OpenDevice("")
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(256)
	q, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		return err
	}
	a, err := transport.NewArena(childArena+4096, transport.ArenaOptions{})
	if err != nil {
		return err
	}
	mr, err := pd.RegMR(a, 0, a.Len(), transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	if err != nil {
		return err
	}
	ctx := context.Background()
	l, err := p.Listen(ctx, sock)
	if err != nil {
		return err
	}
	fmt.Println("READY")
	req, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	var priv [12]byte
	binary.LittleEndian.PutUint64(priv[0:], mr.Addr())
	binary.LittleEndian.PutUint32(priv[8:], uint32(mr.RKey()))
	cmd := transport.SGE{Addr: mr.Addr() + childArena, Length: 64, LKey: mr.LKey()}
	if err := q.Modify(transport.QPInit); err != nil {
		return err
	}
	if _, err := q.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{cmd}}}); err != nil {
		return err
	}
	c, err := req.Accept(ctx, q, priv[:])
	if err != nil {
		return err
	}
	if mode == "hang" {
		<-c.Done() // the parent stops and kills us
		return nil
	}
	wcs := make([]transport.WC, 8)
	for {
		n, err := cq.Poll(wcs)
		if err != nil {
			return err
		}
		if n == 0 {
			select {
			case <-c.Done():
				return nil
			default:
			}
			wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			cq.Wait(wctx)
			cancel()
			continue
		}
		for _, wc := range wcs[:n] {
			switch {
			case wc.Status == transport.StatusWRFlushErr:
				return nil // disconnected
			case wc.Status != transport.StatusSuccess:
				return fmt.Errorf("completion %s", wc.String())
			case wc.Opcode == transport.WCRecv:
				buf := a.Bytes()
				k := binary.LittleEndian.Uint32(buf[childArena:])
				sum := sha256.Sum256(buf[:min(int(k), childArena)])
				copy(buf[childArena+64:], sum[:])
				if _, err := q.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{cmd}}}); err != nil {
					return err
				}
				if _, err := q.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.OpSend, Flags: transport.FlagSignaled,
					SGL: []transport.SGE{{Addr: mr.Addr() + childArena + 64, Length: 32, LKey: mr.LKey()}}}}); err != nil {
					return err
				}
			}
		}
	}
}

// startChild starts the target process and waits until it listens.
func startChild(t *testing.T, mode string) (string, *exec.Cmd) {
	t.Helper()
	if testing.Short() {
		t.Skip("two-process test")
	}
	sock := filepath.Join(t.TempDir(), "t.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, sockEnv+"="+sock)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "READY" {
		t.Fatalf("child: %q, %v", line, err)
	}
	return sock, cmd
}

// initiatorSide is the parent's end: QP, CQs and a 2 MiB buffer.
type initiatorSide struct {
	p        *Provider
	scq, rcq transport.CQ
	q        transport.QP
	a        *transport.Arena
	mr       transport.MR
	c        transport.Conn
	raddr    uint64
	rkey     transport.Key
}

func dialChild(t *testing.T, sock string, cfg Config) *initiatorSide {
	t.Helper()
	cfg.Wire = WireShm
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	x := &initiatorSide{p: p}
	dev, _ := p.OpenDevice("")
	pd, _ := dev.AllocPD()
	x.scq, _ = dev.CreateCQ(256)
	x.rcq, _ = dev.CreateCQ(256)
	if x.q, err = pd.CreateQP(transport.QPConfig{SendCQ: x.scq, RecvCQ: x.rcq, MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 4}); err != nil {
		t.Fatal(err)
	}
	if x.a, err = transport.NewArena(2<<20, transport.ArenaOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.a.Close() })
	if x.mr, err = pd.RegMR(x.a, 0, x.a.Len(), transport.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := p.Resolve(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	if x.c, err = ep.Connect(ctx, x.q, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	priv := x.c.PrivateData()
	x.raddr = binary.LittleEndian.Uint64(priv[0:])
	x.rkey = transport.Key(binary.LittleEndian.Uint32(priv[8:]))
	return x
}

func (x *initiatorSide) sge(off, n int) transport.SGE {
	return transport.SGE{Addr: x.mr.Addr() + uint64(off), Length: uint32(n), LKey: x.mr.LKey()}
}

func waitWC(t *testing.T, c transport.CQ, timeout time.Duration) transport.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wc [1]transport.WC
	for {
		n, err := c.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := c.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

// TestShmTwoProcess moves data between this process and a target process
// over the shm wire: RDMA WRITE into the target's memory (checked by the
// target's own hash of it, returned in a SEND), RDMA READ back (checked
// byte for byte), with multi-SGE gathers and scatters.
func TestShmTwoProcess(t *testing.T) {
	sock, cmd := startChild(t, "serve")
	x := dialChild(t, sock, Config{})
	const n = 768 << 10
	buf := x.a.Bytes()
	for i := range n {
		buf[i] = byte(i*7 + i>>11)
	}
	// WRITE n bytes gathered from three SGEs (the middle one elsewhere).
	copy(buf[1<<20:], buf[n/3:2*n/3])
	w := transport.SendWR{ID: 1, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
		SGL:        []transport.SGE{x.sge(0, n/3), x.sge(1<<20, n/3), x.sge(2*n/3, n-2*n/3)},
		RemoteAddr: x.raddr, RKey: x.rkey}
	if _, err := x.q.PostSend([]transport.SendWR{w}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, x.scq, 5*time.Second); wc.Status != transport.StatusSuccess || wc.ByteLen != n {
		t.Fatalf("WRITE: %s", wc.String())
	}
	// Ask the target for the hash of what it holds.
	var sum [32]byte
	if _, err := x.q.PostRecv([]transport.RecvWR{{ID: 9, SGL: []transport.SGE{x.sge(1900<<10, 64)}}}); err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(buf[1800<<10:], n)
	if _, err := x.q.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.OpSend, SGL: []transport.SGE{x.sge(1800<<10, 4)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, x.rcq, 5*time.Second); wc.Status != transport.StatusSuccess || wc.ByteLen != 32 {
		t.Fatalf("hash from the target: %s", wc.String())
	}
	copy(sum[:], buf[1900<<10:])
	if want := sha256.Sum256(buf[:n]); sum != want {
		t.Fatalf("target holds sha256 %x, wrote %x", sum, want)
	}
	// READ it back, scattered over two SGEs.
	clear(buf[1<<20 : 1<<20+n])
	r := transport.SendWR{ID: 3, Opcode: transport.OpRDMARead, Flags: transport.FlagSignaled,
		SGL:        []transport.SGE{x.sge(1<<20, 4096+17), x.sge(1<<20+4096+17, n-4096-17)},
		RemoteAddr: x.raddr, RKey: x.rkey}
	if _, err := x.q.PostSend([]transport.SendWR{r}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, x.scq, 5*time.Second); wc.Status != transport.StatusSuccess || wc.ByteLen != n {
		t.Fatalf("READ: %s", wc.String())
	}
	if !bytes.Equal(buf[1<<20:1<<20+n], buf[:n]) {
		t.Fatal("READ returned different bytes")
	}
	// A bad rkey fails remotely and moves our QP to ERR.
	bad := transport.SendWR{ID: 4, Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
		SGL: []transport.SGE{x.sge(0, 16)}, RemoteAddr: x.raddr, RKey: x.rkey.Bump()}
	if _, err := x.q.PostSend([]transport.SendWR{bad}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, x.scq, 5*time.Second); wc.Status != transport.StatusRemAccessErr {
		t.Fatalf("WRITE with a stale rkey: %s", wc.String())
	}
	x.c.Disconnect()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("target process: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("target process did not exit after the disconnect")
	}
}

// TestShmPeerKilled kills the target process with WRs outstanding: the
// surviving QP goes to ERR, the oldest WR completes RETRY_EXC_ERR (the
// peer vanished under it), the rest and the posted receives flush, and
// Conn.Done closes — long before any retry timer would have fired.
func TestShmPeerKilled(t *testing.T) {
	sock, cmd := startChild(t, "hang")
	x := dialChild(t, sock, Config{RetryTimeout: time.Minute})
	if _, err := x.q.PostRecv([]transport.RecvWR{{ID: 100, SGL: []transport.SGE{x.sge(1<<20, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// SIGSTOP is asynchronous: wait until the kernel reports it stopped.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if i := bytes.LastIndexByte(b, ')'); err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the target process did not stop")
		}
	}
	var wrs []transport.SendWR
	for i := range 4 {
		wrs = append(wrs, transport.SendWR{ID: uint64(i), Opcode: transport.OpRDMAWrite, Flags: transport.FlagSignaled,
			SGL: []transport.SGE{x.sge(i*4096, 4096)}, RemoteAddr: x.raddr + uint64(i*4096), RKey: x.rkey})
	}
	if _, err := x.q.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let them go out; the target is stopped
	select {
	case <-x.c.Done():
		t.Fatal("connection ended while the peer was only stopped")
	default:
	}
	start := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-x.c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Conn.Done did not close after the peer was killed")
	}
	t.Logf("peer death noticed in %v: %v", time.Since(start), x.c.Err())
	if err := x.c.Err(); !errors.Is(err, transport.ErrDisconnected) || !errors.Is(err, errLinkLost) {
		t.Errorf("Conn.Err = %v, want a lost link", err)
	}
	for i := range 4 {
		wc := waitWC(t, x.scq, 5*time.Second)
		want := transport.StatusWRFlushErr
		if i == 0 {
			want = transport.StatusRetryExcErr
		}
		if wc.ID != uint64(i) || wc.Status != want {
			t.Errorf("send completion %d: %s, want ID %d %s", i, wc.String(), i, want)
		}
	}
	if wc := waitWC(t, x.rcq, 5*time.Second); wc.ID != 100 || wc.Status != transport.StatusWRFlushErr {
		t.Errorf("receive: %s, want flushed", wc.String())
	}
	if st := x.q.State(); st != transport.QPErr {
		t.Errorf("QP in %s, want ERR", st)
	}
}

// TestShmHostileDescriptor plays a peer that scribbles on the rings: each
// malformed descriptor moves the receiving QP to ERR with a logged reason
// and ends the connection.
func TestShmHostileDescriptor(t *testing.T) {
	for name, scribble := range map[string]func(l *shmLink){
		"unknown-arena": func(l *shmLink) {
			d := &desc{kind: pktWrite, psn: 0, key: 1, va: 1, length: 8, nseg: 1, mapSeq: l.mapsSent.Load()}
			d.segs[0] = dseg{id: 1 << 60, off: 0, n: 8}
			var b [maxDescSlots * shmSlot]byte
			k := encodeDesc(b[:], d)
			l.outReq.put(b[:], k)
		},
		"out-of-bounds": func(l *shmLink) {
			id := uint64(0)
			l.mapMu.Lock()
			for a := range l.sent {
				id = a
			}
			l.mapMu.Unlock()
			d := &desc{kind: pktWrite, psn: 0, key: 1, va: 1, length: 4096, nseg: 1, mapSeq: l.mapsSent.Load()}
			d.segs[0] = dseg{id: id, off: 1 << 20, n: 4096}
			var b [maxDescSlots * shmSlot]byte
			k := encodeDesc(b[:], d)
			l.outReq.put(b[:], k)
		},
		"garbage": func(l *shmLink) {
			var b [shmSlot]byte
			for i := range b {
				b[i] = byte(i * 37)
			}
			l.outReq.put(b[:], 1)
		},
		"tail": func(l *shmLink) {
			l.outReq.tail.Store(l.outReq.ptail + 1<<40)
		},
		"response-in-request-ring": func(l *shmLink) {
			var b [shmSlot]byte
			k := encodeDesc(b[:], &desc{kind: pktAck})
			l.outReq.put(b[:], k)
		},
	} {
		t.Run(name, func(t *testing.T) {
			x := newPair(t, Config{Wire: WireShm}, 1<<20)
			// One honest WRITE first, so A's arena is handed over.
			x.roundTrip(t, rdmaWR(x, transport.OpRDMAWrite, 64), nil, 1, 0)
			before := x.pb.Counters().BadFrames
			la := x.qa.(*qp).link.(*shmLink)
			// Scribble from A's requester's place: stop its goroutine
			// from producing by holding the QP lock.
			qa := x.qa.(*qp)
			qa.mu.Lock()
			scribble(la)
			la.peerBel.claim()
			la.uc.Write(la.wakeMsg[:])
			qa.mu.Unlock()
			select {
			case <-x.cb.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the receiving side kept the connection")
			}
			if st := x.qb.State(); st != transport.QPErr {
				t.Errorf("receiving QP in %s, want ERR", st)
			}
			if got := x.pb.Counters().BadFrames; got <= before {
				t.Errorf("BadFrames %d, want > %d", got, before)
			}
			t.Logf("conn error: %v", x.cb.Err())
		})
	}
}

// FuzzDecodeDesc feeds hostile bytes to the shm descriptor decoder: it
// must never panic, and whatever it accepts must be bounded and re-encode
// to the same bytes.
func FuzzDecodeDesc(f *testing.F) {
	var b [maxDescSlots * shmSlot]byte
	seeds := []desc{
		{kind: pktSend, flags: pfImm | pfSolicited, psn: 7, imm: 9, length: 100, nseg: 1, segs: [maxSGE]dseg{{id: 3, off: 4096, n: 100}}},
		{kind: pktWrite, key: 0x1234, va: 1 << 40, length: 30, nseg: 5, segs: [maxSGE]dseg{{1, 0, 1}, {2, 8, 2}, {3, 16, 3}, {4, 32, 4}, {5, 64, 20}}},
		{kind: pktRead, key: 0x99, va: 1 << 40, length: 65536, nseg: 2, segs: [maxSGE]dseg{{1, 0, 65000}, {2, 0, 536}}},
		{kind: pktReadResp, flags: dfPlaced, psn: 3, length: 4096},
		{kind: pktReadResp, psn: 3, length: 4096, nseg: 1, segs: [maxSGE]dseg{{7, 8192, 4096}}},
		{kind: pktNak, nak: nakRNR, psn: 3},
		{kind: pktAck, psn: 12},
		{kind: pktSend, flags: pfInv, key: 77, length: 130, ninline: 130},
	}
	for i := range seeds {
		k := encodeDesc(b[:], &seeds[i])
		f.Add(append([]byte(nil), b[:k*shmSlot]...))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var d desc
		if err := decodeDesc(data, &d); err != nil {
			return
		}
		var total uint64
		for i := 0; i < d.nseg; i++ {
			total += uint64(d.segs[i].n)
		}
		if d.nseg > maxSGE || d.ninline > maxInline || total > maxMsgSize || d.length > maxMsgSize {
			t.Fatalf("accepted an unbounded descriptor: %+v", d)
		}
		var out [maxDescSlots * shmSlot]byte
		k := encodeDesc(out[:], &d)
		if !bytes.Equal(out[:k*shmSlot], data) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", data, out[:k*shmSlot])
		}
	})
}

// FuzzDecodeCtl feeds hostile bytes to the control message decoder.
func FuzzDecodeCtl(f *testing.F) {
	var b [ctlMaxLen]byte
	for _, m := range []ctlMsg{
		{kind: ctlReq, priv: []byte("login"), credit: transport.ReadCredit{Out: 0, In: 4}},
		{kind: ctlRep, size: regionLen, priv: make([]byte, 196), credit: transport.ReadCredit{Out: 16, In: 200}},
		{kind: ctlMap, id: 5, size: 1 << 20},
		{kind: ctlDisc}, {kind: ctlWake},
	} {
		f.Add(append([]byte(nil), putCtl(b[:], &m)...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m ctlMsg
		if err := decodeCtl(data, &m); err != nil {
			return
		}
		if len(m.priv) > transport.MaxAcceptPrivateData || (m.kind == ctlMap && (m.size == 0 || m.size > maxArenaMap)) {
			t.Fatalf("accepted an unbounded message: %+v", m)
		}
		if out := putCtl(b[:], &m); !bytes.Equal(out, data) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", data, out)
		}
	})
}

// TestShmCoalescedACKs feeds a ring reader's responses to its link and
// reads back what the peer would find on the response ring: ACKs that
// follow one another within a poll batch leave as the last of them, and
// anything else (a NAK, a READ response, the batch's end) first publishes
// the ACK held before it, so nothing is reordered.
func TestShmCoalescedACKs(t *testing.T) {
	type frame struct {
		kind pktKind
		psn  uint32
	}
	ack := func(psn uint32) frame { return frame{pktAck, psn} }
	end := frame{kind: 0xff} // the poll batch ends
	tests := []struct {
		name string
		in   []frame
		want []frame
	}{
		{"consecutive ACKs", []frame{ack(1), ack(2), ack(3), end}, []frame{ack(3)}},
		{"NAK between", []frame{ack(1), {pktNak, 2}, ack(3), ack(4), end}, []frame{ack(1), {pktNak, 2}, ack(4)}},
		{"READ response between", []frame{ack(1), {pktReadResp, 2}, ack(3), end}, []frame{ack(1), {pktReadResp, 2}, ack(3)}},
		{"duplicate's older ACK", []frame{ack(5), ack(2), ack(3), end}, []frame{ack(5), ack(3)}},
		{"same PSN again", []frame{ack(4), ack(4), end}, []frame{ack(4), ack(4)}},
		{"PSN wrap", []frame{ack(1<<32 - 1), ack(0), end}, []frame{ack(0)}},
		{"batch ends", []frame{ack(1), end, ack(2), ack(3), end}, []frame{ack(1), ack(3)}},
		{"held until the batch ends", []frame{ack(1), ack(2)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			region := make([]byte, regionLen)
			initRegion(region)
			l := newShmLink(region, 0)
			for _, f := range tc.in {
				if f == end {
					if _, ok := l.poll(); !ok { // empty incoming rings: only the flush
						t.Fatal("poll of empty rings ended the link")
					}
					continue
				}
				p := &packet{kind: f.kind, psn: f.psn}
				switch f.kind {
				case pktNak:
					p.nak = nakRNR
				case pktReadResp:
					p.placed, p.length = true, 8
				}
				l.sendResponse(p)
			}
			// The peer's view of this side's response ring.
			peer := newShmLink(region, 1).inResp
			var got []frame
			for {
				k, ok := peer.avail()
				if !ok {
					t.Fatal("bad ring tail")
				}
				if k == 0 {
					break
				}
				extra, err := descExtra(peer.slot(peer.chead))
				if err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 0, (1+extra)*shmSlot)
				for i := range 1 + extra {
					b = append(b, peer.slot(peer.chead+uint64(i))...)
				}
				var d desc
				if err := decodeDesc(b, &d); err != nil {
					t.Fatalf("descriptor does not decode: %v", err)
				}
				got = append(got, frame{d.kind, d.psn})
				peer.release(uint64(1 + extra))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("published %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCtlTruncatedRights: a control message whose descriptors the kernel
// could not install (MSG_CTRUNC with none installed, what scm_detach_fds
// reports when the receiver is at its RLIMIT_NOFILE) is this process's
// shortage, not a malformed frame; one that overflows the control buffer
// with some installed, or whose data was cut, is the peer's.
func TestCtlTruncatedRights(t *testing.T) {
	var b [ctlMaxLen]byte
	data := putCtl(b[:], &ctlMsg{kind: ctlMap, id: 5, size: 1 << 20})
	tests := []struct {
		name  string
		oob   []byte // non-empty: one descriptor installed
		flags int
		want  error
	}{
		{name: "none installed", flags: unix.MSG_CTRUNC, want: errNoDescriptors},
		{name: "some installed", oob: []byte{1}, flags: unix.MSG_CTRUNC, want: errBadFrame},
		{name: "data cut", flags: unix.MSG_TRUNC | unix.MSG_CTRUNC, want: errBadFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := append([]byte(nil), data...)
			oob := append([]byte(nil), tc.oob...)
			if len(tc.oob) > 0 {
				// finishCtl closes what it was handed: hand it a copy
				// of stdin, not stdin.
				fd, err := unix.Dup(0)
				if err != nil {
					t.Fatal(err)
				}
				oob = unix.UnixRights(fd)
			}
			var m ctlMsg
			fds, err := finishCtl(buf, oob, len(buf), len(oob), tc.flags, nil, &m)
			if !errors.Is(err, tc.want) || len(fds) != 0 {
				t.Fatalf("finishCtl: %d descriptors, %v; want none and %v", len(fds), err, tc.want)
			}
		})
	}
}
