package target

import (
	"bytes"
	"io"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// countVolume answers every ReadAt and WriteAt with the count and error
// its fields make of the request's length, without moving the bytes
// past that count.
type countVolume struct {
	Volume
	count func(n int) int
	err   error
}

func (v countVolume) ReadAt(p []byte, off int64) (int, error) {
	n := v.count(len(p))
	if _, err := v.Volume.ReadAt(p[:n], off); err != nil {
		return 0, err
	}
	return n, v.err
}

func (v countVolume) WriteAt(p []byte, off int64) (int, error) {
	n := v.count(len(p))
	if _, err := v.Volume.WriteAt(p[:n], off); err != nil {
		return 0, err
	}
	return n, v.err
}

// TestShortTransfer: a volume call that moves fewer bytes than asked
// without an error breaks io.ReaderAt's contract and is answered MEDIUM
// ERROR, so that the bytes it left in the slot's buffer (an earlier
// command's) never go out as data; a read of every byte that says
// io.EOF, as io.ReaderAt allows at the end of the input, is GOOD.
func TestShortTransfer(t *testing.T) {
	half := func(n int) int { return n / 2 }
	whole := func(n int) int { return n }
	for _, tc := range []struct {
		name  string
		op    wire.Op
		count func(int) int
		err   error
		want  wire.Sense // wire.SenseNone: GOOD
	}{
		{"read/short", wire.OpRead, half, nil, wire.SenseMediumError},
		{"read/whole-eof", wire.OpRead, whole, io.EOF, wire.SenseNone},
		{"read/short-eof", wire.OpRead, half, io.EOF, wire.SenseMediumError},
		{"write/short", wire.OpWrite, half, nil, wire.SenseMediumError},
		{"write/whole", wire.OpWrite, whole, nil, wire.SenseNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, env{wire: "loop"}, Config{SpareBuffers: 1})
			// An earlier connection's WRITE leaves its bytes in the
			// buffer of the slot the next connection's command takes.
			c := r.dial(t)
			c.login("ini")
			h := c.open("vol0", false)
			old := pattern(8<<10, 7)
			copy(c.data(0, len(old)), old)
			expectGood(t, first(c.do(c.io(wire.OpWrite, h, 64*bs, 0, len(old), 1))))
			c.close()
			// Its buffers, the WRITE's bytes in them, are the next
			// connection's (spareBufs).
			waitFor(t, "the connection's buffers kept", func() bool { return r.spareCount() == 1 })

			r.cat.wrap = func(v Volume) Volume { return countVolume{Volume: v, count: tc.count, err: tc.err} }
			c = r.dial(t)
			c.login("ini")
			h = c.open("vol0", false)
			want := pattern(8<<10, 3)
			copy(c.data(0, len(want)), want)
			if tc.op == wire.OpRead {
				clear(c.data(0, len(want)))
			}
			rsp, _ := c.do(c.io(tc.op, h, 0, 0, len(want), 1))
			if tc.want == wire.SenseNone {
				expectGood(t, rsp)
				if tc.op == wire.OpRead && bytes.Contains(c.data(0, len(want)), old[len(old)/2:]) {
					t.Fatal("READ sent an earlier command's bytes")
				}
				return
			}
			expectSense(t, rsp, tc.want)
			if tc.op == wire.OpRead && !bytes.Equal(c.data(0, len(want)), make([]byte, len(want))) {
				t.Fatal("a READ answered MEDIUM ERROR wrote data into the initiator's buffer")
			}
		})
	}
}

// first is a response without its completion.
func first(rsp wire.Response, _ any) wire.Response { return rsp }
