package nbd

// The transmission phase: reading requests, checking them, running them
// on the backend.

import (
	"fmt"
	"io"
	"sync"
)

// op is one request on its way through the backend to the writer.
type op struct {
	c     *conn
	req   request
	errno uint32
	msg   string // why errno: the message of a structured error reply
	data  []byte // READ: the payload to send; WRITE: the payload received; BLOCK_STATUS: the chunk's payload
	buf   []byte // to give back to the pool (nil: none)
	held  int64  // bytes of budget held
}

// budget bounds the payload bytes a connection holds.
type budget struct {
	mu    sync.Mutex
	cond  sync.Cond
	used  int64
	limit int64
}

func (b *budget) acquire(n int64) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (c *conn) getBuf(n int) []byte {
	if c.pool != nil {
		return c.pool.GetBuffer(n)
	}
	return make([]byte, n)
}

func (c *conn) transmit() {
	c.b = c.s.Export.Backend
	c.pool, _ = c.b.(BufferPool)
	c.async, _ = c.b.(AsyncBackend)
	c.size = uint64(c.b.Size())
	c.bs = uint64(c.b.BlockSize())
	c.readOnly = c.b.ReadOnly()
	c.replies = make(chan *op, c.s.MaxInFlight+1)
	c.slots = make(chan struct{}, c.s.MaxInFlight)
	c.budget.limit = c.s.MaxBuffered
	c.budget.cond.L = &c.budget.mu
	wdone := make(chan struct{})
	go func() { c.writer(); close(wdone) }()

	reason, err := c.reader()
	c.inflight.Wait()
	close(c.replies)
	<-wdone
	if werr := c.werr.Load(); werr != nil && err == nil && reason == "" {
		err = *werr
	}
	switch {
	case reason != "":
		c.log.Debug("nbd: connection done", "reason", reason)
	case c.stopping.Load():
		c.log.Debug("nbd: connection closed: server shutting down")
	case err == nil || isEOF(err):
		c.log.Debug("nbd: client disconnected without NBD_CMD_DISC", "err", err)
	default:
		c.log.Warn("nbd: closing connection", "reason", err)
	}
}

// reader reads requests and starts them; it returns why it stopped.
func (c *conn) reader() (string, error) {
	var hdr [requestLen]byte
	for {
		if c.stopping.Load() {
			return "server shutting down", nil
		}
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			if c.stopping.Load() {
				return "server shutting down", nil
			}
			return "", err
		}
		r, err := decodeRequest(hdr[:])
		if err != nil {
			return "", err
		}
		c.s.stats.Requests.Add(1)
		if r.Type == CmdDisc {
			return "client sent NBD_CMD_DISC", nil
		}
		o := &op{c: c, req: r}
		if r.Type == CmdWrite {
			if r.Length > uint32(c.s.MaxPayload) {
				return "", fmt.Errorf("%w: WRITE of %d bytes, above the advertised maximum %d", errProtocol, r.Length, c.s.MaxPayload)
			}
			if errno, msg := c.check(r); errno != 0 {
				if _, err := c.br.Discard(int(r.Length)); err != nil {
					return "", err
				}
				o.msg = msg
				c.finish(o, errno)
				continue
			}
			o.held = int64(r.Length)
			c.budget.acquire(o.held)
			o.buf = c.getBuf(int(r.Length))
			o.data = o.buf
			if _, err := io.ReadFull(c.br, o.data); err != nil {
				c.putBuf(o)
				return "", err
			}
		} else if errno, msg := c.check(r); errno != 0 {
			o.msg = msg
			c.finish(o, errno)
			continue
		} else if r.Type == CmdRead && r.Length > 0 {
			o.held = int64(r.Length)
			c.budget.acquire(o.held)
			o.buf = c.getBuf(int(r.Length))
			o.data = o.buf
		} else if r.Type == CmdBlockStatus {
			// Its reply is built later, but counts against the same
			// budget as payloads: at most maxStatusPayload bytes.
			o.held = maxStatusPayload
			c.budget.acquire(o.held)
		}
		c.slots <- struct{}{}
		c.inflight.Add(1)
		if c.async != nil && (r.Type == CmdRead || r.Type == CmdWrite) && r.Length > 0 &&
			c.async.StartIO(o.data, int64(r.Offset), r.Type == CmdWrite, r.Flags&CmdFlagFUA != 0, o) {
			continue
		}
		go c.exec(o)
	}
}

// check validates a request and returns the errno to fail it with, and
// why (for the message of a structured error reply).
func (c *conn) check(r request) (uint32, string) {
	allowed := CmdFlagFUA
	switch r.Type {
	case CmdRead:
		if c.structured {
			allowed |= CmdFlagDF // one chunk per READ: never fragmented
		}
	case CmdFlush:
	case CmdWrite, CmdTrim:
		if c.readOnly {
			return EPERM, "the export is read-only"
		}
	case CmdWriteZeroes:
		if c.readOnly {
			return EPERM, "the export is read-only"
		}
		allowed |= CmdFlagNoHole
	case CmdCache:
		// proto.md, NBD_CMD_CACHE: a server that advertises it MUST
		// reject the command flags it does not know, and it knows none.
		allowed = 0
	case CmdBlockStatus:
		if !c.metaAlloc {
			return EINVAL, "NBD_CMD_BLOCK_STATUS without a metadata context selected by NBD_OPT_SET_META_CONTEXT"
		}
		if r.Length == 0 {
			return EINVAL, "NBD_CMD_BLOCK_STATUS of length 0"
		}
		allowed = CmdFlagReqOne
	default:
		return EINVAL, fmt.Sprintf("unknown %s", cmdName(r.Type))
	}
	if r.Flags&^allowed != 0 {
		return EINVAL, fmt.Sprintf("flags %#x are not valid on %s", r.Flags&^allowed, cmdName(r.Type))
	}
	if r.Type == CmdFlush {
		return 0, ""
	}
	if r.Type == CmdRead && r.Length > uint32(c.s.MaxPayload) {
		return EINVAL, fmt.Sprintf("READ of %d bytes, above the advertised maximum %d", r.Length, c.s.MaxPayload)
	}
	if r.Offset > c.size || uint64(r.Length) > c.size-r.Offset {
		msg := fmt.Sprintf("%s of %d bytes at %d ends beyond the export's %d bytes", cmdName(r.Type), r.Length, r.Offset, c.size)
		if r.Type == CmdWrite || r.Type == CmdWriteZeroes {
			return ENOSPC, msg
		}
		return EINVAL, msg
	}
	return 0, ""
}

func (c *conn) putBuf(o *op) {
	if o.buf != nil && c.pool != nil {
		c.pool.PutBuffer(o.buf)
	}
	o.buf, o.data = nil, nil
	c.budget.release(o.held)
	o.held = 0
}

// finish queues the reply of a request.
func (c *conn) finish(o *op, errno uint32) {
	o.errno = errno
	if errno != 0 {
		c.s.stats.Errors.Add(1)
	}
	c.replies <- o
}

// Complete implements Completion: an AsyncBackend finished the op.
func (o *op) Complete(err error) {
	c := o.c
	if o.req.Type == CmdWrite {
		c.putBuf(o) // the payload is written: give the memory back before the reply
	}
	c.done(o, err)
	<-c.slots
	c.inflight.Done()
}

// done queues the reply of an executed op.
func (c *conn) done(o *op, err error) {
	errno := uint32(0)
	if err != nil {
		errno = Errno(err)
		o.msg = err.Error()
		r := o.req
		c.log.Warn("nbd: request failed", "cmd", cmdName(r.Type), "offset", r.Offset, "length", r.Length, "errno", errnoName(errno), "err", err)
	}
	c.finish(o, errno)
}

func (c *conn) exec(o *op) {
	defer func() {
		<-c.slots
		c.inflight.Done()
	}()
	r := o.req
	off, n := int64(r.Offset), int64(r.Length)
	fua := r.Flags&CmdFlagFUA != 0
	var err error
	switch r.Type {
	case CmdRead:
		if n > 0 {
			err = c.b.ReadAt(c.ctx, o.data, off)
		}
	case CmdWrite:
		if n > 0 {
			err = c.b.WriteAt(c.ctx, o.data, off, fua)
		}
		c.putBuf(o) // the payload is written: give the memory back before the reply
	case CmdFlush:
		err = c.b.Flush(c.ctx)
	case CmdTrim:
		start, end := roundUp(r.Offset, c.bs), roundDown(r.Offset+uint64(r.Length), c.bs)
		if end > start {
			err = c.b.Trim(c.ctx, int64(start), int64(end-start))
		}
		if err == nil && fua && n > 0 {
			err = c.b.Flush(c.ctx)
		}
	case CmdWriteZeroes:
		err = c.writeZeroes(off, n, r.Flags&CmdFlagNoHole != 0)
		if err == nil && fua && n > 0 {
			err = c.b.Flush(c.ctx)
		}
	case CmdCache:
		// Nothing to do: the protocol lets a server ignore the hint
		// (proto.md, NBD_CMD_CACHE), and the backend keeps no cache.
	case CmdBlockStatus:
		o.data, err = c.blockStatus(off, n, r.Flags&CmdFlagReqOne != 0)
	}
	c.done(o, err)
}

// maxExtents bounds the descriptors of one BLOCK_STATUS reply, well under
// the protocol's 2^20 (proto.md, NBD_REPLY_TYPE_BLOCK_STATUS); a client
// asks again from where the reply ends.
const maxExtents = 1 << 14

// maxStatusPayload is the largest BLOCK_STATUS chunk payload: the context
// id and maxExtents descriptors.
const maxStatusPayload = 4 + 8*maxExtents

// blockStatus returns the payload of the NBD_REPLY_TYPE_BLOCK_STATUS chunk
// for [off, off+n): the context id, then a length and flags per extent.
// The backend's extents are cut to the request, merged where consecutive
// ones share flags, and capped at maxExtents (one with REQ_ONE).
func (c *conn) blockStatus(off, n int64, one bool) ([]byte, error) {
	exts := []Extent{{Length: n}}
	if bs, ok := c.b.(BlockStatuser); ok {
		var err error
		if exts, err = bs.BlockStatus(c.ctx, off, n); err != nil {
			return nil, err
		}
		if len(exts) == 0 {
			return nil, WithErrno(fmt.Errorf("nbd: backend reported no extent for %d bytes at %d", n, off), EIO)
		}
	}
	b := be.AppendUint32(make([]byte, 0, 4+8*min(len(exts), 64)), allocationContextID)
	var covered int64
	count := 0
	for _, e := range exts {
		if e.Length <= 0 {
			return nil, WithErrno(fmt.Errorf("nbd: backend reported an extent of %d bytes at %d", e.Length, off+covered), EIO)
		}
		l := min(e.Length, n-covered)
		if count > 0 && be.Uint32(b[len(b)-4:]) == e.Flags {
			be.PutUint32(b[len(b)-8:], be.Uint32(b[len(b)-8:])+uint32(l)) // n fits in 32 bits, so does any sum
		} else {
			if count == maxExtents || one && count == 1 {
				break
			}
			b = be.AppendUint32(b, uint32(l))
			b = be.AppendUint32(b, e.Flags)
			count++
		}
		if covered += l; covered == n {
			break
		}
	}
	return b, nil
}

var zeros = make([]byte, 1<<20)

// writeZeroes zeroes [off, off+n): zeros written at unaligned edges (and
// everywhere with NO_HOLE, which asks for the range to stay allocated),
// the backend's WriteZeroes for the aligned middle.
func (c *conn) writeZeroes(off, n int64, noHole bool) error {
	if n == 0 {
		return nil
	}
	end := off + n
	bs := int64(c.bs)
	start, stop := (off+bs-1)/bs*bs, end/bs*bs
	if noHole || stop <= start {
		return c.writeZeroData(off, end)
	}
	if off < start {
		if err := c.writeZeroData(off, start); err != nil {
			return err
		}
	}
	if err := c.b.WriteZeroes(c.ctx, start, stop-start); err != nil {
		return err
	}
	if stop < end {
		return c.writeZeroData(stop, end)
	}
	return nil
}

func (c *conn) writeZeroData(off, end int64) error {
	for off < end {
		k := min(end-off, int64(len(zeros)))
		if err := c.b.WriteAt(c.ctx, zeros[:k], off, false); err != nil {
			return err
		}
		off += k
	}
	return nil
}

func roundUp(x, a uint64) uint64   { return (x + a - 1) / a * a }
func roundDown(x, a uint64) uint64 { return x / a * a }
