package wire

import (
	"bytes"
	"fmt"
)

// ConnReject is the private data of a connect request that the target
// refused before any login: too many connections, or shutting down. A
// version mismatch is answered with a Hello instead; a login refused
// after the connection is up, with a LoginReject.
//
// Layout: magic "GSRJ", reason u8, message length u8, message. Its own
// magic keeps it from being read as a Hello, and the length from taking
// IB CM's zero padding for part of the message.
type ConnReject struct {
	Reason  RejectReason
	Message string
}

// MaxConnRejectMessage bounds ConnReject's message so that the whole
// fits a CM reject's private data (transport.MaxRejectPrivateData, 148
// bytes) on every provider.
const MaxConnRejectMessage = 128

var connRejectMagic = [4]byte{'G', 'S', 'R', 'J'}

// Encode returns the reject's bytes; a message longer than
// MaxConnRejectMessage is cut.
func (r ConnReject) Encode() []byte {
	m := r.Message[:min(len(r.Message), MaxConnRejectMessage)]
	b := make([]byte, 6+len(m))
	copy(b, connRejectMagic[:])
	b[4] = byte(r.Reason)
	b[5] = byte(len(m))
	copy(b[6:], m)
	return b
}

// DecodeConnReject parses a ConnReject. The message comes from the peer
// and ends up in logs and error strings: every byte outside printable
// ASCII reads as '?'.
func DecodeConnReject(b []byte) (ConnReject, error) {
	if len(b) < 6 || !bytes.Equal(b[:4], connRejectMagic[:]) {
		return ConnReject{}, fmt.Errorf("%w: not a gosrp connect reject (%d bytes)", ErrMalformed, len(b))
	}
	n := int(b[5])
	if n > MaxConnRejectMessage || 6+n > len(b) {
		return ConnReject{}, fmt.Errorf("%w: connect reject message of %d bytes in %d", ErrMalformed, n, len(b)-6)
	}
	m := make([]byte, n)
	for i, c := range b[6 : 6+n] {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		m[i] = c
	}
	return ConnReject{Reason: RejectReason(b[4]), Message: string(m)}, nil
}
