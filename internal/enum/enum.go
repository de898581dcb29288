// Package enum names the values of small integer enumerations, for their
// String methods. A type keeps its names in one table indexed by value
// and its String method is one line:
//
//	var opNames = [...]string{OpRead: "read", OpWrite: "write"}
//
//	func (o Op) String() string { return enum.Name(opNames[:], o, "Op") }
//
// A set of bit flags names its bits the same way, bit i by names[i]
// (Flags).
//
// A value past the table, or one the table leaves unnamed, prints as
// "Op(7)" (Name) or "Op(0x07)" (Hex): such a value comes from a newer peer,
// the wire or a bug, and the house rule is never a panic on any of them.
package enum

import (
	"strconv"
	"strings"
)

// Unsigned is the kinds of integer an enumeration may be.
type Unsigned interface {
	~uint8 | ~uint16 | ~uint32 | ~uint64
}

// Name returns names[v], or kind(v) in decimal when names has no entry for v.
func Name[T Unsigned](names []string, v T, kind string) string {
	if s, ok := lookup(names, v); ok {
		return s
	}
	return kind + "(" + strconv.FormatUint(uint64(v), 10) + ")"
}

// Hex returns names[v], or kind(0xNN) when names has no entry for v: for
// codes a specification writes in hexadecimal, such as opcodes, with at
// least two digits as fmt's %#02x prints them.
func Hex[T Unsigned](names []string, v T, kind string) string {
	if s, ok := lookup(names, v); ok {
		return s
	}
	digits := strconv.FormatUint(uint64(v), 16)
	if len(digits) < 2 {
		digits = "0" + digits
	}
	return kind + "(0x" + digits + ")"
}

// Flags names the bits set in v, bit i by names[i], joined with "|"
// ("flush|fua"); bits past names print as one hexadecimal number, and no
// bit at all as "none".
func Flags[T Unsigned](names []string, v T) string {
	if v == 0 {
		return "none"
	}
	var parts []string
	for i, n := range names {
		if v&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	if rest := uint64(v) &^ (1<<len(names) - 1); rest != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(rest, 16))
	}
	return strings.Join(parts, "|")
}

// lookup returns names[v] where it is set.
func lookup[T Unsigned](names []string, v T) (string, bool) {
	if uint64(v) >= uint64(len(names)) || names[v] == "" {
		return "", false
	}
	return names[v], true
}
