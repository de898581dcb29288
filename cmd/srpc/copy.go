package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
)

type copyFlags struct {
	conn     connFlags
	offset   cli.SizeFlag
	length   cli.SizeFlag
	qd       int
	quiet    bool
	progress string
}

func (c *copyFlags) register(fs *flag.FlagSet, withLength bool) {
	c.conn.register(fs)
	c.conn.registerExclusive(fs)
	fs.Var(&c.offset, "offset", "start at byte `OFFSET` of the volume (a multiple of its block size; KiB, MiB… allowed)")
	if withLength {
		fs.Var(&c.length, "length", "copy `LENGTH` bytes (default: to the end of the volume)")
	}
	fs.IntVar(&c.qd, "qd", 32, "queue depth: `N` requests of up to 1 MiB in flight")
	fs.StringVar(&c.progress, "progress", "auto", "`WHEN` to report progress on stderr: auto (a bar on a terminal), "+
		"always (a line at every tenth, or GiB, when stderr is no terminal) or never; a summary line ends every copy")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress and no summary line")
}

// check validates the flags every copy takes.
func (c *copyFlags) check() error {
	if c.qd < 1 || c.qd > 1024 {
		return cli.Usagef("--qd %d: want 1..1024", c.qd)
	}
	if !slices.Contains(progressModes, c.progress) {
		return cli.Usagef("--progress %q: want auto, always or never", c.progress)
	}
	return nil
}

// summary prints the line that ends a copy, unless --quiet.
func (c *copyFlags) summary(format string, args ...any) {
	if !c.quiet {
		fmt.Fprintf(os.Stderr, "srpc: "+format+"\n", args...)
	}
}

// signalContext is cancelled by SIGINT or SIGTERM; a second signal exits.
func signalContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
			return
		}
		<-sigs
		fmt.Fprintln(os.Stderr, "srpc: interrupted again: exiting at once")
		os.Exit(1)
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

// closeCopy closes a copy's volume and then its session. Interrupted
// (ctx done), only the session: the volume's close would wait through a
// reconnect to a target that is down for up to the I/O timeout, and the
// connections' end releases the target's handles anyway.
func closeCopy(ctx context.Context, s *session, v copyVolume) {
	if ctx.Err() == nil {
		v.Close()
	}
	s.Close()
}

// pipeline keeps up to qd requests of one volume in flight, each with its
// own registered buffer.
type pipeline struct {
	vol  copyVolume
	reqs []*initiator.Request
	done chan *initiator.Request
}

func newPipeline(s *session, v copyVolume, qd int) (*pipeline, int, error) {
	chunk := min(s.maxTransfer(), 1<<20) / v.BlockSize() * v.BlockSize()
	if chunk <= 0 {
		return nil, 0, fmt.Errorf("target's max transfer %d is below the block size %d", s.maxTransfer(), v.BlockSize())
	}
	p := &pipeline{vol: v, done: make(chan *initiator.Request, qd)}
	for range qd {
		buf, err := s.allocBuffer(chunk)
		if err != nil {
			buf = make([]byte, chunk) // bounce-buffered
		}
		p.reqs = append(p.reqs, &initiator.Request{Buf: buf, Done: p.done})
	}
	return p, chunk, nil
}

func openVolume(ctx context.Context, s *session, name string, ro, exclusive bool) (*initiator.Volume, error) {
	v, err := s.Open(ctx, name, initiator.OpenOptions{ReadOnly: ro, Exclusive: exclusive})
	if err != nil {
		if errors.Is(err, initiator.ErrReadOnly) {
			return nil, fmt.Errorf("volume %q is read-only for this initiator", name)
		}
		if errors.Is(err, initiator.ErrReservationConflict) {
			return nil, reservedError(name, err)
		}
		if err := openTimedOut(name, "the target", err); err != nil {
			return nil, err
		}
		if !errors.Is(err, initiator.ErrAccessDenied) && !offered(ctx, s, name) {
			return nil, s.noVolume(name)
		}
		return nil, fmt.Errorf("cannot open volume %q: %v (srpc list shows what you may open)", name, ioError(err))
	}
	return v, nil
}

// openTimedOut says, in one line, that name did not open within
// --timeout, if that is what err says: the target (who) answered NOT
// READY until then, or has not answered (it waits up to its OpenWait
// for its store before it says NOT READY). Otherwise it returns nil.
func openTimedOut(name, who string, err error) error {
	switch {
	case errors.Is(err, initiator.ErrNotReady):
		return fmt.Errorf("volume %q did not open within --timeout: still being opened by %s (can the target reach its store?)", name, who)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("volume %q did not open within --timeout: no answer from %s (can the target reach its store?)", name, who)
	}
	return nil
}

// offered reports whether the target lists name for this session; when
// the list cannot be had, it says yes, and the open's own error is told.
func offered(ctx context.Context, s *session, name string) bool {
	vols, err := s.Volumes(ctx)
	return err != nil || slices.ContainsFunc(vols, func(v initiator.VolumeInfo) bool { return v.Name == name })
}

func importCommand() *cli.Command {
	var cf copyFlags
	return &cli.Command{
		Name: "import", Args: "VOLUME FILE|-", Short: "copy a file or stdin into a volume",
		Long: `Copy FILE (or stdin for -) into VOLUME at --offset, with up to --qd writes
in flight, then flush: when srpc exits 0 the data is durable on the target.
If the target restarts meanwhile and loses writes it had acknowledged but
not flushed, they are replayed from --replay-buffer; with none, srpc
exits 1.
A file whose size is not a multiple of the block size has its last block
completed with the volume's existing bytes.`,
		SetFlags: func(fs *flag.FlagSet) {
			cf.register(fs, false)
			cf.conn.registerReplay(fs)
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 2, 2, "VOLUME FILE|-"); err != nil {
				return err
			}
			if err := cf.check(); err != nil {
				return err
			}
			var in io.Reader = os.Stdin
			total := int64(-1)
			if args[1] == "-" {
				// stdin redirected from a file has a size to check up front.
				if st, err := os.Stdin.Stat(); err == nil && st.Mode().IsRegular() {
					if pos, err := os.Stdin.Seek(0, io.SeekCurrent); err == nil {
						total = st.Size() - pos
					}
				}
			} else {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
					total = st.Size()
				}
				in = f
			}
			ctx, stop := signalContext(ctx)
			defer stop()
			s, v, err := cf.conn.openCopy(ctx, args[0], false, cf.qd, cf.qd<<20)
			if err != nil {
				return err
			}
			defer closeCopy(ctx, s, v)
			off := cf.offset.N
			if off%int64(v.BlockSize()) != 0 || off > v.Size() {
				return cli.Usagef("--offset %d must be a multiple of the block size %d and inside the volume (%d bytes)", off, v.BlockSize(), v.Size())
			}
			if total >= 0 && off+total > v.Size() {
				src := args[1]
				if src == "-" {
					src = "stdin"
				}
				return fmt.Errorf("%s (%d bytes) does not fit in %s at offset %d (%d bytes); nothing was written", src, total, v.Name(), off, v.Size())
			}
			start := time.Now()
			n, err := importData(ctx, s, v, in, off, total, &cf)
			if err != nil {
				return err
			}
			cf.summary("imported %s into %s in %s (%s/s), flushed", cli.FormatSize(n), v.Name(),
				time.Since(start).Round(time.Millisecond), cli.FormatSize(int64(float64(n)/max(time.Since(start).Seconds(), 1e-3))))
			return nil
		},
	}
}

func importData(ctx context.Context, s *session, v copyVolume, in io.Reader, off, total int64, cf *copyFlags) (int64, error) {
	p, chunk, err := newPipeline(s, v, cf.qd)
	if err != nil {
		return 0, err
	}
	bar := newProgress(cf.progress, cf.quiet, os.Stderr, total, "import "+v.Name())
	free := append([]*initiator.Request(nil), p.reqs...)
	inflight := 0
	var firstErr error
	// reap takes one completion; false once the caller was interrupted
	// (SIGINT, SIGTERM): what is in flight is then given up, and the
	// deferred Close fails it, rather than waited for through a
	// reconnect to a target that is down, which lasts up to --timeout.
	reap := func() bool {
		var r *initiator.Request
		select {
		case r = <-p.done:
		case <-ctx.Done():
			return false
		}
		inflight--
		if r.Err != nil && firstErr == nil {
			firstErr = fmt.Errorf("write of %d bytes at %d: %v", len(r.Buf), r.Offset, volumeError(v.Name(), r.Err))
		}
		if r.Err == nil {
			bar.Add(len(r.Buf))
		}
		r.Buf = r.Buf[:cap(r.Buf)]
		free = append(free, r)
		return true
	}
	drain := func() {
		for inflight > 0 && reap() {
		}
	}
	pos := off
	var tail []byte
	for firstErr == nil {
		if ctx.Err() != nil {
			firstErr = fmt.Errorf("interrupted after %d bytes", pos-off)
			break
		}
		if len(free) == 0 {
			reap()
			continue // interrupted: the check above says so
		}
		r := free[len(free)-1]
		buf := r.Buf[:chunk]
		n, rerr := io.ReadFull(in, buf)
		if n > 0 {
			if pos+int64(n) > v.Size() {
				firstErr = fmt.Errorf("the input does not fit in %s (%d bytes) past offset %d: srpc wrote the first %d bytes of it, unflushed, and stopped",
					v.Name(), v.Size(), off, pos-off)
				break
			}
			if n%v.BlockSize() != 0 {
				tail = append([]byte(nil), buf[:n]...)
			} else {
				free = free[:len(free)-1]
				r.Op, r.Buf, r.Offset, r.FUA = initiator.OpWrite, buf[:n], pos, false
				if err := v.Submit(r); err != nil {
					free = append(free, r)
					firstErr = ioError(err)
					break
				}
				inflight++
				pos += int64(n)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			firstErr = fmt.Errorf("read input: %w", rerr)
			break
		}
	}
	drain()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("interrupted after %d bytes", pos-off)
	}
	if firstErr != nil {
		return pos - off, firstErr
	}
	if tail != nil {
		// The partial last block: read-modify-write keeps the rest of the block.
		if _, err := v.WriteAtContext(ctx, tail, pos); err != nil {
			return pos - off, fmt.Errorf("write of the last %d bytes at %d: %v", len(tail), pos, ioError(err))
		}
		pos += int64(len(tail))
		bar.Add(len(tail))
	}
	if err := v.Flush(ctx); err != nil {
		if errors.Is(err, initiator.ErrWriteCacheLost) {
			return pos - off, fmt.Errorf("flush: %v", ioError(err))
		}
		return pos - off, fmt.Errorf("flush: %v (the data may not be durable)", ioError(err))
	}
	bar.Finish()
	return pos - off, nil
}

func exportCommand() *cli.Command {
	var cf copyFlags
	return &cli.Command{
		Name: "export", Args: "VOLUME FILE|-", Short: "copy a volume (or a range of it) to a file or stdout",
		Long: `Copy VOLUME from --offset for --length bytes (default: to the end) to FILE,
or to stdout for -, with up to --qd reads in flight. FILE is created or
truncated. Snapshots export as VOLUME@SNAPSHOT.`,
		SetFlags: func(fs *flag.FlagSet) { cf.register(fs, true) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 2, 2, "VOLUME FILE|-"); err != nil {
				return err
			}
			if err := cf.check(); err != nil {
				return err
			}
			ctx, stop := signalContext(ctx)
			defer stop()
			s, v, err := cf.conn.openCopy(ctx, args[0], true, cf.qd, cf.qd<<20)
			if err != nil {
				return err
			}
			defer closeCopy(ctx, s, v)
			off, length := cf.offset.N, cf.length.N
			if off%int64(v.BlockSize()) != 0 || off > v.Size() {
				return cli.Usagef("--offset %d must be a multiple of the block size %d and inside the volume (%d bytes)", off, v.BlockSize(), v.Size())
			}
			if cf.length.Given && length <= 0 {
				return cli.Usagef("--length %d: want a length above 0, or no --length to export to the end", length)
			}
			if length == 0 {
				length = v.Size() - off
			}
			if off+length > v.Size() {
				return cli.Usagef("--offset %d --length %d reaches past the end of %s (%d bytes)", off, length, v.Name(), v.Size())
			}
			var out io.Writer = os.Stdout
			var f *os.File
			if args[1] != "-" {
				if f, err = os.Create(args[1]); err != nil {
					return err
				}
				defer f.Close()
				out = f
			}
			start := time.Now()
			if err := exportData(ctx, s, v, out, off, length, &cf); err != nil {
				return err
			}
			if f != nil {
				if err := f.Close(); err != nil {
					return err
				}
			}
			cf.summary("exported %s from %s in %s", cli.FormatSize(length), v.Name(), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}

func exportData(ctx context.Context, s *session, v copyVolume, out io.Writer, off, length int64, cf *copyFlags) error {
	p, chunk, err := newPipeline(s, v, cf.qd)
	if err != nil {
		return err
	}
	bar := newProgress(cf.progress, cf.quiet, os.Stderr, length, "export "+v.Name())
	bs := int64(v.BlockSize())
	end := off + length
	next := off // next offset to submit
	// want[i] is how many bytes of request i's buffer go to the output.
	want := make([]int, len(p.reqs))
	dones := make([]chan *initiator.Request, len(p.reqs))
	submit := func(i int) error {
		r := p.reqs[i]
		n := min(int64(chunk), end-next)
		aligned := (n + bs - 1) / bs * bs
		r.Op, r.Buf, r.Offset = initiator.OpRead, r.Buf[:aligned], next
		want[i] = int(n)
		next += n
		return v.Submit(r)
	}
	for i, r := range p.reqs {
		dones[i] = make(chan *initiator.Request, 1)
		r.Done = dones[i]
	}
	inflight := 0
	var firstErr error
	for i := 0; i < len(p.reqs) && next < end; i++ {
		if err := submit(i); err != nil {
			return ioError(err)
		}
		inflight++
	}
	for i := 0; inflight > 0; i = (i + 1) % len(p.reqs) {
		var r *initiator.Request
		select {
		case r = <-dones[i]:
		case <-ctx.Done():
			// Interrupted: what is in flight is given up (the
			// deferred Close fails it), not waited for through a
			// reconnect that may last --timeout.
			if firstErr == nil {
				firstErr = fmt.Errorf("interrupted at offset %d", p.reqs[i].Offset)
			}
			return firstErr
		}
		inflight--
		if firstErr == nil {
			switch {
			case r.Err != nil:
				firstErr = fmt.Errorf("read of %d bytes at %d: %v", len(r.Buf), r.Offset, volumeError(v.Name(), r.Err))
			case ctx.Err() != nil:
				firstErr = fmt.Errorf("interrupted at offset %d", r.Offset)
			default:
				if _, err := out.Write(r.Buf[:want[i]]); err != nil {
					firstErr = fmt.Errorf("write output: %w", err)
				} else {
					bar.Add(want[i])
				}
			}
		}
		if firstErr == nil && next < end {
			if err := submit(i); err != nil {
				firstErr = ioError(err)
			} else {
				inflight++
			}
		}
	}
	if firstErr != nil {
		return firstErr
	}
	bar.Finish()
	return nil
}
