package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestConnReject(t *testing.T) {
	long := strings.Repeat("x", MaxConnRejectMessage+10)
	for _, tc := range []struct {
		name string
		in   ConnReject
		want ConnReject
	}{
		{"reason only", ConnReject{Reason: RejectShuttingDown}, ConnReject{Reason: RejectShuttingDown}},
		{"message", ConnReject{Reason: RejectInsufficientResources, Message: "too many connections"},
			ConnReject{Reason: RejectInsufficientResources, Message: "too many connections"}},
		{"long message cut", ConnReject{Reason: RejectInsufficientResources, Message: long},
			ConnReject{Reason: RejectInsufficientResources, Message: long[:MaxConnRejectMessage]}},
		{"control bytes", ConnReject{Reason: RejectProtocol, Message: "a\x1b[2Jb\n"},
			ConnReject{Reason: RejectProtocol, Message: "a?[2Jb?"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.in.Encode()
			if len(b) > 148 {
				t.Fatalf("%d bytes: more than a CM reject carries", len(b))
			}
			// IB CM pads private data with zeros to its field's size.
			padded := append(b, make([]byte, 148-len(b))...)
			for _, in := range [][]byte{b, padded} {
				got, err := DecodeConnReject(in)
				if err != nil || got != tc.want {
					t.Errorf("decode %d bytes: %+v, %v; want %+v", len(in), got, err, tc.want)
				}
			}
		})
	}
	for _, bad := range [][]byte{
		nil,
		Hello{Version: Version}.Encode(),
		{'G', 'S', 'R', 'J', 1},
		{'G', 'S', 'R', 'J', 1, 3, 'a'},
		append([]byte{'G', 'S', 'R', 'J', 1, MaxConnRejectMessage + 1}, bytes.Repeat([]byte{'a'}, 200)...),
	} {
		if r, err := DecodeConnReject(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeConnReject(%x) = %+v, %v; want ErrMalformed", bad, r, err)
		}
	}
	if _, err := DecodeHello(ConnReject{Reason: RejectVersion}.Encode()); err == nil {
		t.Error("a connect reject reads as a Hello")
	}
}

// FuzzConnRejectDecode: any bytes decode without a panic, and what
// decodes is printable, bounded, and encodes back to a prefix of what it
// came from when the message was printable already.
func FuzzConnRejectDecode(f *testing.F) {
	f.Add(ConnReject{Reason: RejectInsufficientResources, Message: "too many connections"}.Encode())
	f.Add([]byte{'G', 'S', 'R', 'J', 0, 0})
	f.Add(Hello{Version: Version}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeConnReject(b)
		if err != nil {
			return
		}
		if len(r.Message) > MaxConnRejectMessage {
			t.Fatalf("message of %d bytes", len(r.Message))
		}
		for _, c := range []byte(r.Message) {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("unprintable byte %#x in %q", c, r.Message)
			}
		}
		if e := r.Encode(); !bytes.Equal(e, b[:len(e)]) && bytes.Equal(e[6:], b[6:len(e)]) {
			t.Fatalf("re-encoded %x is no prefix of %x", e, b)
		}
	})
}
