// Package nbd is a server for the Network Block Device protocol
// (NetworkBlockDevice/nbd, doc/proto.md): it serves one export, backed by
// a Backend, to clients such as the Linux kernel's nbd driver, qemu,
// nbdinfo, nbdcopy and fio, so that they use a gosrp volume unchanged.
// cmd/srpc's "srpc nbd" is its user.
//
//	srv := &nbd.Server{Export: nbd.Export{Name: "vol0", Backend: b}}
//	go srv.Serve(ln)            // a unix socket or TCP listener
//	...
//	srv.Shutdown(ctx)           // answers what is in flight, then closes
//
// # A connection
//
// A connection starts with fixed newstyle negotiation (negotiate.go): the
// server greets, the client sends options, and NBD_OPT_GO (or the older
// NBD_OPT_EXPORT_NAME) chooses the export and starts the transmission
// phase. Besides NBD_OPT_INFO, NBD_OPT_LIST and NBD_OPT_ABORT, a client
// may negotiate:
//
//   - NBD_OPT_STRUCTURED_REPLY: READ data then comes in an
//     NBD_REPLY_TYPE_OFFSET_DATA chunk and an error in an
//     NBD_REPLY_TYPE_ERROR chunk with a message saying why, both final
//     chunks (NBD_REPLY_FLAG_DONE); commands that succeed without a
//     payload keep their simple reply, which the protocol allows. A
//     client that does not ask gets simple replies only.
//   - NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT with the one
//     metadata context offered, base:allocation (SET needs structured
//     replies first). NBD_CMD_BLOCK_STATUS then answers which extents are
//     holes (NBD_STATE_HOLE) and read as zeros (NBD_STATE_ZERO), from the
//     backend's BlockStatuser if it has one, else "all allocated", which
//     is always a correct answer. This is what lets nbdinfo --map,
//     qemu-img map and nbdcopy skip holes.
//
// NBD_OPT_EXTENDED_HEADERS is refused with NBD_REP_ERR_UNSUP.
//
// # TLS
//
// NBD carries no authentication of its own. With Server.TLSConfig set,
// TLS is mandatory (proto.md's FORCEDTLS mode): every option but
// NBD_OPT_STARTTLS and NBD_OPT_ABORT is answered NBD_REP_ERR_TLS_REQD, and
// NBD_OPT_EXPORT_NAME, which cannot be refused, closes the connection.
// STARTTLS is acknowledged, the TLS handshake runs on the same
// connection, and negotiation starts over inside TLS (structured replies
// and metadata contexts negotiated before are forgotten, as the protocol
// says). Bytes the client sent after STARTTLS before the handshake close
// the connection rather than be read as if TLS had protected them. A
// TLSConfig that requires and verifies client certificates is the
// authentication. Without TLSConfig, STARTTLS is refused with
// NBD_REP_ERR_UNSUP. TLS with pre-shared keys, which nbdkit and qemu
// offer, is not: Go's crypto/tls has no TLS-PSK cipher suites.
//
// In the transmission phase (transmit.go) one reader goroutine decodes
// requests, checks them (bad flags, ranges beyond the export, writes to a
// read-only export are answered with an errno without reaching the
// backend) and starts each on the backend: on an AsyncBackend without a
// goroutine, otherwise on a goroutine of its own. Requests run
// concurrently, at most MaxInFlight at once, with at most MaxBuffered
// bytes of payload held, and are answered as they complete by one writer
// goroutine (reply.go), which batches small replies into one write.
// NBD_CMD_CACHE is accepted and does nothing, as the protocol allows: the
// backend keeps no cache to warm. TRIM trims the whole blocks inside its
// range; WRITE_ZEROES writes zeros at unaligned edges (and everywhere with
// NO_HOLE).
//
// # Limits and hostile clients
//
// Everything from the wire is bounded before it is trusted: option data
// (64 KiB), names and strings (4096 bytes), counts of queries against
// the bytes that carry them, WRITE payloads (MaxPayload), the options of
// one negotiation (4096) and its duration (HandshakeTimeout). A request
// that breaks the protocol closes the connection with the reason logged;
// one that is merely invalid gets an errno. FuzzNegotiation and
// FuzzTransmission feed arbitrary bytes to a connection; the Fuzz*Decode*
// targets check every decoder round-trips.
package nbd
