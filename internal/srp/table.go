package srp

import "fmt"

// Encode writes d's 16 bytes at b's start (struct srp_direct_buf) and
// returns 16; an initiator builds an indirect table in its memory with
// it.
func (d Descriptor) Encode(b []byte) (int, error) {
	if len(b) < DescriptorLen {
		return 0, fmt.Errorf("%w: descriptor needs %d bytes, have %d", ErrTooLarge, DescriptorLen, len(b))
	}
	putDescriptor(b, d)
	return DescriptorLen, nil
}

// DecodeTable decodes an indirect descriptor table the target fetched
// from the initiator's memory by RDMA READ (the whole table, the
// DataBuffer's Table.Len bytes, when the SRP_CMD carried only part of
// it: SRP r16a 5.5.2) into dst, and returns how many descriptors it
// holds. The bytes are as hostile as the IU that pointed at them: the
// table must be whole descriptors, at most len(dst) of them, and their
// lengths must sum (without overflow) to total, the data length the
// SRP_CMD announced. Zero-length descriptors are allowed, as in an
// inline table: they describe nothing and move nothing.
func DecodeTable(b []byte, total uint32, dst []Descriptor) (int, error) {
	if len(b)%DescriptorLen != 0 {
		return 0, fmt.Errorf("%w: indirect table of %d bytes is not whole %d-byte descriptors", ErrMalformed, len(b), DescriptorLen)
	}
	n := len(b) / DescriptorLen
	if n > len(dst) {
		return 0, fmt.Errorf("%w: indirect table of %d descriptors (max %d)", ErrTooLarge, n, len(dst))
	}
	var sum uint64 // 2^32 descriptors of at most 2^32-1 bytes cannot overflow it
	for i := range n {
		dst[i] = getDescriptor(b[i*DescriptorLen:])
		sum += uint64(dst[i].Len)
	}
	if sum != uint64(total) {
		return 0, fmt.Errorf("%w: indirect table's descriptors sum to %d bytes, the command says %d", ErrMalformed, sum, total)
	}
	return n, nil
}
