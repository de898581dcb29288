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
	data  []byte // READ: the payload to send; WRITE: the payload received
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
			if errno := c.check(r); errno != 0 {
				if _, err := c.br.Discard(int(r.Length)); err != nil {
					return "", err
				}
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
		} else if errno := c.check(r); errno != 0 {
			c.finish(o, errno)
			continue
		} else if r.Type == CmdRead && r.Length > 0 {
			o.held = int64(r.Length)
			c.budget.acquire(o.held)
			o.buf = c.getBuf(int(r.Length))
			o.data = o.buf
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

// check validates a request and returns the errno to fail it with.
func (c *conn) check(r request) uint32 {
	allowed := CmdFlagFUA
	switch r.Type {
	case CmdRead, CmdFlush:
	case CmdWrite, CmdTrim:
		if c.readOnly {
			return EPERM
		}
	case CmdWriteZeroes:
		if c.readOnly {
			return EPERM
		}
		allowed |= CmdFlagNoHole
	default:
		return EINVAL // CACHE, BLOCK_STATUS and unknown commands are not offered
	}
	if r.Flags&^allowed != 0 {
		return EINVAL
	}
	if r.Type == CmdFlush {
		return 0
	}
	if r.Type == CmdRead && r.Length > uint32(c.s.MaxPayload) {
		return EINVAL
	}
	if r.Offset > c.size || uint64(r.Length) > c.size-r.Offset {
		if r.Type == CmdWrite || r.Type == CmdWriteZeroes {
			return ENOSPC
		}
		return EINVAL
	}
	return 0
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
	}
	c.done(o, err)
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
