package transport

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the page size arenas are aligned to and fast registrations
// are built from.
var PageSize = os.Getpagesize()

// ArenaOptions select how an arena's memory is obtained.
type ArenaOptions struct {
	// HugePages asks for MAP_HUGETLB memory; if the system has none, NewArena
	// fails rather than silently using small pages.
	HugePages bool
	// Shared requires the arena to be backed by a memfd, so that another
	// process can map the same pages; NewArena fails if it cannot create
	// one, and FD returns the descriptor. Without Shared, an arena is still
	// memfd-backed whenever the kernel allows it (so that a software NIC's
	// shared-memory wire can hand any registered memory to a peer process,
	// see MemFD), except a HugePages arena, which keeps an anonymous
	// MAP_HUGETLB mapping; FD then reports -1 as before.
	Shared bool
	// Name labels the memfd (visible in /proc/PID/fd); informational.
	Name string
}

// Arena is a page-aligned block of memory outside the Go heap that devices
// may read and write at any time. Registering memory (PD.RegMR, fast
// registration) always names an arena, never an ordinary Go slice, because
// the garbage collector may move or reuse heap memory a device still
// addresses.
type Arena struct {
	mem    []byte
	fd     int // memfd, or -1
	shared bool
	id     uint64
	closed bool
}

// arenaIDs numbers arenas; IDs are never reused within a process.
var arenaIDs atomic.Uint64

var arenas struct {
	mu   sync.RWMutex
	live []*Arena // sorted by base address
}

// NewArena maps size bytes (rounded up to the page size) of zeroed memory.
func NewArena(size int, opts ArenaOptions) (*Arena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("transport: arena of %d bytes: %w", size, ErrInvalidArgument)
	}
	size = (size + PageSize - 1) &^ (PageSize - 1)
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	fd := -1
	if opts.Shared || !opts.HugePages {
		var err error
		fd, err = newMemfd(opts, size)
		switch {
		case err == nil:
			flags = unix.MAP_SHARED
		case opts.Shared:
			return nil, err
		default:
			fd = -1 // no memfd here (seccomp, old kernel): private memory
		}
	} else {
		flags |= unix.MAP_HUGETLB
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("transport: mmap arena of %d bytes: %w", size, err)
	}
	a := &Arena{mem: mem, fd: fd, shared: opts.Shared, id: arenaIDs.Add(1)}
	arenas.mu.Lock()
	i := sort.Search(len(arenas.live), func(i int) bool { return arenas.live[i].Addr() > a.Addr() })
	arenas.live = append(arenas.live, nil)
	copy(arenas.live[i+1:], arenas.live[i:])
	arenas.live[i] = a
	arenas.mu.Unlock()
	return a, nil
}

// newMemfd creates a memfd of size bytes sealed against shrinking and
// growing, so that a peer that maps it can trust its size (a shrunk memfd
// would fault the peer with SIGBUS). Sealing is best effort: a peer that
// requires the seals checks them itself.
func newMemfd(opts ArenaOptions, size int) (int, error) {
	name := opts.Name
	if name == "" {
		name = "gosrp-arena"
	}
	mfdFlags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if opts.HugePages {
		mfdFlags |= unix.MFD_HUGETLB
	}
	fd, err := unix.MemfdCreate(name, mfdFlags)
	if err != nil {
		return -1, fmt.Errorf("transport: arena memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("transport: arena memfd size %d: %w", size, err)
	}
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	return fd, nil
}

// ID is a number that identifies the arena within this process; IDs are
// never reused. A software NIC uses it to name the arena to a peer process
// that has mapped it.
func (a *Arena) ID() uint64 { return a.id }

// Bytes is the arena's memory. It is valid until Close.
func (a *Arena) Bytes() []byte { return a.mem }

// Len is the arena's size in bytes, a multiple of PageSize.
func (a *Arena) Len() int { return len(a.mem) }

// Addr is the virtual address of the arena's first byte, the address a
// device and a local SGE use for it.
func (a *Arena) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))) }

// FD is the memfd behind a Shared arena, or -1.
func (a *Arena) FD() int {
	if !a.shared {
		return -1
	}
	return a.fd
}

// MemFD is the memfd behind the arena whether or not it was created
// Shared, or -1 if it has none (a HugePages arena without Shared, a kernel
// without memfd) or is closed. The memfd is sealed against shrinking and
// growing. The arena owns the descriptor: a caller that keeps it beyond
// Close must dup it.
func (a *Arena) MemFD() int { return a.fd }

// Slice returns the arena bytes [off, off+n), or an error if the range is
// not inside the arena.
func (a *Arena) Slice(off, n int) ([]byte, error) {
	if off < 0 || n < 0 || off > len(a.mem) || n > len(a.mem)-off {
		return nil, fmt.Errorf("transport: arena range [%d,+%d) outside %d bytes: %w", off, n, len(a.mem), ErrInvalidArgument)
	}
	return a.mem[off : off+n : off+n], nil
}

// Close unmaps the arena. The caller must first deregister every MR over
// it; a provider that still addresses the memory afterwards would fault.
func (a *Arena) Close() error {
	arenas.mu.Lock()
	if a.closed {
		arenas.mu.Unlock()
		return nil
	}
	a.closed = true
	for i, x := range arenas.live {
		if x == a {
			arenas.live = append(arenas.live[:i], arenas.live[i+1:]...)
			break
		}
	}
	arenas.mu.Unlock()
	err := unix.Munmap(a.mem)
	a.mem = nil
	if a.fd >= 0 {
		unix.Close(a.fd)
		a.fd = -1
	}
	if err != nil {
		return fmt.Errorf("transport: munmap arena: %w", err)
	}
	return nil
}

// LookupArena returns the live arena containing [addr, addr+n) and the
// offset of addr in it. Software providers use it to turn a virtual address
// from a work request into memory they may touch, refusing anything that is
// not arena memory.
func LookupArena(addr uint64, n uint64) (*Arena, int, bool) {
	arenas.mu.RLock()
	defer arenas.mu.RUnlock()
	live := arenas.live
	i := sort.Search(len(live), func(i int) bool { return live[i].Addr() > addr }) - 1
	if i < 0 {
		return nil, 0, false
	}
	a := live[i]
	off := addr - a.Addr()
	if off > uint64(len(a.mem)) || n > uint64(len(a.mem))-off {
		return nil, 0, false
	}
	return a, int(off), true
}
