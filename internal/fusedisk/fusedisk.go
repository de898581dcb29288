// Package fusedisk exposes a block device as a one-file FUSE file system:
// DIR/disk, the size of the device, opened with direct I/O, so that
//
//	losetup --direct-io=on -f --show DIR/disk
//
// turns it into a kernel block device that mkfs and mount work on. Reads
// and writes go straight to the device; fsync is Flush; fallocate
// PUNCH_HOLE|KEEP_SIZE is Discard and ZERO_RANGE|KEEP_SIZE is WriteZeroes,
// which is what the loop driver sends for discard and write-zeroes.
//
// Pitfalls: the process serving the mount must never touch the file system it
// serves (a FUSE server that does deadlocks on its own request); detach the
// loop device before unmounting (the unmount fails with EBUSY while the loop
// device holds DIR/disk); if the serving process dies, the mount stays as
// "Transport endpoint is not connected" until umount -l.
package fusedisk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FileName is the name of the one file in the mount.
const FileName = "disk"

// Device is the block device served. Offsets and lengths of ReadAt and
// WriteAt may be unaligned; Discard and WriteZeroes get block-aligned ranges.
type Device interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	Discard(ctx context.Context, off, n int64) error
	WriteZeroes(ctx context.Context, off, n int64) error
	Size() int64
	BlockSize() int
	ReadOnly() bool
}

// Options configure Mount.
type Options struct {
	// FsName is shown as the mount's source in /proc/mounts, e.g. "srpc:vol0".
	FsName string
	// Debug logs every FUSE request.
	Debug bool
	// Logger receives I/O errors. Default slog.Default().
	Logger *slog.Logger
}

// Linux fallocate(2) modes.
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

type root struct {
	fs.Inode
	disk *disk
}

var _ fs.NodeOnAdder = (*root)(nil)

func (r *root) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.disk, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild(FileName, ch, false)
}

type disk struct {
	fs.Inode
	dev   Device
	log   *slog.Logger
	errs  errLog
	mtime time.Time
}

var (
	_ fs.NodeGetattrer = (*disk)(nil)
	_ fs.NodeSetattrer = (*disk)(nil)
	_ fs.NodeOpener    = (*disk)(nil)
	_ fs.NodeReader    = (*disk)(nil)
	_ fs.NodeWriter    = (*disk)(nil)
	_ fs.NodeFsyncer   = (*disk)(nil)
	_ fs.NodeFlusher   = (*disk)(nil)
	_ fs.NodeAllocater = (*disk)(nil)
)

func (d *disk) fill(out *fuse.Attr) {
	size := d.dev.Size()
	out.Mode = syscall.S_IFREG | 0o600
	if d.dev.ReadOnly() {
		out.Mode = syscall.S_IFREG | 0o400
	}
	out.Nlink = 1
	out.Size = uint64(size)
	out.Blocks = uint64(size) / 512
	out.Blksize = uint32(d.dev.BlockSize())
	out.SetTimes(nil, &d.mtime, &d.mtime)
}

func (d *disk) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fill(&out.Attr)
	return 0
}

// Setattr refuses size changes (the volume's size is set on the target);
// other changes are accepted and ignored. An open with O_TRUNC does not
// come here: the mount asks for atomic O_TRUNC (Mount), and Open
// ignores it.
func (d *disk) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != d.dev.Size() {
		return syscall.EPERM
	}
	d.fill(&out.Attr)
	return 0
}

// Open opens DIR/disk with direct I/O. O_TRUNC is ignored, as a block
// device's open ignores it (open(2)): `dd if=img of=DIR/disk`, which
// opens with O_TRUNC unless told conv=notrunc, writes the image over
// the volume, and the rest of the volume stays as it was.
func (d *disk) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if d.dev.ReadOnly() && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (d *disk) errno(op string, off, n int64, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	if errors.Is(err, syscall.ENOSPC) {
		// The target is out of space (initiator.ErrNoSpace matches
		// ENOSPC): the file system above sees a full disk, not a bad one.
		d.log.Debug("fusedisk: target out of space", "op", op, "offset", off, "length", n, "err", err)
		return syscall.ENOSPC
	}
	d.errs.report(op, off, n, err)
	return syscall.EIO
}

func (d *disk) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	size := d.dev.Size()
	if off >= size || len(dest) == 0 {
		return fuse.ReadResultData(nil), 0
	}
	n := min(int64(len(dest)), size-off)
	if _, err := d.dev.ReadAt(ctx, dest[:n], off); err != nil {
		return nil, d.errno("read", off, n, err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (d *disk) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if d.dev.ReadOnly() {
		return 0, syscall.EROFS
	}
	n := int64(len(data))
	if off < 0 || off+n > d.dev.Size() {
		return 0, syscall.ENOSPC
	}
	if _, err := d.dev.WriteAt(ctx, data, off); err != nil {
		return 0, d.errno("write", off, n, err)
	}
	return uint32(n), 0
}

func (d *disk) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if d.dev.ReadOnly() {
		return 0
	}
	return d.errno("flush", 0, 0, d.dev.Flush(ctx))
}

// Flush is close(2); data is made durable by fsync, not by close.
func (d *disk) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno { return 0 }

func (d *disk) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	devSize := uint64(d.dev.Size())
	end := off + size
	if end < off {
		return syscall.EINVAL
	}
	switch {
	case mode == 0 || mode == fallocKeepSize:
		// Preallocation: every block of a volume already exists.
		if mode == 0 && end > devSize {
			return syscall.ENOSPC
		}
		return 0
	case mode == fallocPunchHole|fallocKeepSize, mode == fallocZeroRange|fallocKeepSize, mode == fallocZeroRange:
	default:
		return syscall.EOPNOTSUPP
	}
	if d.dev.ReadOnly() {
		return syscall.EROFS
	}
	if mode == fallocZeroRange && end > devSize {
		return syscall.ENOSPC
	}
	end = min(end, devSize)
	if off >= end {
		return 0
	}
	op := "discard"
	fn := d.dev.Discard
	if mode&fallocZeroRange != 0 {
		op, fn = "write-zeroes", d.dev.WriteZeroes
	}
	return d.errno(op, int64(off), int64(end-off), zeroRange(ctx, d.dev, int64(off), int64(end), fn))
}

// zeroRange runs fn on the block-aligned middle of [off, end) and writes
// zeros over the unaligned head and tail, so the whole range reads zeros.
func zeroRange(ctx context.Context, dev Device, off, end int64, fn func(ctx context.Context, off, n int64) error) error {
	bs := int64(dev.BlockSize())
	first, last := (off+bs-1)/bs*bs, end/bs*bs
	if first >= last {
		return writeZeros(ctx, dev, off, end)
	}
	if off < first {
		if err := writeZeros(ctx, dev, off, first); err != nil {
			return err
		}
	}
	if err := fn(ctx, first, last-first); err != nil {
		return err
	}
	if last < end {
		return writeZeros(ctx, dev, last, end)
	}
	return nil
}

func writeZeros(ctx context.Context, dev Device, off, end int64) error {
	if end <= off {
		return nil
	}
	_, err := dev.WriteAt(ctx, make([]byte, end-off), off)
	return err
}

// Mount mounts dev at dir and returns the running server: Unmount it
// (after detaching any loop device) and Wait for it to finish. Mounting
// needs root (mount(2) directly) or a fusermount3 helper on the PATH.
func Mount(dir string, dev Device, o Options) (*fuse.Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.FsName == "" {
		o.FsName = "fusedisk"
	}
	r := &root{disk: &disk{dev: dev, log: o.Logger, errs: errLog{log: o.Logger}, mtime: time.Now()}}
	sec := time.Second
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        o.FsName,
			Name:          "srpc",
			DirectMount:   true,
			MaxWrite:      1 << 20,
			MaxBackground: 64,
			DisableXAttrs: true,
			Debug:         o.Debug,
			// O_TRUNC reaches Open instead of a SETATTR of size 0 that
			// Setattr would have to refuse (EPERM, where a block
			// device's open succeeds).
			ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC,
		},
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
	}
	srv, err := fs.Mount(dir, r, opts)
	if err != nil {
		return nil, fmt.Errorf("fuse mount on %s: %w", dir, err)
	}
	return srv, nil
}
