package scsi

// inRange reports whether blocks blocks at lba lie within the unit.
func (d *Device) inRange(lba, blocks uint64) bool {
	return lba <= d.Blocks && blocks <= d.Blocks-lba
}

// readWrite: READ(10), READ(16), WRITE(10), WRITE(16) (SBC-3 5.11-5.12,
// 5.29-5.30). CDB: byte 1 RDPROTECT/WRPROTECT (7:5), DPO (bit 4), FUA
// (bit 3); then the LBA (bytes 2-5, or 2-9) and the transfer length in
// blocks (bytes 7-8, or 10-13), zero meaning nothing to transfer.
//
// Checks, in order: protection information requested (the unit has none:
// INVALID FIELD IN CDB), a write to a write-protected unit (DATA
// PROTECT), a transfer longer than VPD 0xB0's maximum (INVALID FIELD IN
// CDB), blocks past the end (LBA OUT OF RANGE). FUA only matters for
// writes: reads are always of the durable-or-newer data.
func (d *Device) readWrite(n *Nexus, cdb []byte) Action {
	write := cdb[0] == opWrite10 || cdb[0] == opWrite16
	var lba uint64
	var blocks uint32
	if cdb[0] == opRead10 || cdb[0] == opWrite10 {
		lba, blocks = uint64(be.Uint32(cdb[2:])), uint32(be.Uint16(cdb[7:]))
	} else {
		lba, blocks = be.Uint64(cdb[2:]), be.Uint32(cdb[10:])
	}
	fua := cdb[1]&0x08 != 0
	switch {
	case cdb[1]&0xe0 != 0:
		return check(SenseInvalidField)
	case write && d.ReadOnly:
		return check(SenseWriteProtected)
	case blocks > d.maxTransfer():
		return check(SenseInvalidField)
	case !d.inRange(lba, uint64(blocks)):
		return check(SenseLBAOutOfRange)
	case blocks == 0:
		return good()
	case !write:
		return Action{Status: StatusGood, Op: OpRead, LBA: lba, Blocks: blocks}
	case fua && n.takeLostFUA():
		return check(SenseCacheLost)
	}
	return Action{Status: StatusGood, Op: OpWrite, LBA: lba, Blocks: blocks, FUA: fua, DataOut: blocks * d.BlockSize}
}

// syncCache: SYNCHRONIZE CACHE(10) and (16) (SBC-3 5.22-5.23). CDB: LBA
// (bytes 2-5, or 2-9) and number of blocks (bytes 7-8, or 10-13; zero:
// to the end). The whole volume is flushed whatever the range (flushing
// more is allowed); the range is still checked. IMMED is ignored: the
// answer waits for the flush, which is allowed too.
func (d *Device) syncCache(n *Nexus, cdb []byte) Action {
	var lba, blocks uint64
	if cdb[0] == opSyncCache10 {
		lba, blocks = uint64(be.Uint32(cdb[2:])), uint64(be.Uint16(cdb[7:]))
	} else {
		lba, blocks = be.Uint64(cdb[2:]), uint64(be.Uint32(cdb[10:]))
	}
	switch {
	case lba >= d.Blocks && !(lba == 0 && blocks == 0):
		return check(SenseLBAOutOfRange)
	case !d.inRange(lba, blocks):
		return check(SenseLBAOutOfRange)
	case n.takeLostFlush():
		return check(SenseCacheLost)
	}
	return Action{Status: StatusGood, Op: OpFlush}
}

// writeSame: WRITE SAME(10) and (16) (SBC-3 5.41-5.42). CDB: byte 1
// WRPROTECT (7:5), ANCHOR (bit 4), UNMAP (bit 3), NDOB (bit 0, (16)
// only: no data-out buffer, the block is zeros); LBA and number of
// blocks as WRITE. Zero blocks is refused (VPD 0xB0 WSNZ), as are
// anchoring and protection information, and more than the maximum
// write same length. UNMAP on a unit that does not deallocate is
// ignored: the blocks are written (SBC-3 allows it).
func (d *Device) writeSame(cdb []byte) Action {
	var lba uint64
	var blocks uint32
	noData := false
	if cdb[0] == opWriteSame10 {
		lba, blocks = uint64(be.Uint32(cdb[2:])), uint32(be.Uint16(cdb[7:]))
	} else {
		lba, blocks = be.Uint64(cdb[2:]), be.Uint32(cdb[10:])
		noData = cdb[1]&0x01 != 0
	}
	switch {
	case cdb[1]&0xf0 != 0 || (cdb[0] == opWriteSame10 && cdb[1]&0x01 != 0):
		return check(SenseInvalidField)
	case d.ReadOnly:
		return check(SenseWriteProtected)
	case blocks == 0 || blocks > d.maxWriteSame():
		return check(SenseInvalidField)
	case !d.inRange(lba, uint64(blocks)):
		return check(SenseLBAOutOfRange)
	}
	a := Action{Status: StatusGood, Op: OpWriteSame, LBA: lba, Blocks: blocks,
		Unmap: cdb[1]&0x08 != 0 && d.Discard, NoData: noData}
	if !noData {
		a.DataOut = d.BlockSize
	}
	return a
}

// UnmapHeaderLen and UnmapDescriptorLen are the UNMAP parameter list's
// parts (SBC-3 5.28.2).
const (
	UnmapHeaderLen     = 8
	UnmapDescriptorLen = 16
)

// unmap: UNMAP (SBC-3 5.28), offered only when the unit deallocates.
// CDB: byte 1 bit 0 ANCHOR (refused); bytes 7-8 parameter list length.
// A zero length is no error and does nothing; one below 8 is a
// PARAMETER LIST LENGTH ERROR. Otherwise the target fetches the list and
// hands it to Unmap.
func (d *Device) unmap(cdb []byte) Action {
	n := be.Uint16(cdb[7:])
	switch {
	case !d.Discard:
		return check(SenseInvalidOpcode)
	case cdb[1]&0x01 != 0:
		return check(SenseInvalidField)
	case d.ReadOnly:
		return check(SenseWriteProtected)
	case n == 0:
		return good()
	case n < UnmapHeaderLen:
		return check(SenseParamListLength)
	}
	return Action{Status: StatusGood, Op: OpUnmap, DataOut: uint32(n)}
}

// Extent is a run of blocks to deallocate.
type Extent struct {
	LBA    uint64
	Blocks uint32
}

// Unmap decodes an UNMAP parameter list (SBC-3 5.28.2) that the target
// fetched for an OpUnmap Action, appending its extents to dst (give it
// capacity for the device's maximum descriptors and nothing allocates).
// It answers GOOD, or CHECK CONDITION with nothing to do.
//
//	0  unmap data length (u16, the bytes after it)
//	2  unmap block descriptor data length (u16)
//	4  reserved [4]
//	8  descriptors, 16 bytes each: LBA u64, number of blocks u32,
//	   reserved [4]
//
// Lengths that claim more than arrived are cut to what arrived; a
// partial last descriptor is ignored (SBC-3). More descriptors or blocks
// than VPD 0xB0 allows are INVALID FIELD IN PARAMETER LIST, a block past
// the end LBA OUT OF RANGE; descriptors of zero blocks are skipped.
func (d *Device) Unmap(params []byte, dst []Extent) ([]Extent, Action) {
	if len(params) < UnmapHeaderLen {
		return dst, check(SenseParamListLength)
	}
	list := params[UnmapHeaderLen:]
	if n := int(be.Uint16(params[2:])); n < len(list) {
		list = list[:n]
	}
	count := len(list) / UnmapDescriptorLen
	if uint64(count) > uint64(d.maxUnmapDescriptors()) {
		return dst, check(SenseInvalidParam)
	}
	start := len(dst)
	var total uint64
	for i := 0; i < count; i++ {
		x := list[i*UnmapDescriptorLen:]
		e := Extent{LBA: be.Uint64(x), Blocks: be.Uint32(x[8:])}
		if e.Blocks == 0 {
			continue
		}
		total += uint64(e.Blocks)
		switch {
		case total > uint64(d.maxUnmapBlocks()):
			return dst[:start], check(SenseInvalidParam)
		case !d.inRange(e.LBA, uint64(e.Blocks)):
			return dst[:start], check(SenseLBAOutOfRange)
		}
		dst = append(dst, e)
	}
	return dst, Action{Status: StatusGood, Op: OpUnmap}
}
