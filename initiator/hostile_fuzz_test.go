package initiator_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target/targettest"
)

// fuzzPeer is one hostile target and one session, kept across the fuzz
// inputs of a process (a rig per input would spend the time on setup).
type fuzzPeer struct {
	r     *hostileRig
	s     *initiator.Session
	v     *initiator.Volume
	model []byte

	mu    sync.Mutex
	in    []byte // the current input's script bytes
	pos   int
	bad   int  // misbehaviours so far in this input
	quiet bool // between inputs: answer everything correctly
}

// maxBad bounds the misbehaviours per input. A target that misbehaves on
// every answer keeps the initiator reconnecting and re-issuing for as
// long as it does (the initiator fails I/O only when it cannot reach the
// target for Config.LossTimeout); the property fuzzed is what happens
// around a finite run of them.
const maxBad = 4

// next is the next script byte, or 0 (pass) once the input is used up.
func (p *fuzzPeer) next() byte {
	if p.quiet || p.pos >= len(p.in) || p.bad >= maxBad {
		return 0
	}
	b := p.in[p.pos]
	p.pos++
	return b
}

func (p *fuzzPeer) respond(rsp *targettest.Response) targettest.Action {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.next()
	if rsp.Login {
		if b%16 == 15 {
			p.bad++
			return targettest.Disconnect
		}
		return targettest.Pass
	}
	if b%8 < 4 {
		return targettest.Pass
	}
	p.bad++
	return misbehave(rsp, int(b/8)%5)
}

const fuzzBlocks, fuzzBS = 64, 4096

// FuzzHostileTarget drives the initiator with arbitrary target behaviour:
// the input is both the workload (up to 8 reads and writes at up to QD4)
// and a script for the target's answers (pass, answer twice, invalidate
// the wrong key, answer without invalidation, cut the connection, also
// during login). Whatever the target does, the initiator must not panic,
// must complete each request exactly once and without error (it may
// reconnect), must return what was written, and its pools and credits
// must pass Session.Check afterwards.
func FuzzHostileTarget(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{0, 0, 0, 0})
	f.Add([]byte{0x11, 0x92, 0x23, 0x84}, []byte{4, 5, 6, 7, 4, 5, 6, 7})
	f.Add([]byte{0x81, 0x82, 0x83, 0x84, 0x85, 0x86}, []byte{7, 15, 0, 7, 15, 6})
	// Every fuzzing process runs this function once: one rig each.
	p := &fuzzPeer{model: make([]byte, fuzzBlocks*fuzzBS)}
	p.r = newHostileRig(f, "strict", targettest.Script{Respond: p.respond})
	p.s, p.v = p.r.dial(f, initiator.Config{Credits: 4, LossTimeout: time.Minute})
	f.Fuzz(func(t *testing.T, ops, script []byte) {
		p.mu.Lock()
		p.in, p.pos, p.bad, p.quiet = script, 0, 0, false
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.quiet = true
			p.mu.Unlock()
		}()
		if len(ops) > 8 {
			ops = ops[:8]
		}
		done := make(chan *initiator.Request, len(ops))
		used := map[int]bool{}
		var reqs []*initiator.Request
		for i, b := range ops {
			// b: bit 7 write, bits 4-5 blocks-1, bits 0-3 and the index
			// pick the place; requests of one input never overlap.
			nb := 1 + int(b>>4&3)
			lba := (int(b&15)*4 + i) % (fuzzBlocks - nb)
			if !claim(used, lba, nb) {
				continue
			}
			r := &initiator.Request{Op: initiator.OpRead, Buf: make([]byte, nb*fuzzBS), Offset: int64(lba * fuzzBS), Done: done}
			if b&0x80 != 0 {
				r.Op = initiator.OpWrite
				for j := range r.Buf {
					r.Buf[j] = byte(int(b) + i + j/fuzzBS)
				}
			}
			if err := p.v.Submit(r); err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, r)
		}
		got := map[*initiator.Request]bool{}
		timeout := time.After(30 * time.Second)
		for range reqs {
			var r *initiator.Request
			select {
			case r = <-done:
			case <-timeout:
				t.Fatalf("%d of %d requests never completed", len(reqs)-len(got), len(reqs))
			}
			if got[r] {
				t.Fatalf("request completed twice")
			}
			got[r] = true
			if r.Err != nil {
				t.Fatalf("%s of %d at %d: %v", r.Op, len(r.Buf), r.Offset, r.Err)
			}
			if r.Op == initiator.OpWrite {
				copy(p.model[r.Offset:], r.Buf)
			} else if !bytes.Equal(r.Buf, p.model[r.Offset:r.Offset+int64(len(r.Buf))]) {
				t.Fatalf("read of %d at %d differs from what was written", len(r.Buf), r.Offset)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.s.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
