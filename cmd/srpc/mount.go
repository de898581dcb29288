package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/fusedisk"
)

// mountVolume is what mount uses of a volume: an *initiator.Volume, or
// an *initiator.MultipathVolume when several --target paths were given.
type mountVolume interface {
	copyVolume
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
	Discard(ctx context.Context, off, n int64) error
	WriteZeroes(ctx context.Context, off, n int64) error
	ReadOnly() bool
}

// fuseVolume adapts a mountVolume to fusedisk.Device.
type fuseVolume struct{ v mountVolume }

func (f fuseVolume) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.v.ReadAtContext(ctx, p, off)
}
func (f fuseVolume) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.v.WriteAtContext(ctx, p, off)
}
func (f fuseVolume) Flush(ctx context.Context) error { return f.v.Flush(ctx) }
func (f fuseVolume) Discard(ctx context.Context, off, n int64) error {
	return f.v.Discard(ctx, off, n)
}
func (f fuseVolume) WriteZeroes(ctx context.Context, off, n int64) error {
	return f.v.WriteZeroes(ctx, off, n)
}
func (f fuseVolume) Size() int64    { return f.v.Size() }
func (f fuseVolume) BlockSize() int { return f.v.BlockSize() }
func (f fuseVolume) ReadOnly() bool { return f.v.ReadOnly() }

const mountLong = `Mount VOLUME as a FUSE file system at DIR holding one file, DIR/disk, the
size of the volume, with direct I/O. Make it a block device with loop:

    srpc mount vol0 /mnt/vol0 &
    dev=$(losetup --direct-io=on -f --show /mnt/vol0/disk)
    mkfs.ext4 $dev && mkdir -p /mnt/fs && mount $dev /mnt/fs
    ...
    umount /mnt/fs && losetup -d $dev && kill %1   # in this order

DIR/disk is used as a block device is: dd if=img of=DIR/disk bs=1M
conv=fsync writes an image over the start of the volume (O_TRUNC is
ignored, the size never changes), and truncate is refused.
fsync on DIR/disk flushes the volume; discard (fallocate PUNCH_HOLE) and
write-zeroes (ZERO_RANGE) reach the target as DISCARD and WRITE_ZEROES.
srpc stays in the foreground; SIGTERM or SIGINT unmounts and flushes (it
retries while a loop device still holds DIR/disk, and waits up to
--timeout for the flush while the target is unreachable; a second signal
exits at once). Needs root (or fusermount3). If srpc is killed, clean up with
'umount -l DIR'.`

func mountCommand() *cli.Command {
	var cf serveFlags
	var debug bool
	return &cli.Command{
		Name: "mount", Args: "VOLUME DIR", Short: "mount a volume as DIR/disk through FUSE (for losetup)",
		Long: mountLong,
		SetFlags: func(fs *flag.FlagSet) {
			cf.register(fs, "open the volume read-only")
			fs.BoolVar(&debug, "fuse-debug", false, "log every FUSE request")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 2, 2, "VOLUME DIR"); err != nil {
				return err
			}
			if err := cf.check(); err != nil {
				return err
			}
			dir := args[1]
			if err := mountPoint(dir); err != nil {
				return err
			}
			s, v, err := cf.openCopy(ctx, args[0], cf.ro, cf.qd, 0)
			if err != nil {
				return err
			}
			defer s.Close()
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			srv, err := fusedisk.Mount(dir, fuseVolume{v}, fusedisk.Options{FsName: "srpc:" + v.Name(), Debug: debug, Logger: log})
			if err != nil {
				v.Close()
				return err
			}
			disk := filepath.Join(dir, fusedisk.FileName)
			fmt.Fprintf(os.Stderr, "srpc: mounted %s (%s) at %s; SIGTERM or Ctrl-C unmounts\n", v.Name(), cli.FormatSize(v.Size()), disk)

			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			served := make(chan struct{})
			go func() { srv.Wait(); close(served) }()
			select {
			case <-served: // unmounted from outside (umount DIR)
			case <-sigs:
				unmount(func() error { return unmountDir(dir, srv.Unmount) }, dir, disk, sigs, served)
			}
			<-served
			if err := finalFlush(v, cf.timeout, sigs); err != nil {
				return fmt.Errorf("unmounted %s, but %w", dir, err)
			}
			fmt.Fprintf(os.Stderr, "srpc: unmounted %s; %s flushed\n", dir, v.Name())
			return nil
		},
	}
}

// finalFlush flushes v once the mount is gone, for up to timeout: with
// the target down that is the reconnect's wait, so after a second it says
// what it waits for, and a signal then stops the wait. Interrupted, v is
// not closed (its close would wait for the same target); the session's
// end releases it.
func finalFlush(v mountVolume, timeout time.Duration, sigs <-chan os.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var interrupted atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-sigs:
			interrupted.Store(true)
			cancel()
		case <-stop:
		}
	}()
	slow := time.AfterFunc(time.Second, func() {
		fmt.Fprintf(os.Stderr, "srpc: flushing %s before exiting, for up to %s (a second signal stops waiting)\n", v.Name(), timeout)
	})
	err := v.Flush(ctx)
	slow.Stop()
	close(stop)
	<-done
	switch {
	case err == nil:
		v.Close()
		return nil
	case interrupted.Load():
		return fmt.Errorf("the final flush of %s was interrupted: what was written since its last flush may not be on the target", v.Name())
	}
	v.Close()
	return fmt.Errorf("the final flush failed: %v", ioError(err))
}

// mountPoint checks that dir can be mounted on, naming what is wrong: a
// FUSE mount whose srpc was killed answers stat with ENOTCONN.
func mountPoint(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return fmt.Errorf("mount point %s is a stale FUSE mount (its srpc was killed): clean it up with 'umount -l' first", dir)
	case err != nil:
		return fmt.Errorf("mount point: %w", err)
	case !st.IsDir():
		return fmt.Errorf("mount point %s is not a directory", dir)
	}
	return nil
}

// unmountDir unmounts dir with umount(2) where this process may
// (root), so that a busy mount is reported as EBUSY; otherwise, or on any
// other failure, fallback (go-fuse's, through fusermount) tries. Without
// this, root on a host with no fusermount saw the failed lookup of
// fusermount instead of "busy".
func unmountDir(dir string, fallback func() error) error {
	err := unix.Unmount(dir, 0)
	if err == nil || errors.Is(err, unix.EBUSY) {
		return err
	}
	return fallback()
}

// unmount retries while the mount is busy (a loop device or an open file
// still holds DIR/disk); a second signal exits at once.
func unmount(do func() error, dir, disk string, sigs <-chan os.Signal, served <-chan struct{}) {
	warned := false
	for {
		err := do()
		if err == nil {
			return
		}
		if !warned {
			fmt.Fprintf(os.Stderr, "srpc: %s is busy (%v): detach its loop device first (losetup -j %s; losetup -d /dev/loopN); retrying, a second signal exits at once\n",
				dir, cli.OneLine(err), disk)
			warned = true
		}
		select {
		case <-served:
			return
		case <-sigs:
			fmt.Fprintf(os.Stderr, "srpc: exiting without unmounting %s (clean up with: umount -l %s)\n", dir, dir)
			os.Exit(cli.ExitFailure)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
