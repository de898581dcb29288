package emu

import (
	"bytes"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// FuzzDecodeHeader feeds hostile bytes to the tcp wire's frame decoder: it
// must never panic, and whatever it accepts must bound the payload and
// re-encode to the same header.
func FuzzDecodeHeader(f *testing.F) {
	var b [headerLen]byte
	for _, h := range []header{
		{kind: pktSend, flags: pfImm | pfInv, psn: 7, imm: 9, key: 0x1234, paylen: 4096},
		{kind: pktRead, key: 0x99, va: 1 << 40, length: 65536},
		{kind: pktNak, nak: nakAccess, psn: 3},
		{kind: cmReq, imm: uint32(putCredit(transport.ReadCredit{Out: 16, In: 3})), paylen: 56},
	} {
		putHeader(b[:], &h)
		f.Add(append([]byte(nil), b[:]...))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var h header
		if err := decodeHeader(data, &h); err != nil {
			return
		}
		if h.paylen > maxMsgSize || (h.kind == pktRead && h.length > maxMsgSize) {
			t.Fatalf("accepted an unbounded frame: %+v", h)
		}
		var out [headerLen]byte
		putHeader(out[:], &h)
		if !bytes.Equal(out[:], data[:headerLen]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", data[:headerLen], out[:])
		}
	})
}
