package emu

import (
	"encoding/binary"
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// The shm wire carries one descriptor per packet in a ring of 64-byte
// slots: a head slot, then continuation slots holding further segments
// (three per slot) or inline bytes. Payload never travels in the ring
// except inline data; segments name arena memory of the sender that the
// receiving NIC has mapped (arena ID, offset, length).
//
// Head slot, little endian:
//
//	0  kind    u8
//	1  flags   u8   packet flags; 0x80 on a READ_RESP: data already placed
//	2  nak     u8
//	3  nseg    u8   segments (0..maxSGE): SEND/WRITE sources, READ sinks,
//	                duplicate READ_RESP source
//	4  psn     u32
//	8  imm     u32
//	12 key     u32
//	16 va      u64
//	24 length  u32  READ: bytes asked for; otherwise bytes carried
//	28 mapSeq  u32  arena MAP messages the sender had sent when it published
//	32 inline  u16  inline bytes in the continuation slots (0..maxInline)
//	34 extra   u8   continuation slots that follow
//	35 magic   u8
//	36 seg 0   {id u64, off u64, len u32}
//	56 zero
//
// Every byte a descriptor does not use is zero, so that decoding and
// re-encoding a valid descriptor gives back the same bytes.
const (
	shmSlot      = 64
	descMagic    = 0xa5
	dfPlaced     = 0x80 // READ_RESP flag: the data is already in the sinks
	segLen       = 20
	segsPerSlot  = shmSlot / segLen // 3
	maxDescSlots = 1 + (maxSGE-1+segsPerSlot-1)/segsPerSlot
)

// dseg is a segment as it travels: an arena of the sender, named by its
// ID, and a range in it.
type dseg struct {
	id  uint64
	off uint64
	n   uint32
}

// desc is a decoded descriptor.
type desc struct {
	kind    pktKind
	flags   uint8
	nak     uint8
	psn     uint32
	imm     uint32
	key     transport.Key
	va      uint64
	length  uint32
	mapSeq  uint32
	nseg    int
	ninline int
	segs    [maxSGE]dseg
	inline  [maxInline]byte
}

// descSlots is the number of ring slots a descriptor occupies.
func descSlots(nseg, ninline int) int {
	if ninline > 0 {
		return 1 + (ninline+shmSlot-1)/shmSlot
	}
	if nseg <= 1 {
		return 1
	}
	return 1 + (nseg-1+segsPerSlot-1)/segsPerSlot
}

func putSeg(b []byte, s *dseg) {
	binary.LittleEndian.PutUint64(b[0:], s.id)
	binary.LittleEndian.PutUint64(b[8:], s.off)
	binary.LittleEndian.PutUint32(b[16:], s.n)
}

func getSeg(b []byte) dseg {
	return dseg{id: binary.LittleEndian.Uint64(b[0:]), off: binary.LittleEndian.Uint64(b[8:]), n: binary.LittleEndian.Uint32(b[16:])}
}

// encodeDesc writes d into dst (at least descSlots × shmSlot bytes) and
// returns the number of slots used.
func encodeDesc(dst []byte, d *desc) int {
	k := descSlots(d.nseg, d.ninline)
	b := dst[:k*shmSlot]
	clear(b)
	b[0] = byte(d.kind)
	b[1] = d.flags
	b[2] = d.nak
	b[3] = byte(d.nseg)
	binary.LittleEndian.PutUint32(b[4:], d.psn)
	binary.LittleEndian.PutUint32(b[8:], d.imm)
	binary.LittleEndian.PutUint32(b[12:], uint32(d.key))
	binary.LittleEndian.PutUint64(b[16:], d.va)
	binary.LittleEndian.PutUint32(b[24:], d.length)
	binary.LittleEndian.PutUint32(b[28:], d.mapSeq)
	binary.LittleEndian.PutUint16(b[32:], uint16(d.ninline))
	b[34] = byte(k - 1)
	b[35] = descMagic
	if d.ninline > 0 {
		copy(b[shmSlot:], d.inline[:d.ninline])
		return k
	}
	for i := 0; i < d.nseg; i++ {
		putSeg(b[segOffset(i):], &d.segs[i])
	}
	return k
}

// segOffset is where segment i lives in a descriptor's slots.
func segOffset(i int) int {
	if i == 0 {
		return 36
	}
	i--
	return shmSlot*(1+i/segsPerSlot) + segLen*(i%segsPerSlot)
}

// descExtra reads the continuation count from a head slot, bounded.
func descExtra(head []byte) (int, error) {
	if len(head) < shmSlot {
		return 0, fmt.Errorf("%w: descriptor of %d bytes", errBadFrame, len(head))
	}
	if head[35] != descMagic {
		return 0, fmt.Errorf("%w: descriptor magic %#x", errBadFrame, head[35])
	}
	if e := int(head[34]); e >= maxDescSlots {
		return 0, fmt.Errorf("%w: descriptor with %d continuation slots", errBadFrame, e)
	}
	return int(head[34]), nil
}

// decodeDesc parses and validates a descriptor the peer wrote into shared
// memory. b must be a private copy (the peer may scribble on the ring at
// any time) of exactly the slots the descriptor occupies. Every field that
// sizes a later copy is bounded here; segment ranges are bounded against
// the mapped arena by the link.
func decodeDesc(b []byte, d *desc) error {
	extra, err := descExtra(b)
	if err != nil {
		return err
	}
	if len(b) != (1+extra)*shmSlot {
		return fmt.Errorf("%w: descriptor of %d bytes with %d continuation slots", errBadFrame, len(b), extra)
	}
	d.kind = pktKind(b[0])
	d.flags = b[1]
	d.nak = b[2]
	d.nseg = int(b[3])
	d.psn = binary.LittleEndian.Uint32(b[4:])
	d.imm = binary.LittleEndian.Uint32(b[8:])
	d.key = transport.Key(binary.LittleEndian.Uint32(b[12:]))
	d.va = binary.LittleEndian.Uint64(b[16:])
	d.length = binary.LittleEndian.Uint32(b[24:])
	d.mapSeq = binary.LittleEndian.Uint32(b[28:])
	d.ninline = int(binary.LittleEndian.Uint16(b[32:]))
	switch {
	case d.nseg > maxSGE:
		return fmt.Errorf("%w: %d segments", errBadFrame, d.nseg)
	case d.ninline > maxInline:
		return fmt.Errorf("%w: %d inline bytes", errBadFrame, d.ninline)
	case d.ninline > 0 && d.nseg > 0:
		return fmt.Errorf("%w: inline data and segments", errBadFrame)
	case extra != descSlots(d.nseg, d.ninline)-1:
		return fmt.Errorf("%w: %d continuation slots for %d segments, %d inline bytes", errBadFrame, extra, d.nseg, d.ninline)
	case d.flags&^(pfImm|pfInv|pfSolicited|dfPlaced) != 0:
		return fmt.Errorf("%w: flags %#x", errBadFrame, d.flags)
	case (d.kind == pktSend || d.kind == pktWrite) && d.flags&dfPlaced != 0,
		d.kind == pktReadResp && d.flags&^dfPlaced != 0,
		d.kind != pktSend && d.kind != pktWrite && d.kind != pktReadResp && d.flags != 0:
		return fmt.Errorf("%w: flags %#x on %s", errBadFrame, d.flags, d.kind)
	case d.kind != pktNak && d.nak != 0:
		return fmt.Errorf("%w: NAK code %d on %s", errBadFrame, d.nak, d.kind)
	}
	// Unused bytes must be zero.
	used := 36
	if d.nseg > 0 {
		used = 56
	}
	if !zero(b[used:shmSlot]) {
		return fmt.Errorf("%w: reserved bytes of the head slot", errBadFrame)
	}
	var total uint64
	if d.ninline > 0 {
		if !zero(b[shmSlot+d.ninline:]) {
			return fmt.Errorf("%w: bytes after the inline data", errBadFrame)
		}
		copy(d.inline[:], b[shmSlot:shmSlot+d.ninline])
		total = uint64(d.ninline)
	} else {
		for i := 0; i < d.nseg; i++ {
			s := getSeg(b[segOffset(i):])
			if s.n == 0 || s.id == 0 {
				return fmt.Errorf("%w: segment %d names arena %d, %d bytes", errBadFrame, i, s.id, s.n)
			}
			d.segs[i] = s
			total += uint64(s.n)
		}
		for j := 1; j <= extra; j++ {
			cnt := min(segsPerSlot, d.nseg-1-(j-1)*segsPerSlot)
			if !zero(b[j*shmSlot+cnt*segLen : (j+1)*shmSlot]) {
				return fmt.Errorf("%w: reserved bytes of continuation slot %d", errBadFrame, j)
			}
		}
	}
	if total > maxMsgSize || d.length > maxMsgSize {
		return fmt.Errorf("%w: %s of %d bytes carrying %d (max %d)", errBadFrame, d.kind, d.length, total, maxMsgSize)
	}
	switch d.kind {
	case pktSend, pktWrite:
		if total != uint64(d.length) {
			return fmt.Errorf("%w: %s of %d bytes carrying %d", errBadFrame, d.kind, d.length, total)
		}
	case pktRead:
		// The segments are the requester's sinks.
		if d.ninline != 0 || total != uint64(d.length) || d.length > maxMsgSize {
			return fmt.Errorf("%w: READ of %d bytes into %d bytes of sinks", errBadFrame, d.length, total)
		}
	case pktReadResp:
		if d.flags&dfPlaced != 0 {
			if d.ninline != 0 || d.nseg != 0 || d.length > maxMsgSize {
				return fmt.Errorf("%w: placed READ response of %d bytes with data", errBadFrame, d.length)
			}
		} else if d.ninline != 0 || d.nseg > 1 || total != uint64(d.length) {
			return fmt.Errorf("%w: READ response of %d bytes in %d segments", errBadFrame, d.length, d.nseg)
		}
	case pktAck:
		if d.nseg != 0 || d.ninline != 0 || d.length != 0 {
			return fmt.Errorf("%w: ACK with data", errBadFrame)
		}
	case pktNak:
		if d.nseg != 0 || d.ninline != 0 || d.length != 0 || d.nak < nakRNR || d.nak > nakRemOp {
			return fmt.Errorf("%w: NAK code %d with data", errBadFrame, d.nak)
		}
	default:
		return fmt.Errorf("%w: kind %#x", errBadFrame, uint8(d.kind))
	}
	return nil
}

func zero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
