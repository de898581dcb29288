package scsi

import (
	"fmt"
	"slices"
)

// MaxLUN is the largest LUN the model encodes: flat space addressing
// (SAM-5 4.7.7) reaches 16383.
const MaxLUN = 0x3FFF

// EncodeLUN writes lun as an 8-byte single-level LUN (SAM-5 4.7):
// peripheral device addressing (method 00b) below 256, flat space
// addressing (method 01b) above. Linux's int_to_scsilun and
// scsilun_to_int carry either form through unchanged.
func EncodeLUN(lun uint16) [8]byte {
	var b [8]byte
	if lun < 256 {
		b[1] = byte(lun)
	} else {
		b[0], b[1] = 0x40|byte(lun>>8)&0x3F, byte(lun)
	}
	return b
}

// DecodeLUN reads an 8-byte LUN as EncodeLUN writes it. Other addressing
// methods, and levels below the first, are errors: the model's units are
// all at the first level.
func DecodeLUN(b [8]byte) (uint16, error) {
	for _, x := range b[2:] {
		if x != 0 {
			return 0, fmt.Errorf("scsi: LUN % x has a second level", b)
		}
	}
	switch b[0] >> 6 {
	case 0:
		if b[0] != 0 {
			return 0, fmt.Errorf("scsi: LUN % x names a bus", b)
		}
		return uint16(b[1]), nil
	case 1:
		return uint16(b[0]&0x3F)<<8 | uint16(b[1]), nil
	}
	return 0, fmt.Errorf("scsi: LUN % x uses addressing method %d", b, b[0]>>6)
}

// reportLUNs: REPORT LUNS (SPC-4 6.33). CDB: byte 2 select report (0:
// logical units, 2: all, 1: well-known only, of which there are none);
// bytes 6-9 allocation length, at least 16. Data: the list length (u32),
// 4 reserved bytes, then 8 bytes per LUN, in increasing order.
func reportLUNs(cdb []byte, luns []uint16) Action {
	alloc := be.Uint32(cdb[6:])
	sel := cdb[2]
	if alloc < 16 || (sel != 0 && sel != 1 && sel != 2) {
		return check(SenseInvalidField)
	}
	var list []uint16
	if sel != 1 {
		list = slices.Clone(luns)
		slices.Sort(list)
		list = slices.Compact(list)
		list = slices.DeleteFunc(list, func(l uint16) bool { return l > MaxLUN })
	}
	b := make([]byte, 8, 8+8*len(list))
	be.PutUint32(b, uint32(8*len(list)))
	for _, l := range list {
		e := EncodeLUN(l)
		b = append(b, e[:]...)
	}
	return data(b, int(min(alloc, 1<<20)))
}
