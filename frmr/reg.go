package frmr

import (
	"github.com/gosrp/gosrp/transport"
)

// Segment is a buffer inside a registered arena.
type Segment struct {
	Arena *transport.Arena
	Off   int
	Len   int
	// Base, if set, is the MR a window is bound over instead of
	// Config.BaseMR (MW only). On a device that does not check window
	// bounds (transport.Quirks.WindowBoundsUnchecked) a window's key
	// reaches all of the MR under it, so a caller that must keep I/O
	// buffers apart binds each over an MR of its own.
	Base transport.MR
}

// maxBinds is how many registrations one window takes before it is
// rotated: its 8-bit key variant would next repeat one a peer was given
// (the avoid rule may skip one variant, hence one less than 255).
const maxBinds = 254

// Reg is one registration handed out by Get: a value handle, valid until
// Done reports true.
type Reg struct {
	slot   uint32
	gen    uint32
	rkey   transport.Key
	iova   uint64
	length int
	wr     transport.SendWR
}

// RKey is the key to advertise.
func (r *Reg) RKey() transport.Key { return r.rkey }

// IOVA is the address to advertise.
func (r *Reg) IOVA() uint64 { return r.iova }

// Len is the registered length.
func (r *Reg) Len() int { return r.length }

// Slot is the pool slot of the registration.
func (r *Reg) Slot() int { return int(r.slot) }

// WR is the REG_MR or BIND_MW work request to chain in front of the SEND
// that advertises the key.
func (r *Reg) WR() transport.SendWR { return r.wr }
