package targettest_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// end is one side of a raw verbs connection: a QP, its CQ, and a buffer
// of 8 IUs of 64 bytes registered for SEND and receive.
type end struct {
	cq  transport.CQ
	qp  transport.QP
	mr  transport.MR
	buf []byte
	sge [8]transport.SGE
}

func newEnd(t *testing.T, dev transport.Device) *end {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	e := &end{}
	if e.cq, err = dev.CreateCQ(32); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = pd.CreateQP(transport.QPConfig{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Modify(transport.QPInit); err != nil {
		t.Fatal(err)
	}
	a, err := transport.NewArena(8*64, transport.ArenaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e.mr, err = pd.RegMR(a, 0, a.Len(), transport.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	e.buf = a.Bytes()
	t.Cleanup(func() {
		e.qp.Close()
		e.mr.Close()
		e.cq.Close()
		pd.Close()
		a.Close()
	})
	for i := range e.sge {
		e.sge[i] = transport.SGE{Addr: e.mr.Addr() + uint64(64*i), Length: 64, LKey: e.mr.LKey()}
	}
	return e
}

// recv posts receives into buffers from..to-1.
func (e *end) recv(t *testing.T, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := e.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: e.sge[i : i+1]}}); err != nil {
			t.Fatal(err)
		}
	}
}

// send sends iu from buffer 7.
func (e *end) send(t *testing.T, iu string) {
	t.Helper()
	copy(e.buf[7*64:], iu)
	sge := []transport.SGE{{Addr: e.sge[7].Addr, Length: uint32(len(iu)), LKey: e.sge[7].LKey}}
	if _, err := e.qp.PostSend([]transport.SendWR{{ID: 7, Opcode: transport.OpSend, Flags: transport.FlagSignaled, SGL: sge}}); err != nil {
		t.Fatal(err)
	}
}

// poll polls until done says so, and returns what the completions were:
// "send", or the IU a receive brought.
func (e *end) poll(t *testing.T, done func([]string) bool) []string {
	t.Helper()
	var got []string
	wcs := make([]transport.WC, 8)
	for deadline := time.Now().Add(10 * time.Second); !done(got); {
		if time.Now().After(deadline) {
			t.Fatalf("polled %q and no more", got)
		}
		n, err := e.cq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			switch {
			case wc.Status != transport.StatusSuccess:
				t.Fatalf("completion %s", wc.String())
			case wc.Opcode == transport.WCRecv:
				got = append(got, string(e.buf[wc.ID*64:wc.ID*64+uint64(wc.ByteLen)]))
			default:
				got = append(got, "send")
			}
		}
		if n == 0 {
			// A wake-up may be spurious, and a swallowed receive wakes
			// the target for nothing: the deadline bounds the wait.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			_ = e.cq.Wait(ctx)
			cancel()
		}
	}
	return got
}

func count(n int) func([]string) bool { return func(got []string) bool { return len(got) >= n } }

// TestScriptRewritesAndSends: on a raw verbs connection through the kit,
// Script.Accept rewrites the accept's private data, Response.IU the bytes
// of a response before it is posted, Response.Send puts a request of the
// kit's own ahead of the response (its send completion never reaches the
// target), and Script.Swallow takes the peer's answers away from the
// target and reposts their receives: with two receives posted, three
// swallowed answers and then a request still reach it.
func TestScriptRewritesAndSends(t *testing.T) {
	var swallowed atomic.Int32
	p, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h := targettest.Wrap(p, targettest.Script{
		Accept: func(priv []byte) []byte { return append(bytes.ToUpper(priv), '!') },
		Respond: func(r *targettest.Response) targettest.Action {
			iu := r.IU()
			if bytes.HasPrefix(iu, []byte("RSP")) {
				copy(iu, "LIE")
				if err := r.Send([]byte("REQ-A")); err != nil {
					t.Error(err)
				}
			}
			return targettest.Pass
		},
		Swallow: func(iu []byte) bool {
			if bytes.HasPrefix(iu, []byte("ANS")) {
				swallowed.Add(1)
				return true
			}
			return false
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := h.Listen(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type accepted struct {
		e   *end
		err error
	}
	ac := make(chan accepted, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			ac <- accepted{err: err}
			return
		}
		e := newEnd(t, req.Device())
		e.recv(t, 0, 2)
		_, err = req.Accept(ctx, e.qp, []byte("welcome"))
		ac <- accepted{e, err}
	}()
	ep, err := p.Resolve(ctx, l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ini := newEnd(t, ep.Device())
	ini.recv(t, 0, 4)
	conn, err := ep.Connect(ctx, ini.qp, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	a := <-ac
	if a.err != nil {
		t.Fatal(a.err)
	}
	tgt := a.e
	if got := string(conn.PrivateData()); got != "WELCOME!" {
		t.Fatalf("accept private data %q, want the script's WELCOME!", got)
	}

	tgt.send(t, "RSP-1")
	if got := tgt.poll(t, count(1)); len(got) != 1 || got[0] != "send" {
		t.Fatalf("the target polled %q, want its own send completion alone", got)
	}
	if got := ini.poll(t, count(2)); got[0] != "REQ-A" || got[1] != "LIE-1" {
		t.Fatalf("the peer received %q, want the kit's request, then the rewritten response", got)
	}
	for i := range 3 {
		ini.send(t, "ANS-"+string(rune('1'+i)))
		ini.poll(t, count(1))
		tgt.poll(t, func([]string) bool { return swallowed.Load() == int32(i+1) })
	}
	ini.send(t, "CMD-1")
	if got := tgt.poll(t, count(1)); got[0] != "CMD-1" {
		t.Fatalf("the target received %q, want CMD-1 past the swallowed answers", got)
	}
}
