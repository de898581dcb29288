package transport

import (
	"fmt"
	"os"
	"sort"
	"sync"
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
	// Shared backs the arena with a memfd so that another process (the
	// shared-memory wire of the software NIC) can map the same pages. FD
	// returns the descriptor.
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
	fd     int
	closed bool
}

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
	if opts.Shared {
		name := opts.Name
		if name == "" {
			name = "gosrp-arena"
		}
		mfdFlags := unix.MFD_CLOEXEC
		if opts.HugePages {
			mfdFlags |= unix.MFD_HUGETLB
		}
		var err error
		fd, err = unix.MemfdCreate(name, mfdFlags)
		if err != nil {
			return nil, fmt.Errorf("transport: arena memfd: %w", err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("transport: arena memfd size %d: %w", size, err)
		}
		flags = unix.MAP_SHARED
	} else if opts.HugePages {
		flags |= unix.MAP_HUGETLB
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("transport: mmap arena of %d bytes: %w", size, err)
	}
	a := &Arena{mem: mem, fd: fd}
	arenas.mu.Lock()
	i := sort.Search(len(arenas.live), func(i int) bool { return arenas.live[i].Addr() > a.Addr() })
	arenas.live = append(arenas.live, nil)
	copy(arenas.live[i+1:], arenas.live[i:])
	arenas.live[i] = a
	arenas.mu.Unlock()
	return a, nil
}

// Bytes is the arena's memory. It is valid until Close.
func (a *Arena) Bytes() []byte { return a.mem }

// Len is the arena's size in bytes, a multiple of PageSize.
func (a *Arena) Len() int { return len(a.mem) }

// Addr is the virtual address of the arena's first byte, the address a
// device and a local SGE use for it.
func (a *Arena) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))) }

// FD is the memfd behind a Shared arena, or -1.
func (a *Arena) FD() int { return a.fd }

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
