package initiator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/gosrp/gosrp/internal/wire"
)

// Volume is an open remote volume. ReadAt and WriteAt take any offset and
// length; the Context variants bound the wait; Submit is the asynchronous,
// allocation-free form for aligned I/O. It is safe for concurrent use.
type Volume struct {
	s        *Session
	name     string
	size     atomic.Int64 // changed by capacity notices (resized)
	onResize func(size int64)
	bs       int
	readOnly bool
	// exclusive: opened with OpenOptions.Exclusive (and re-opened so).
	exclusive bool
	// standby: the target answered the last open standby (a gateway
	// that does not serve the volume now; wire.PathState), or said so
	// since in a path notice; onPath hears of the notices.
	standby atomic.Bool
	onPath  func(standby bool)
	caps    uint32
	lun     uint16     // the LUN of a ProtocolSRP session's volume
	rmw     sync.Mutex // serializes read-modify-write of partial blocks
	closed  bool
	dur     durability // Session.dmu
	// ident is what the first open said tells the volume from any other
	// of its name (nil until then: a reconnect may re-open the volume
	// before Open has its first answer); replaced is set once a re-open
	// found another (ErrVolumeReplaced), gone with it once an SRP
	// re-login found no unit at the LUN at all (srp_identity.go).
	ident    atomic.Pointer[volIdentity]
	replaced atomic.Bool
	gone     atomic.Bool
}

// Standby reports whether the target answered the volume's open (or its
// latest re-open) as a standby gateway, or told since, in a path notice
// or by refusing an I/O with ErrStandby, that it became one: its I/O
// fails with ErrStandby until an open with OpenOptions.Takeover makes it
// active. A target without gateways is always active. Over ProtocolSRP
// it is the state of the LUN's ALUA target port group at the open
// (REPORT TARGET PORT GROUPS), or standby since a command was answered
// TARGET PORT IN STANDBY (or UNAVAILABLE) STATE; SRP has no path
// notices.
func (v *Volume) Standby() bool { return v.standby.Load() }

// pathNoticed takes a path notice (wire.PathNotice): the volume is now
// standby, or active, at this target.
func (v *Volume) pathNoticed(standby bool) {
	v.standby.Store(standby)
	if v.onPath != nil {
		v.onPath(standby)
	}
}

// Name is the volume's name on the target.
func (v *Volume) Name() string { return v.name }

// Size is the volume's size in bytes. It follows a resize on the target
// while the volume is open: the target tells each connection in the next
// response on the volume (or at a reconnect), and Size changes then
// (see OpenOptions.OnResize).
func (v *Volume) Size() int64 { return v.size.Load() }

// Refresh asks the target for the volume's size now (a LIST control
// request) and returns it; Size and OnResize follow as with a capacity
// notice. A session learns of a resize with its next command on the
// volume anyway: Refresh is for the rare moment that cannot wait for one,
// such as an idle volume about to be offered to a new client at its
// current size.
func (v *Volume) Refresh(ctx context.Context) (int64, error) {
	vols, err := v.s.Volumes(ctx)
	if err != nil {
		return v.Size(), fmt.Errorf("initiator: refresh the size of %q: %w", v.name, err)
	}
	for _, x := range vols {
		if x.Name == v.name {
			if x.Size <= 0 {
				return v.Size(), fmt.Errorf("initiator: target lists %q with %d bytes: %w", v.name, x.Size, ErrProtocol)
			}
			v.resized(x.Size)
			return x.Size, nil
		}
	}
	return v.Size(), fmt.Errorf("initiator: refresh the size of %q: the target no longer lists it: %w", v.name, ErrInvalid)
}

// resized records the size the target reports, and calls OnResize if it
// changed (not when Open is still learning it). The channels of a
// session each learn it; the first one changes it.
func (v *Volume) resized(n int64) {
	if old := v.size.Swap(n); old != n && old != 0 && v.onResize != nil {
		v.onResize(n)
	}
}

// noticed takes the new size from a capacity notice in the response to a
// request on v, and returns the request's error: one refused as out of
// range because the volume shrank under it says so, rather than only
// "target: out of range".
func (v *Volume) noticed(n int64, err error) error {
	old := v.Size()
	v.resized(n)
	var ioe *IOError
	if errors.As(err, &ioe) && ioe.Sense == SenseOutOfRange {
		return fmt.Errorf("initiator: volume %q was resized from %d to %d bytes while the request was on its way: %w", v.name, old, n, err)
	}
	return err
}

// BlockSize is the volume's block size in bytes.
func (v *Volume) BlockSize() int { return v.bs }

// ReadOnly reports whether the volume was opened (or is) read-only.
func (v *Volume) ReadOnly() bool { return v.readOnly }

var reqPool = sync.Pool{New: func() any {
	ch := make(chan *Request, 1)
	return &Request{sync: ch, Done: ch}
}}

// Submit starts an asynchronous request; it is sent on r.Done (or passed
// to r.OnDone) when it completes. r.Buf belongs to the request until then:
// the target may read or write it (or its bounce copy) at any moment
// before the completion, never after. Offsets and lengths must be block
// aligned and a transfer at most MaxTransfer bytes. With a replay buffer,
// a write's completion may wait while the session flushes to make room
// in it.
func (v *Volume) Submit(r *Request) error {
	if err := v.check(r.Op, r.Offset, r.length()); err != nil {
		return err
	}
	if (r.Op == OpRead || r.Op == OpWrite) && len(r.Buf) > v.s.MaxTransfer() {
		return fmt.Errorf("initiator: %d-byte transfer, max %d: %w", len(r.Buf), v.s.MaxTransfer(), ErrInvalid)
	}
	r.vol = v
	r.Err = nil
	v.markFlush(r)
	r.state.Store(reqPending)
	return v.s.pick().submit(r)
}

func (v *Volume) check(op Op, off, n int64) error {
	bs, size := int64(v.bs), v.Size()
	switch {
	case v.closed:
		return fmt.Errorf("initiator: volume %q: %w", v.name, ErrClosed)
	case v.replaced.Load():
		return v.replacedErr()
	case op == OpFlush:
		return nil
	case op != OpRead && v.readOnly:
		return fmt.Errorf("initiator: %s on %q: %w", op, v.name, ErrReadOnly)
	case n <= 0 || off < 0 || off%bs != 0 || n%bs != 0:
		return fmt.Errorf("initiator: %s of %d bytes at %d on %q (block size %d): %w", op, n, off, v.name, bs, ErrInvalid)
	case off > size || n > size-off:
		return fmt.Errorf("initiator: %s of %d bytes at %d beyond the end of %q (%d bytes): %w", op, n, off, v.name, size, ErrInvalid)
	}
	return nil
}

// do runs an aligned operation, split into commands of at most
// MaxTransfer bytes (1 GiB for DISCARD and WRITE_ZEROES) that run in
// parallel across credits and channels.
func (v *Volume) do(ctx context.Context, op Op, buf []byte, off, n int64, fua bool) error {
	if err := v.check(op, off, n); err != nil {
		return err
	}
	chunk := int64(v.s.MaxTransfer())
	if op == OpDiscard || op == OpWriteZeroes {
		chunk = 1 << 30
	}
	if op == OpFlush {
		chunk, n = 1, 1
	}
	var inline [8]*Request
	reqs := inline[:0]
	var err error
	for done := int64(0); done < n; done += chunk {
		k := min(chunk, n-done)
		r := reqPool.Get().(*Request)
		r.Op, r.Offset, r.FUA, r.Buf, r.Length = op, off+done, fua, nil, 0
		switch op {
		case OpRead, OpWrite:
			r.Buf = buf[done : done+k]
		case OpDiscard, OpWriteZeroes:
			r.Length = k
		}
		r.vol = v
		v.markFlush(r)
		r.state.Store(reqPending)
		if err = v.s.pick().submit(r); err != nil {
			reqPool.Put(r)
			break
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		select {
		case <-r.sync:
		case <-ctx.Done():
			if v.s.abandon(r) {
				err = ctx.Err()
				continue
			}
			<-r.sync // claimed by the poller, or the buffer itself is registered
		}
		if r.Err != nil && err == nil {
			err = r.Err
		}
		reqPool.Put(r)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("initiator: %s of %d bytes at %d on %q: %w", op, n, off, v.name, ctx.Err())
	}
	return err
}

// ReadAt reads len(p) bytes at off; see ReadAtContext.
func (v *Volume) ReadAt(p []byte, off int64) (int, error) {
	return v.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext reads len(p) bytes at off, any alignment. Like
// io.ReaderAt it returns io.EOF with fewer bytes at the end of the volume.
// Once it returns, with an error from ctx too, nothing writes into p any
// more: a cancelled read of a bounced buffer is dropped, one of a
// Session.AllocBuffer buffer (which the target writes in place) waits
// until the key is dead.
func (v *Volume) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("initiator: read at %d: %w", off, ErrInvalid)
	}
	size := v.Size()
	if off >= size {
		return 0, io.EOF
	}
	n := int64(len(p))
	var eof error
	if n > size-off {
		n, eof = size-off, io.EOF
	}
	if n == 0 {
		return 0, eof
	}
	bs := int64(v.bs)
	start, end := off&^(bs-1), (off+n+bs-1)&^(bs-1)
	if start == off && end == off+n {
		if err := v.do(ctx, OpRead, p[:n], off, n, false); err != nil {
			return 0, err
		}
		return int(n), eof
	}
	tmp := make([]byte, end-start)
	if err := v.do(ctx, OpRead, tmp, start, end-start, false); err != nil {
		return 0, err
	}
	copy(p, tmp[off-start:off-start+n])
	return int(n), eof
}

// WriteAt writes p at off; see WriteAtContext.
func (v *Volume) WriteAt(p []byte, off int64) (int, error) {
	return v.writeAt(context.Background(), p, off, false)
}

// WriteAtContext writes p at off, any alignment: partial blocks are read,
// merged and written back. Once it returns, with an error from ctx too,
// nothing reads p any more: a write is abandoned only before or after its
// data was copied out, never during, and one of a Session.AllocBuffer
// buffer (which the target reads in place) waits until the key is dead.
func (v *Volume) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return v.writeAt(ctx, p, off, false)
}

// WriteAtFUA writes p at off and returns only when the data is durable on
// the target (Force Unit Access). Like Flush, it fails with
// ErrWriteCacheLost, once per loss, after a target restart lost earlier
// writes.
func (v *Volume) WriteAtFUA(ctx context.Context, p []byte, off int64) (int, error) {
	return v.writeAt(ctx, p, off, true)
}

func (v *Volume) writeAt(ctx context.Context, p []byte, off int64, fua bool) (int, error) {
	n := int64(len(p))
	if n == 0 {
		return 0, nil
	}
	if size := v.Size(); off < 0 || off > size || n > size-off {
		return 0, fmt.Errorf("initiator: write of %d bytes at %d beyond the end of %q (%d bytes): %w", n, off, v.name, size, ErrInvalid)
	}
	bs := int64(v.bs)
	start, end := off&^(bs-1), (off+n+bs-1)&^(bs-1)
	if start == off && end == off+n {
		if err := v.do(ctx, OpWrite, p, off, n, fua); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	v.rmw.Lock()
	defer v.rmw.Unlock()
	tmp := make([]byte, end-start)
	if off != start {
		if err := v.do(ctx, OpRead, tmp[:bs], start, bs, false); err != nil {
			return 0, err
		}
	}
	if (off+n)%bs != 0 && (end-bs != start || off == start) {
		if err := v.do(ctx, OpRead, tmp[len(tmp)-int(bs):], end-bs, bs, false); err != nil {
			return 0, err
		}
	}
	copy(tmp[off-start:], p)
	if err := v.do(ctx, OpWrite, tmp, start, end-start, fua); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush makes every write that has completed durable on the target. It
// fails with ErrWriteCacheLost, once per loss, if the target restarted
// and lost writes that had completed since the last successful Flush
// (see the package doc).
func (v *Volume) Flush(ctx context.Context) error {
	return v.do(ctx, OpFlush, nil, 0, 0, false)
}

// Discard tells the target the range's contents are no longer needed;
// later reads return zeros. Offset and length must be block aligned.
func (v *Volume) Discard(ctx context.Context, off, n int64) error {
	return v.do(ctx, OpDiscard, nil, off, n, false)
}

// WriteZeroes zeroes the range without sending zeros over the wire.
func (v *Volume) WriteZeroes(ctx context.Context, off, n int64) error {
	return v.do(ctx, OpWriteZeroes, nil, off, n, false)
}

// Close closes the volume on the target.
func (v *Volume) Close() error {
	s := v.s
	s.mu.Lock()
	if v.closed {
		s.mu.Unlock()
		return nil
	}
	v.closed = true
	delete(s.vols, v)
	s.mu.Unlock()
	v.forget()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.IOTimeout)
	defer cancel()
	var first error
	for _, c := range s.chans {
		r := &Request{Op: opControl, ctrl: &wire.ControlRequest{Op: wire.ControlClose}, vol: v}
		if _, err := s.controlReq(ctx, c, r); err != nil && first == nil {
			first = err
		}
	}
	return first
}
