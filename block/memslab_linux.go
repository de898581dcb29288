package block

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapChunk maps chunkBytes of private anonymous memory aligned to
// chunkBytes, the alignment a huge page needs: it maps twice the size and
// unmaps the unaligned ends. Pages are committed as blocks are written.
func mapChunk() ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, 2*chunkBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("block: map a %d-byte chunk: %w: %w", chunkBytes, ErrNoSpace, err)
	}
	lead := (chunkBytes - uintptr(p)%chunkBytes) % chunkBytes
	if lead > 0 {
		unix.MunmapPtr(p, lead)
	}
	if tail := chunkBytes - lead; tail > 0 {
		unix.MunmapPtr(unsafe.Add(p, lead+chunkBytes), tail)
	}
	return unsafe.Slice((*byte)(unsafe.Add(p, lead)), chunkBytes), nil
}

func unmapChunk(b []byte) { unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b))) }

// dropPages gives the whole pages of b back to the kernel; they read as
// zeros afterwards. It is advice: a failure leaves the memory committed.
func dropPages(b []byte) {
	const page = 4096
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (base + page - 1) &^ (page - 1)
	hi := (base + uintptr(len(b))) &^ (page - 1)
	if hi > lo {
		unix.Madvise(b[lo-base:hi-base], unix.MADV_DONTNEED)
	}
}

// collapse asks for a full chunk to be backed by one huge page now
// (MADV_COLLAPSE, Linux 6.1) rather than when khugepaged gets to it, and
// marks the range eligible (MADV_HUGEPAGE) for the THP "madvise" mode.
// Both are advice; older kernels refuse them and nothing changes.
func collapse(b []byte) {
	unix.Madvise(b, unix.MADV_HUGEPAGE)
	unix.Madvise(b, unix.MADV_COLLAPSE)
}
