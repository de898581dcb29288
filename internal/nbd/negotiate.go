package nbd

// The handshake: fixed newstyle negotiation up to the transmission phase.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
)

func (c *conn) transmissionFlags() uint16 {
	f := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn | FlagSendCache
	if c.s.Export.Backend.ReadOnly() {
		f |= FlagReadOnly
	}
	if c.structured {
		// A READ is always answered with one chunk, so DF costs nothing;
		// the flag must stay clear without structured replies
		// (proto.md, NBD_FLAG_SEND_DF).
		f |= FlagSendDF
	}
	return f
}

func (c *conn) nameMatches(name string) bool {
	return name == "" || name == c.s.Export.Name
}

func (c *conn) reply(opt, typ uint32, data []byte) error {
	if _, err := c.bw.Write(appendOptReply(make([]byte, 0, optReplyLen+len(data)), opt, typ, data)); err != nil {
		return err
	}
	return nil
}

func (c *conn) replyErr(opt, typ uint32, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	c.log.Debug("nbd: option refused", "option", optName(opt), "reply", typ&^repErr, "msg", msg)
	if err := c.reply(opt, typ, []byte(msg)); err != nil {
		return err
	}
	return c.bw.Flush()
}

// blockSizes returns the minimum, preferred and maximum block sizes.
func (c *conn) blockSizes() (uint32, uint32, uint32) {
	bs := uint32(c.s.Export.Backend.BlockSize())
	pref := max(bs, 4096)
	mx := uint32(c.s.MaxPayload) / bs * bs
	if mx < pref {
		mx = pref
	}
	return bs, pref, mx
}

// handshake runs the fixed newstyle negotiation. It returns true when the
// transmission phase starts, false after NBD_OPT_ABORT.
func (c *conn) handshake() (bool, error) {
	var hello [18]byte
	be.PutUint64(hello[0:], magicInit)
	be.PutUint64(hello[8:], magicOpt)
	be.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.c.Write(hello[:]); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return false, err
	}
	cflags := be.Uint32(cf[:])
	if cflags&^clientFlagsAllowed != 0 {
		return false, fmt.Errorf("%w: unknown client flags %#x", errProtocol, cflags)
	}
	noZeroes := cflags&clientNoZeroes != 0
	fixed := cflags&clientFixed != 0
	exp := &c.s.Export
	var hdr [optHeaderLen]byte
	data := make([]byte, 0, 256)
	for n := 0; ; n++ {
		if n >= 4096 {
			return false, fmt.Errorf("%w: more than %d options without choosing an export", errProtocol, n)
		}
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return false, err
		}
		h, err := decodeOptHeader(hdr[:])
		if err != nil {
			return false, err
		}
		data = data[:0]
		if h.Length > 0 {
			data = append(data, make([]byte, h.Length)...)
			if _, err := io.ReadFull(c.br, data); err != nil {
				return false, err
			}
		}
		if !fixed && h.Option != OptExportName {
			return false, fmt.Errorf("%w: %s from a client without fixed newstyle", errProtocol, optName(h.Option))
		}
		if c.s.TLSConfig != nil && !c.tls {
			// FORCEDTLS (proto.md): nothing but STARTTLS and ABORT
			// before TLS; EXPORT_NAME cannot be refused, so it closes.
			switch h.Option {
			case OptStartTLS, OptAbort:
			case OptExportName:
				return false, fmt.Errorf("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS: this server requires TLS")
			default:
				if err := c.replyErr(h.Option, RepErrTLSReqd, "this server requires TLS: send NBD_OPT_STARTTLS first"); err != nil {
					return false, err
				}
				continue
			}
		}
		switch h.Option {
		case OptExportName:
			name := string(data)
			if !c.nameMatches(name) {
				// This option cannot fail politely: the protocol says close.
				return false, fmt.Errorf("NBD_OPT_EXPORT_NAME for unknown export %q (this server serves %q)", name, exp.Name)
			}
			var b []byte
			b = be.AppendUint64(b, uint64(exp.Backend.Size()))
			b = be.AppendUint16(b, c.transmissionFlags())
			if !noZeroes {
				b = append(b, make([]byte, exportNamePad)...)
			}
			if _, err := c.bw.Write(b); err != nil {
				return false, err
			}
			if err := c.bw.Flush(); err != nil {
				return false, err
			}
			c.log.Debug("nbd: client chose the export", "via", "NBD_OPT_EXPORT_NAME")
			return true, nil
		case OptAbort:
			c.reply(h.Option, RepAck, nil)
			c.bw.Flush()
			c.log.Debug("nbd: client aborted negotiation")
			return false, nil
		case OptList:
			if len(data) != 0 {
				if err := c.replyErr(h.Option, RepErrInvalid, "NBD_OPT_LIST takes no data"); err != nil {
					return false, err
				}
				continue
			}
			var b []byte
			b = be.AppendUint32(b, uint32(len(exp.Name)))
			b = append(b, exp.Name...)
			b = append(b, exp.Description...)
			if err := c.reply(h.Option, RepServer, b); err != nil {
				return false, err
			}
			if err := c.reply(h.Option, RepAck, nil); err != nil {
				return false, err
			}
			if err := c.bw.Flush(); err != nil {
				return false, err
			}
		case OptInfo, OptGo:
			ir, err := decodeInfoRequest(data)
			if err != nil {
				if err := c.replyErr(h.Option, RepErrInvalid, "%s: %v", optName(h.Option), err); err != nil {
					return false, err
				}
				continue
			}
			if !c.nameMatches(ir.Name) {
				if err := c.replyErr(h.Option, RepErrUnknown, "no export %q: this server serves %q", ir.Name, exp.Name); err != nil {
					return false, err
				}
				continue
			}
			if err := c.sendInfo(h.Option, ir); err != nil {
				return false, err
			}
			if h.Option == OptGo {
				c.log.Debug("nbd: client chose the export", "via", "NBD_OPT_GO")
				return true, nil
			}
		case OptStructuredReply:
			if len(data) != 0 {
				if err := c.replyErr(h.Option, RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data"); err != nil {
					return false, err
				}
				continue
			}
			c.structured = true
			if err := c.reply(h.Option, RepAck, nil); err != nil {
				return false, err
			}
			if err := c.bw.Flush(); err != nil {
				return false, err
			}
		case OptListMetaContext, OptSetMetaContext:
			if err := c.metaContext(h.Option, data); err != nil {
				return false, err
			}
		case OptStartTLS:
			if err := c.startTLS(data); err != nil {
				return false, err
			}
		default:
			if err := c.replyErr(h.Option, RepErrUnsup, "%s is not supported", optName(h.Option)); err != nil {
				return false, err
			}
		}
	}
}

// startTLS answers NBD_OPT_STARTTLS: refused without a TLSConfig, invalid
// once TLS runs or with data, else acknowledged and followed by the TLS
// handshake, after which the negotiation goes on inside TLS with what was
// negotiated before forgotten (proto.md: the client renegotiates
// structured replies after STARTTLS).
func (c *conn) startTLS(data []byte) error {
	switch {
	case c.s.TLSConfig == nil:
		return c.replyErr(OptStartTLS, RepErrUnsup, "TLS is not configured on this server (use a unix socket or loopback)")
	case c.tls:
		return c.replyErr(OptStartTLS, RepErrInvalid, "TLS is already running")
	case len(data) != 0:
		return c.replyErr(OptStartTLS, RepErrInvalid, "NBD_OPT_STARTTLS takes no data")
	}
	if err := c.reply(OptStartTLS, RepAck, nil); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	// Bytes after the option that arrived before the handshake would be
	// read as if they came through TLS: plaintext injected into the
	// protected stream (the STARTTLS command injection of RFC 7457 §2.2).
	if n := c.br.Buffered(); n > 0 {
		return fmt.Errorf("%w: %d bytes sent after NBD_OPT_STARTTLS before the TLS handshake", errProtocol, n)
	}
	tc := tls.Server(c.raw, c.s.TLSConfig)
	ctx, cancel := context.WithTimeout(c.ctx, c.s.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.c, c.tls = tc, true
	c.br.Reset(tc)
	c.bw.Reset(tc)
	c.structured, c.metaAlloc = false, false
	c.log.Debug("nbd: TLS established", "version", tls.VersionName(tc.ConnectionState().Version))
	return nil
}

// metaContext answers NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT. The only context is base:allocation; queries
// of other namespaces are ignored, as the protocol requires, and so is
// "base:" in a SET (it is a wildcard for LIST only).
func (c *conn) metaContext(opt uint32, data []byte) error {
	set := opt == OptSetMetaContext
	if set {
		c.metaAlloc = false // replaced even when the option fails
		if !c.structured {
			return c.replyErr(opt, RepErrInvalid, "NBD_OPT_SET_META_CONTEXT before NBD_OPT_STRUCTURED_REPLY")
		}
	}
	r, err := decodeMetaContextRequest(data)
	if err != nil {
		return c.replyErr(opt, RepErrInvalid, "%s: %v", optName(opt), err)
	}
	if !c.nameMatches(r.Name) {
		return c.replyErr(opt, RepErrUnknown, "no export %q: this server serves %q", r.Name, c.s.Export.Name)
	}
	found := !set && len(r.Queries) == 0
	for _, q := range r.Queries {
		if q == MetaAllocation || !set && q == "base:" {
			found = true
		}
	}
	if found {
		// LIST answers with the reserved id 0; SET with the id
		// BLOCK_STATUS replies will carry.
		id := uint32(0)
		if set {
			id, c.metaAlloc = allocationContextID, true
		}
		if err := c.reply(opt, RepMetaContext, append(be.AppendUint32(nil, id), MetaAllocation...)); err != nil {
			return err
		}
	}
	if err := c.reply(opt, RepAck, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (c *conn) sendInfo(opt uint32, ir infoRequest) error {
	exp := &c.s.Export
	var b []byte
	b = be.AppendUint16(b, InfoExport)
	b = be.AppendUint64(b, uint64(exp.Backend.Size()))
	b = be.AppendUint16(b, c.transmissionFlags())
	if err := c.reply(opt, RepInfo, b); err != nil {
		return err
	}
	for _, i := range ir.Infos {
		switch i {
		case InfoName:
			b = be.AppendUint16(b[:0], InfoName)
			b = append(b, exp.Name...)
		case InfoDescription:
			if exp.Description == "" {
				continue
			}
			b = be.AppendUint16(b[:0], InfoDescription)
			b = append(b, exp.Description...)
		default:
			continue // BLOCK_SIZE is always sent below; unknown ones are ignored
		}
		if err := c.reply(opt, RepInfo, b); err != nil {
			return err
		}
	}
	// Sent whether or not it was asked for, as the protocol allows: the
	// client then knows TRIM and WRITE_ZEROES work in whole blocks.
	mn, pref, mx := c.blockSizes()
	b = be.AppendUint16(b[:0], InfoBlockSize)
	b = be.AppendUint32(b, mn)
	b = be.AppendUint32(b, pref)
	b = be.AppendUint32(b, mx)
	if err := c.reply(opt, RepInfo, b); err != nil {
		return err
	}
	if err := c.reply(opt, RepAck, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}
