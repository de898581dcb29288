package nbd

// Replies: the writer that sends them as requests complete.

import "net"

// writer sends replies as requests complete, batching small ones into one
// write while more are ready.
func (c *conn) writer() {
	var hdr [simpleReplyLen]byte
	failed := false
	fail := func(err error) {
		if !failed {
			failed = true
			c.werr.Store(&err)
			c.cancel()
			c.c.Close() // unblocks the reader
		}
	}
	for o := range c.replies {
		if !failed {
			putSimpleReply(hdr[:], o.errno, o.req.Cookie)
			var err error
			if o.req.Type == CmdRead && o.errno == 0 && len(o.data) > 32<<10 {
				if err = c.bw.Flush(); err == nil {
					bufs := net.Buffers{hdr[:], o.data}
					_, err = bufs.WriteTo(c.c)
				}
			} else {
				_, err = c.bw.Write(hdr[:])
				if err == nil && o.req.Type == CmdRead && o.errno == 0 {
					_, err = c.bw.Write(o.data)
				}
			}
			if err == nil && len(c.replies) == 0 {
				err = c.bw.Flush()
			}
			if err != nil {
				fail(err)
			}
		}
		c.putBuf(o)
	}
	if !failed {
		if err := c.bw.Flush(); err != nil {
			fail(err)
		}
	}
}
