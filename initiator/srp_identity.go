package initiator

// A LUN checked after each re-login. T10 SRP has no OPEN: a LUN is
// there for the whole login, and a re-login used to address the
// session's volumes by their numbers at once. But the unit behind a
// number can change while the connection is down: a volume deleted and
// created again under its name during a restart of srpd, a target that
// numbered its LUNs anew. The writes the session made, and the copies it
// keeps for a replay, belong to the unit that is gone; sending them on,
// and then answering a SYNCHRONIZE CACHE, once had `srpc --protocol srp
// import` exit 0 over a volume whose first 11 MiB were zeros.
//
// So SRP does what gosrp's re-open does (replaced.go): Open learns the
// unit's identity from its Device Identification page (VPD 0x83), and
// after every re-login the unit's requests park, as a late volume's do
// (late_open.go), until the same page has been read again on the new
// connection. The same identity releases them; another fails them, and
// every later request of the Volume, with ErrVolumeReplaced. So does a
// target that answers LOGICAL UNIT NOT SUPPORTED (05h/25h/00h): the
// unit is gone (srpd gives a volume created anew another LUN), and
// Linux fails a disk's I/O on it as well. One still becoming ready
// (NOT READY 04h/01h: srpd opening a volume its store is slow to open)
// is asked again while the loss deadline lasts. A unit whose page said
// nothing at Open is not checked.

import (
	"context"
	"hash/fnv"

	"github.com/gosrp/gosrp/internal/scsi"
)

// luIdentity is the identity of a logical unit as its Device
// Identification page (VPD 0x83, SPC-4 7.8.6) tells it: a hash of
// every designator associated with the unit (association 00b), with its
// type and code set, or 0 if there is none. srpd reports the volume's
// incarnation there (scsi.Device.Incarnation); another target's NAA
// comes from its unit serial number, which a backstore made anew does
// not share (LIO's is a random UUID).
func luIdentity(p []byte) uint64 {
	h := fnv.New64a()
	n := 0
	eachDesignator(p, func(assoc, typ byte, d []byte) bool {
		if assoc != 0 {
			return true
		}
		h.Write([]byte{typ, byte(len(d))})
		h.Write(d)
		n++
		return true
	})
	if n == 0 {
		return 0
	}
	return max(h.Sum64(), 1)
}

// checksLUN reports whether v's unit is checked after a re-login before
// its requests go out: it told an identity at Open and was not found
// replaced already.
func (v *Volume) checksLUN() bool {
	k := v.ident.Load()
	return k != nil && k.id != 0 && !v.replaced.Load()
}

// recheckLUN reads v's Device Identification page on the connection of
// epoch until it answers, v is closed, or ctx ends (the connection
// did), and then releases v's parked requests or finds v replaced. A
// target that fails the INQUIRY (the LUN not there yet) is asked again
// with reopenLate's backoff, while the loss deadline lasts.
func (c *channel) recheckLUN(ctx context.Context, v *Volume, epoch uint64) {
	defer c.late.wg.Done()
	b := lateBackoff{what: "identity of a LUN not read after the re-login; asking again"}
	for {
		p, err := c.s.vpd(ctx, c, v.lun, 0x83, 255)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			c.lunChecked(v, luIdentity(p), epoch)
			return
		}
		if scsiSense(err) == scsi.SenseLUNotSupported {
			v.gone.Store(true)
			c.lateReplaced(v, 0)
			return
		}
		if !b.again(ctx, c, v, err.Error()) {
			return
		}
	}
}

// lunChecked hands the loop v's LUN on the connection of epoch if its
// unit still has identity id, or records that v was replaced.
func (c *channel) lunChecked(v *Volume, id, epoch uint64) {
	if !v.sameVolume(id, 0) {
		c.lateReplaced(v, id)
		return
	}
	c.s.mu.Lock()
	if !v.closed {
		c.setHandle(v, uint32(v.lun), epoch)
	}
	c.s.mu.Unlock()
}
