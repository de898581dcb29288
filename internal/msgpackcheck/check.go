// Package msgpackcheck validates msgpack bytes from an untrusted source
// before a decoder sees them, so that a hostile or corrupt length prefix
// cannot make the decoder allocate or loop far beyond the input's real
// size.
package msgpackcheck

import "errors"

// MaxDepth bounds nesting; gosrp's records and IUs nest a few levels.
const MaxDepth = 8

// ErrMalformed is returned for anything that is not exactly one
// well-formed msgpack value.
var ErrMalformed = errors.New("malformed msgpack")

// Check verifies that b is exactly one well-formed msgpack value whose
// every declared length fits in the bytes that follow.
func Check(b []byte) error {
	rest, err := skipValue(b, 0)
	if err == nil && len(rest) != 0 {
		err = ErrMalformed
	}
	return err
}

// skipValue returns b after its first value.
func skipValue(b []byte, depth int) ([]byte, error) {
	if len(b) == 0 || depth > MaxDepth {
		return nil, ErrMalformed
	}
	c, b := b[0], b[1:]
	// uintN reads an n-byte big-endian length.
	uintN := func(n int) (int, bool) {
		if len(b) < n {
			return 0, false
		}
		var v uint64
		for _, x := range b[:n] {
			v = v<<8 | uint64(x)
		}
		b = b[n:]
		return int(min(v, uint64(len(b))+1)), true // > len(b) means too long
	}
	var skip, elems int // bytes to skip, then values to skip
	ok := true
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
	case c <= 0x8f:
		elems = 2 * int(c&0x0f)
	case c <= 0x9f:
		elems = int(c & 0x0f)
	case c <= 0xbf:
		skip = int(c & 0x1f)
	case c == 0xc4 || c == 0xd9:
		skip, ok = uintN(1)
	case c == 0xc5 || c == 0xda:
		skip, ok = uintN(2)
	case c == 0xc6 || c == 0xdb:
		skip, ok = uintN(4)
	case c == 0xc7, c == 0xc8, c == 0xc9: // ext: length, then type byte
		skip, ok = uintN(1 << (c - 0xc7))
		skip++
	case c == 0xca:
		skip = 4
	case c == 0xcb:
		skip = 8
	case c >= 0xcc && c <= 0xcf:
		skip = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		skip = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8: // fixext: type byte + 1..16 bytes
		skip = 1 + 1<<(c-0xd4)
	case c == 0xdc:
		elems, ok = uintN(2)
	case c == 0xdd:
		elems, ok = uintN(4)
	case c == 0xde:
		elems, ok = uintN(2)
		elems *= 2
	case c == 0xdf:
		elems, ok = uintN(4)
		elems *= 2
	default: // 0xc1 is never used
		return nil, ErrMalformed
	}
	if !ok || skip > len(b) || elems > len(b) {
		return nil, ErrMalformed
	}
	b = b[skip:]
	var err error
	for i := 0; i < elems; i++ {
		if b, err = skipValue(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
