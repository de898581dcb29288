package nbd

// Replies: the writer that sends them as requests complete, as simple
// replies or, once NBD_OPT_STRUCTURED_REPLY is negotiated, as structured
// reply chunks.

import "net"

// writer sends replies as requests complete, batching small ones into one
// write while more are ready.
func (c *conn) writer() {
	var hdr [chunkHeaderLen + 8]byte // the longest header: OFFSET_DATA's
	var ebuf []byte                  // an error chunk's payload
	failed := false
	fail := func(err error) {
		if !failed {
			failed = true
			c.werr.Store(&err)
			c.cancel()
			c.raw.Close() // unblocks the reader
		}
	}
	for o := range c.replies {
		if !failed {
			var head, body []byte
			head, body, ebuf = c.encodeReply(hdr[:], ebuf[:0], o)
			var err error
			if len(body) > 32<<10 {
				if err = c.bw.Flush(); err == nil {
					bufs := net.Buffers{head, body}
					_, err = bufs.WriteTo(c.c)
				}
			} else {
				_, err = c.bw.Write(head)
				if err == nil && len(body) > 0 {
					_, err = c.bw.Write(body)
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

// encodeReply returns o's reply as a header, built in hdr, and the body
// that follows it. Without structured replies that is a simple reply
// (and a READ's data). With them, a READ's data goes in one
// NBD_REPLY_TYPE_OFFSET_DATA chunk, a BLOCK_STATUS's extents in one
// NBD_REPLY_TYPE_BLOCK_STATUS chunk, an error in an NBD_REPLY_TYPE_ERROR
// chunk with its message (built in ebuf), each the final chunk; the
// success of any other command stays a simple reply, which the protocol
// allows for a reply without payload (proto.md, "Simple reply message").
func (c *conn) encodeReply(hdr, ebuf []byte, o *op) (head, body, ebufOut []byte) {
	r := &o.req
	switch {
	case !c.structured:
		putSimpleReply(hdr, o.errno, r.Cookie)
		if r.Type == CmdRead && o.errno == 0 {
			body = o.data
		}
		return hdr[:simpleReplyLen], body, ebuf
	case o.errno != 0:
		ebuf = appendErrorPayload(ebuf, o.errno, o.msg)
		putChunkHeader(hdr, ReplyFlagDone, ReplyTypeError, r.Cookie, uint32(len(ebuf)))
		return hdr[:chunkHeaderLen], ebuf, ebuf
	case r.Type == CmdRead && len(o.data) > 0:
		putChunkHeader(hdr, ReplyFlagDone, ReplyTypeOffsetData, r.Cookie, uint32(8+len(o.data)))
		be.PutUint64(hdr[chunkHeaderLen:], r.Offset)
		return hdr[:chunkHeaderLen+8], o.data, ebuf
	case r.Type == CmdRead:
		// An empty READ: OFFSET_DATA must carry at least one byte.
		putChunkHeader(hdr, ReplyFlagDone, ReplyTypeNone, r.Cookie, 0)
		return hdr[:chunkHeaderLen], nil, ebuf
	case r.Type == CmdBlockStatus:
		putChunkHeader(hdr, ReplyFlagDone, ReplyTypeBlockStatus, r.Cookie, uint32(len(o.data)))
		return hdr[:chunkHeaderLen], o.data, ebuf
	default:
		putSimpleReply(hdr, 0, r.Cookie)
		return hdr[:simpleReplyLen], nil, ebuf
	}
}
