package scsi

// lastLBA is the unit's last logical block address (0 for an empty unit,
// which has none: READ CAPACITY cannot say so).
func (d *Device) lastLBA() uint64 {
	if d.Blocks == 0 {
		return 0
	}
	return d.Blocks - 1
}

// readCapacity10: READ CAPACITY(10) (SBC-3 5.16). CDB: bytes 2-5 LBA,
// byte 8 bit 0 PMI (obsolete; with PMI zero the LBA must be zero). Data,
// 8 bytes: the last LBA (0xFFFFFFFF when it does not fit, telling the
// initiator to ask READ CAPACITY(16)), the block length.
func (d *Device) readCapacity10(cdb []byte) Action {
	if cdb[8]&1 == 0 && be.Uint32(cdb[2:]) != 0 {
		return check(SenseInvalidField)
	}
	b := make([]byte, 8)
	last := d.lastLBA()
	if last > 0xFFFFFFFF {
		last = 0xFFFFFFFF
	}
	be.PutUint32(b, uint32(last))
	be.PutUint32(b[4:], d.BlockSize)
	return data(b, len(b))
}

// readCapacity16: READ CAPACITY(16) (SBC-3 5.16), SERVICE ACTION IN(16)
// with service action 0x10. CDB: bytes 10-13 allocation length. Data, 32
// bytes:
//
//	0  last LBA (u64)
//	8  logical block length (u32)
//	12 P_TYPE, PROT_EN: 0, no protection information
//	13 logical blocks per physical block exponent: 0
//	14 LBPME (bit 7): the unit deallocates; LBPRZ (bit 6): deallocated
//	   blocks read as zeros
func (d *Device) readCapacity16(cdb []byte) Action {
	b := make([]byte, 32)
	be.PutUint64(b, d.lastLBA())
	be.PutUint32(b[8:], d.BlockSize)
	if d.Discard {
		b[14] = 0x80
		if d.DiscardZeroes {
			b[14] |= 0x40
		}
	}
	return data(b, int(be.Uint32(cdb[10:])))
}
