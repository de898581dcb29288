//go:build ceph && pacific

package block

// The image handle an rbd volume's requests run on, opened through
// librbd's C API: reads, writes, flushes and discards go through
// librbd's asynchronous calls, and the calls that need the image's
// exclusive lock (taking it, checking it, resizes, image metadata,
// snapshots) through the same handle, since the lock belongs to a
// handle, not to a client.
//
// Why not go-ceph's rbd.Image: it offers librbd's synchronous calls
// only, and a goroutine blocked in a C call keeps its P until the
// runtime takes it back, so on a small machine the goroutines that
// would carry the next requests queue behind calls waiting on the OSDs
// (docs/performance.md, "Through a Ceph gateway": 1.5-5.5 writes in
// flight at the OSD with 32 at the host). Here a request is a short C
// call; librbd calls a C function when it completes, which writes the
// request's slot and result to a pipe, and one goroutine per handle
// reads the pipe and wakes the waiting requests. No Go code runs on
// librbd's threads.

/*
#cgo LDFLAGS: -lrbd
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <rbd/librbd.h>

// A completion's argument packs the pipe's write end (high 32 bits)
// and the request's slot (low 32 bits): no Go pointer is kept by C.
static void gosrp_rbd_done(rbd_completion_t c, void *arg) {
	uint64_t v = (uint64_t)(uintptr_t)arg;
	int64_t rec[2];
	rec[0] = (int64_t)(uint32_t)v;
	rec[1] = (int64_t)rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	const char *p = (const char *)rec;
	size_t left = sizeof rec;
	while (left > 0) {
		// 16 bytes, under PIPE_BUF: one write, whole, unless a signal
		// interrupts it before it begins.
		ssize_t n = write((int)(v >> 32), p, left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		p += n;
		left -= (size_t)n;
	}
}

enum { gosrp_read, gosrp_write, gosrp_flush, gosrp_discard, gosrp_writesame };

static int gosrp_rbd_aio(rbd_image_t img, int op, uint64_t off, uint64_t len, char *buf, size_t data_len, uint64_t arg) {
	rbd_completion_t c;
	int r = rbd_aio_create_completion((void *)(uintptr_t)arg, gosrp_rbd_done, &c);
	if (r < 0)
		return r;
	switch (op) {
	case gosrp_read:
		r = rbd_aio_read(img, off, len, buf, c);
		break;
	case gosrp_write:
		r = rbd_aio_write(img, off, len, buf, c);
		break;
	case gosrp_flush:
		r = rbd_aio_flush(img, c);
		break;
	case gosrp_discard:
		r = rbd_aio_discard(img, off, len, c);
		break;
	default:
		r = rbd_aio_writesame(img, off, len, buf, data_len, c, 0);
	}
	if (r < 0)
		rbd_aio_release(c);
	return r;
}
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"golang.org/x/sys/unix"
)

// rbdIO is an image opened through librbd's C API. Its methods may be
// called concurrently; close must come after every other call returned.
type rbdIO struct {
	img C.rbd_image_t
	// wfd is the pipe's write end, librbd's completions' (C's alone);
	// r its read end, read by the reader goroutine until EOF.
	wfd  int
	r    *os.File
	done chan struct{} // closed when the reader returned

	mu    sync.Mutex
	slots []*aioReq // by slot number; nil: free
	free  []uint32
}

// aioReq is one request in flight: its result arrives on res, and its
// buffer stays pinned until then.
type aioReq struct {
	res chan int64
	pin runtime.Pinner
}

var aioReqs = sync.Pool{New: func() any { return &aioReq{res: make(chan int64, 1)} }}

// rbdErrno is librbd's negative errno as an error rbdErr understands.
type rbdErrno int

func (e rbdErrno) Error() string  { return fmt.Sprintf("librbd: %v", syscall.Errno(-e)) }
func (e rbdErrno) ErrorCode() int { return int(e) }

func rbdCall(r C.int) error {
	if r < 0 {
		return rbdErrno(r)
	}
	return nil
}

// openRBDIO opens image name (snap empty: the image itself) of ioctx's
// pool and namespace, read-only when snap is set.
func openRBDIO(ioctx *rados.IOContext, name, snap string) (*rbdIO, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var img C.rbd_image_t
	var r C.int
	if snap == "" {
		r = C.rbd_open(C.rados_ioctx_t(ioctx.Pointer()), cname, &img, nil)
	} else {
		csnap := C.CString(snap)
		defer C.free(unsafe.Pointer(csnap))
		r = C.rbd_open_read_only(C.rados_ioctx_t(ioctx.Pointer()), cname, &img, csnap)
	}
	if err := rbdCall(r); err != nil {
		return nil, err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		C.rbd_close(img)
		return nil, fmt.Errorf("completion pipe: %w", err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		C.rbd_close(img)
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, fmt.Errorf("completion pipe: %w", err)
	}
	x := &rbdIO{img: img, wfd: p[1], r: os.NewFile(uintptr(p[0]), "rbd completions"), done: make(chan struct{})}
	go x.read()
	return x, nil
}

// read hands each completion to its request until the pipe's write
// end closes (close, after librbd finished every request). A read of a
// pipe this process holds both ends of fails only once its read end is
// closed, which close does after this returns.
func (x *rbdIO) read() {
	defer close(x.done)
	var buf [64 * 16]byte
	have := 0
	for {
		n, err := x.r.Read(buf[have:])
		have += n
		i := 0
		for ; have-i >= 16; i += 16 {
			slot := int64(binary.NativeEndian.Uint64(buf[i:]))
			res := int64(binary.NativeEndian.Uint64(buf[i+8:]))
			x.mu.Lock()
			var q *aioReq
			if slot >= 0 && slot < int64(len(x.slots)) {
				q = x.slots[slot]
			}
			x.mu.Unlock()
			if q != nil {
				q.res <- res
			}
		}
		have = copy(buf[:], buf[i:have])
		if err != nil {
			return
		}
	}
}

// aio runs one asynchronous request and waits for its result (librbd's
// return value: a length, or a negative errno). buf, if any, stays
// pinned until then.
func (x *rbdIO) aio(op C.int, off, n uint64, buf []byte, dataLen int) (int64, error) {
	q := aioReqs.Get().(*aioReq)
	x.mu.Lock()
	var slot uint32
	if k := len(x.free); k > 0 {
		slot, x.free = x.free[k-1], x.free[:k-1]
		x.slots[slot] = q
	} else {
		slot = uint32(len(x.slots))
		x.slots = append(x.slots, q)
	}
	x.mu.Unlock()
	var p *C.char
	if len(buf) > 0 {
		q.pin.Pin(&buf[0])
		p = (*C.char)(unsafe.Pointer(&buf[0]))
	}
	arg := uint64(x.wfd)<<32 | uint64(slot)
	r := C.gosrp_rbd_aio(x.img, op, C.uint64_t(off), C.uint64_t(n), p, C.size_t(dataLen), C.uint64_t(arg))
	var res int64
	if r < 0 {
		res = int64(r)
	} else {
		res = <-q.res
	}
	q.pin.Unpin()
	x.mu.Lock()
	x.slots[slot] = nil
	x.free = append(x.free, slot)
	x.mu.Unlock()
	aioReqs.Put(q)
	if res < 0 {
		return 0, rbdErrno(res)
	}
	return res, nil
}

// ReadAt reads len(p) bytes at off.
func (x *rbdIO) ReadAt(p []byte, off int64) (int, error) {
	n, err := x.aio(C.gosrp_read, uint64(off), uint64(len(p)), p, 0)
	if err == nil && n != int64(len(p)) {
		err = fmt.Errorf("librbd read %d bytes of %d", n, len(p))
	}
	return int(n), err
}

// WriteAt writes p at off.
func (x *rbdIO) WriteAt(p []byte, off int64) (int, error) {
	if _, err := x.aio(C.gosrp_write, uint64(off), uint64(len(p)), p, 0); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush is rbd_aio_flush: every write completed before it is on the
// OSDs.
func (x *rbdIO) Flush() error {
	_, err := x.aio(C.gosrp_flush, 0, 0, nil, 0)
	return err
}

// Discard is rbd_aio_discard.
func (x *rbdIO) Discard(off, n uint64) error {
	_, err := x.aio(C.gosrp_discard, off, n, nil, 0)
	return err
}

// WriteSame is rbd_aio_writesame of data over n bytes at off.
func (x *rbdIO) WriteSame(off, n uint64, data []byte) error {
	_, err := x.aio(C.gosrp_writesame, off, n, data, len(data))
	return err
}

// GetSize is rbd_get_size.
func (x *rbdIO) GetSize() (uint64, error) {
	var n C.uint64_t
	err := rbdCall(C.rbd_get_size(x.img, &n))
	return uint64(n), err
}

// Resize is rbd_resize.
func (x *rbdIO) Resize(n uint64) error { return rbdCall(C.rbd_resize(x.img, C.uint64_t(n))) }

// SetMetadata is rbd_metadata_set.
func (x *rbdIO) SetMetadata(key, value string) error {
	ck, cv := C.CString(key), C.CString(value)
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	return rbdCall(C.rbd_metadata_set(x.img, ck, cv))
}

// CreateSnapshot is rbd_snap_create.
func (x *rbdIO) CreateSnapshot(name string) error {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	return rbdCall(C.rbd_snap_create(x.img, cn))
}

// LockAcquire is rbd_lock_acquire.
func (x *rbdIO) LockAcquire(mode rbd.LockMode) error {
	return rbdCall(C.rbd_lock_acquire(x.img, C.rbd_lock_mode_t(mode)))
}

// LockIsExclusiveOwner is rbd_is_exclusive_lock_owner.
func (x *rbdIO) LockIsExclusiveOwner() (bool, error) {
	var own C.int
	err := rbdCall(C.rbd_is_exclusive_lock_owner(x.img, &own))
	return own != 0, err
}

// LockGetOwners is rbd_lock_get_owners.
func (x *rbdIO) LockGetOwners() ([]*rbd.LockOwner, error) {
	var mode C.rbd_lock_mode_t
	owners := (**C.char)(C.calloc(8, C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	defer C.free(unsafe.Pointer(owners))
	max := C.size_t(8)
	r := C.rbd_lock_get_owners(x.img, &mode, owners, &max)
	if r == -C.ENOENT {
		return nil, nil // nobody holds it
	}
	if err := rbdCall(r); err != nil {
		return nil, err
	}
	defer C.rbd_lock_get_owners_cleanup(owners, max)
	var out []*rbd.LockOwner
	for _, o := range unsafe.Slice(owners, max) {
		out = append(out, &rbd.LockOwner{Mode: rbd.LockMode(mode), Owner: C.GoString(o)})
	}
	return out, nil
}

// LockBreak is rbd_lock_break.
func (x *rbdIO) LockBreak(mode rbd.LockMode, owner string) error {
	co := C.CString(owner)
	defer C.free(unsafe.Pointer(co))
	return rbdCall(C.rbd_lock_break(x.img, C.rbd_lock_mode_t(mode), co))
}

// close closes the image (librbd waits for its requests first), then
// the pipe, and waits for the reader.
func (x *rbdIO) close() error {
	err := rbdCall(C.rbd_close(x.img))
	unix.Close(x.wfd)
	<-x.done
	x.r.Close()
	return err
}
