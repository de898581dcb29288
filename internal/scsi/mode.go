package scsi

// Mode pages the unit reports.
const (
	pageCaching = 0x08
	pageControl = 0x0A
	pageAll     = 0x3F
)

// Page control values (MODE SENSE byte 2 bits 7:6, SPC-4 6.11.1).
// Current (0) and default (2) values are the same here.
const (
	pcChangeable = 1
	pcSaved      = 3
)

// modeSense: MODE SENSE(6) and (10) (SPC-4 6.11, 6.12). Nothing is
// changeable (there is no MODE SELECT), so the changeable values are all
// zeros, the defaults are the current values, and saved values are not
// supported.
//
// CDB(6): byte 1 bit 3 DBD; byte 2 PC (7:6), page code (5:0); byte 3
// subpage; byte 4 allocation length. CDB(10): byte 1 bit 4 LLBAA, bit 3
// DBD; bytes 2, 3 as (6); bytes 7-8 allocation length.
//
// The header's DEVICE-SPECIFIC PARAMETER (SBC-3 6.5.1) has WP (bit 7)
// for a read-only unit and DPOFUA (bit 4): the unit honours FUA, which
// is what makes Linux's sd send FUA writes.
func (d *Device) modeSense(cdb []byte) Action {
	ten := cdb[0] == opModeSense10
	dbd := cdb[1]&0x08 != 0
	llbaa := ten && cdb[1]&0x10 != 0
	pc, page, sub := cdb[2]>>6, cdb[2]&0x3f, cdb[3]
	alloc := int(cdb[4])
	if ten {
		alloc = int(be.Uint16(cdb[7:]))
	}
	if pc == pcSaved {
		return check(SenseSavingUnsupported)
	}
	var pages []byte
	switch {
	case page == pageCaching && sub == 0:
		pages = d.cachingPage(pc)
	case page == pageControl && sub == 0:
		pages = controlPage(pc)
	case page == pageAll && (sub == 0 || sub == 0xFF):
		pages = append(d.cachingPage(pc), controlPage(pc)...)
	default:
		return check(SenseInvalidField)
	}

	var desc []byte
	if !dbd {
		desc = d.blockDescriptor(llbaa)
	}
	devSpecific := byte(0x10)
	if d.ReadOnly {
		devSpecific |= 0x80
	}
	var b []byte
	if ten {
		// 0 mode data length (u16, excluding itself); 2 medium type;
		// 3 device-specific; 4 LONGLBA (bit 0); 6 block descriptor
		// length (u16).
		b = make([]byte, 8, 8+len(desc)+len(pages))
		b[3] = devSpecific
		if len(desc) == 16 {
			b[4] = 1
		}
		be.PutUint16(b[6:], uint16(len(desc)))
		b = append(append(b, desc...), pages...)
		be.PutUint16(b, uint16(len(b)-2))
	} else {
		// 0 mode data length (excluding itself); 1 medium type;
		// 2 device-specific; 3 block descriptor length.
		b = make([]byte, 4, 4+len(desc)+len(pages))
		b[2] = devSpecific
		b[3] = byte(len(desc))
		b = append(append(b, desc...), pages...)
		b[0] = byte(len(b) - 1)
	}
	return data(b, alloc)
}

// blockDescriptor is the mode parameter block descriptor (SBC-3 6.5.2):
// short (8 bytes: number of blocks u32, saturated; reserved; block
// length u24) or, when the initiator allows long LBAs, long (16 bytes:
// number of blocks u64; reserved [4]; block length u32).
func (d *Device) blockDescriptor(long bool) []byte {
	if long {
		b := make([]byte, 16)
		be.PutUint64(b, d.Blocks)
		be.PutUint32(b[12:], d.BlockSize)
		return b
	}
	b := make([]byte, 8)
	n := d.Blocks
	if n > 0xFFFFFFFF {
		n = 0xFFFFFFFF
	}
	be.PutUint32(b, uint32(n))
	be.PutUint32(b[4:], d.BlockSize&0xFFFFFF) // byte 4 reserved: the block length is 24 bits
	return b
}

// cachingPage is the Caching mode page (SBC-3 6.5.5), 20 bytes: WCE
// (byte 2 bit 2) says writes are cached, honestly: only if the volume
// acknowledges before durability. RCD (bit 0) stays zero.
func (d *Device) cachingPage(pc byte) []byte {
	b := make([]byte, 20)
	b[0], b[1] = pageCaching, 0x12
	if pc != pcChangeable && d.WriteCache {
		b[2] = 0x04
	}
	return b
}

// controlPage is the Control mode page (SPC-4 7.5.8), 12 bytes: TST 001b
// (byte 2 bits 7:5), a task set per I_T nexus, as SRP's task management
// keeps them; queue algorithm modifier 1 (byte 3 bits 7:4), unrestricted
// reordering of SIMPLE tasks; TAS (byte 5 bit 6), commands another I_T
// nexus aborts end with status TASK ABORTED (SAM-5 5.6); D_SENSE 0
// (fixed-format sense); everything else zero. None is changeable.
func controlPage(pc byte) []byte {
	b := make([]byte, 12)
	b[0], b[1] = pageControl, 0x0A
	if pc != pcChangeable {
		b[2], b[3], b[5] = 0x20, 0x10, 0x40
	}
	return b
}
