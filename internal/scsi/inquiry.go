package scsi

import "fmt"

// VPD pages the unit offers, in the order VPD page 0x00 lists them.
var vpdPages = []byte{0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2}

// inquiry: INQUIRY (SPC-4 6.6). CDB: byte 1 bit 0 EVPD, bit 1 CMDDT
// (obsolete, must be zero); byte 2 page code (zero without EVPD); bytes
// 3-4 allocation length.
func (d *Device) inquiry(cdb []byte) Action {
	alloc := int(be.Uint16(cdb[3:]))
	evpd, page := cdb[1]&1 != 0, cdb[2]
	switch {
	case cdb[1]&0xfe != 0:
		return check(SenseInvalidField)
	case !evpd && page != 0:
		return check(SenseInvalidField)
	case !evpd:
		return data(d.standardInquiry(), alloc)
	}
	var b []byte
	switch page {
	case 0x00:
		b = vpd(page, vpdPages)
	case 0x80:
		b = vpd(page, []byte(d.serial()))
	case 0x83:
		b = vpd(page, d.designators())
	case 0xB0:
		b = vpd(page, d.blockLimits())
	case 0xB1:
		b = vpd(page, blockCharacteristics())
	case 0xB2:
		b = vpd(page, d.provisioning())
	default:
		return check(SenseInvalidField)
	}
	return data(b, alloc)
}

// vpd wraps a page's contents in its 4-byte header (SPC-4 7.8.1):
// peripheral qualifier and type (0: a direct access block device),
// page code, page length.
func vpd(page byte, body []byte) []byte {
	b := make([]byte, 4, 4+len(body))
	b[1] = page
	be.PutUint16(b[2:], uint16(len(body)))
	return append(b, body...)
}

// standardInquiry is the standard INQUIRY data (SPC-4 6.6.2), 36 bytes:
//
//	0  peripheral qualifier 0, device type 0 (direct access block)
//	1  RMB 0: not removable
//	2  version 6: SPC-4
//	3  HISUP (bit 4) 1: hierarchical LUNs; response data format 2
//	4  additional length 31
//	5  TPGS (bits 5:4) 11b with a PortGroup: implicit and explicit ALUA
//	7  CMDQUE (bit 1) 1: command queuing
//	8  T10 vendor identification [8]
//	16 product identification [16]
//	32 product revision level [4]
func (d *Device) standardInquiry() []byte {
	b := make([]byte, 36)
	b[2], b[3], b[4], b[7] = 0x06, 0x12, 31, 0x02
	if d.PortGroup != 0 {
		b[5] = tpgsBoth
	}
	pad(b[8:16], d.Vendor, "GOSRP")
	pad(b[16:32], d.Product, "srpd volume")
	pad(b[32:36], d.Revision, "0001")
	return b
}

// pad fills f with s (or def if s is empty), cut to fit and padded with
// spaces as SPC-4 4.3.1 wants ASCII fields; bytes outside printable ASCII
// become spaces.
func pad(f []byte, s, def string) {
	if s == "" {
		s = def
	}
	for i := range f {
		f[i] = ' '
		if i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
			f[i] = s[i]
		}
	}
}

// serial is the unit serial number (VPD 0x80, SPC-4 7.8.15).
func (d *Device) serial() string {
	if d.Serial != "" {
		b := []byte(d.Serial)
		pad(b, d.Serial, "")
		return string(b)
	}
	return fmt.Sprintf("%016x", d.ID)
}

// designators is the device identification page's body (VPD 0x83, SPC-4
// 7.8.6): an NAA designator and a T10 vendor ID one, both for the logical
// unit (association 00b), and its Incarnation as a vendor specific one
// (type 0h) when it has one; with a PortGroup, a relative target port and a
// target port group designator too (association 01b, the target port),
// which Linux's scsi_dh_alua needs to attach (scsi_vpd_tpg_id).
//
// The NAA is Locally Assigned (NAA 3h, SPC-4 7.8.6.6.5): gosrp owns no
// IEEE company ID, and the ID is unique only within the target's site,
// which is what that form says. Eight bytes: 3h in the top nibble, the
// low 60 bits of ID below.
func (d *Device) designators() []byte {
	b := []byte{
		0x01, // protocol identifier 0, code set 1: binary
		0x03, // PIV 0, association 00b (logical unit), designator type 3: NAA
		0x00,
		0x08, // designator length
	}
	b = be.AppendUint64(b, 3<<60|d.ID&(1<<60-1))
	t10 := make([]byte, 8, 8+len(d.serial()))
	pad(t10, d.Vendor, "GOSRP")
	t10 = append(t10, d.serial()...)
	t10 = t10[:min(len(t10), 255)] // the designator length is one byte
	b = append(b,
		0x02, // code set 2: ASCII
		0x01, // association 00b, designator type 1: T10 vendor ID
		0x00,
		byte(len(t10)), // designator length
	)
	b = append(b, t10...)
	if d.Incarnation != 0 {
		// Code set 1 (binary); association 00b, designator type 0h
		// (vendor specific, SPC-4 7.8.6.3): udev's scsi_id and
		// multipath rank it below NAA and T10 vendor ID, so the
		// disk's name does not change with it.
		b = append(b, 0x01, 0x00, 0x00, 0x08)
		b = be.AppendUint64(b, d.Incarnation)
	}
	if d.PortGroup != 0 {
		// Code set 1 (binary); association 01b, designator type 4h
		// (relative target port) and 5h (target port group); 4 bytes,
		// the number in the last two (SPC-4 7.8.6.7, 7.8.6.8).
		b = append(b, 0x01, 0x14, 0x00, 0x04, 0x00, 0x00)
		b = be.AppendUint16(b, d.PortGroup)
		b = append(b, 0x01, 0x15, 0x00, 0x04, 0x00, 0x00)
		b = be.AppendUint16(b, d.PortGroup)
	}
	return b
}

// blockLimits is the Block Limits page's body (VPD 0xB0, SBC-3 6.6.4),
// 60 bytes after the header:
//
//	4  WSNZ (bit 0) 1: WRITE SAME with zero blocks is refused
//	8  maximum transfer length (blocks)
//	20 maximum unmap LBA count
//	24 maximum unmap block descriptor count
//	28 optimal unmap granularity: 1 block
//	36 maximum write same length (u64)
func (d *Device) blockLimits() []byte {
	b := make([]byte, 60)
	b[0] = 0x01
	be.PutUint32(b[4:], d.maxTransfer())
	if d.Discard {
		be.PutUint32(b[16:], d.maxUnmapBlocks())
		be.PutUint32(b[20:], d.maxUnmapDescriptors())
		be.PutUint32(b[24:], 1)
	}
	be.PutUint64(b[32:], uint64(d.maxWriteSame()))
	return b
}

// blockCharacteristics is the Block Device Characteristics page's body
// (VPD 0xB1, SBC-3 6.6.2), 60 bytes: medium rotation rate 1, a
// non-rotating medium, so Linux treats the disk as an SSD (no
// add_random, no rotational scheduling).
func blockCharacteristics() []byte {
	b := make([]byte, 60)
	be.PutUint16(b[0:], 1)
	return b
}

// provisioning is the Logical Block Provisioning page's body (VPD 0xB2,
// SBC-3 6.6.5), 4 bytes:
//
//	5  LBPU (bit 7): UNMAP; LBPWS (bit 6): WRITE SAME(16) with UNMAP;
//	   LBPWS10 (bit 5): WRITE SAME(10) with UNMAP; LBPRZ (bit 2)
//	6  provisioning type (bits 2:0): 2 thin when the unit deallocates,
//	   0 full otherwise
func (d *Device) provisioning() []byte {
	b := make([]byte, 4)
	if d.Discard {
		b[1] = 0x80 | 0x40 | 0x20
		if d.DiscardZeroes {
			b[1] |= 0x04
		}
		b[2] = 0x02
	}
	return b
}
