package transport

import "fmt"

// Key is a 32-bit local or remote memory key: a 24-bit index naming the
// memory region or window object and an 8-bit consumer key ("variant") that
// the consumer changes on every fast registration.
type Key uint32

// MakeKey returns the key with the given 24-bit index and 8-bit variant.
// Index bits above 24 are discarded.
func MakeKey(index uint32, variant uint8) Key {
	return Key(index<<8 | uint32(variant))
}

// Index is the 24-bit object index of the key.
func (k Key) Index() uint32 { return uint32(k) >> 8 }

// Variant is the 8-bit consumer-owned part of the key.
func (k Key) Variant() uint8 { return uint8(k) }

// Bump returns the next key for the same object: the variant plus one,
// wrapping from 0xff to 0x00, with the index unchanged. It mirrors
// ib_inc_rkey() in include/rdma/ib_verbs.h and ibv_inc_rkey() in
// libibverbs.
func (k Key) Bump() Key {
	return Key(uint32(k)&^0xff | uint32(uint8(k)+1))
}

// String formats the key as index:variant in hex, e.g. "0x00002a:07".
func (k Key) String() string {
	return fmt.Sprintf("%#06x:%02x", k.Index(), k.Variant())
}

// Access is the set of permissions granted by a registration, the
// IBV_ACCESS_* flags.
type Access uint32

// Access flags. Local read is always allowed. LocalWrite must accompany
// RemoteWrite and RemoteAtomic (ibv_reg_mr(3)); providers reject the
// combination without it.
const (
	AccessLocalWrite Access = 1 << iota
	AccessRemoteWrite
	AccessRemoteRead
	AccessRemoteAtomic
	// AccessMWBind allows type-2 memory windows to be bound over the MR.
	AccessMWBind
)

// Valid reports whether the combination is one a device accepts.
func (a Access) Valid() bool {
	if a&^(AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic|AccessMWBind) != 0 {
		return false
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return false
	}
	return true
}

// String lists the flags, e.g. "LOCAL_WRITE|REMOTE_WRITE".
func (a Access) String() string {
	if a == 0 {
		return "LOCAL_READ"
	}
	names := [...]string{"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC", "MW_BIND"}
	var s string
	for i, n := range names {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := a &^ (1<<len(names) - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	return s
}
