package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"testing"

	"github.com/gosrp/gosrp/internal/testcerts"
)

// tlsServer starts a server that requires TLS with client certificates
// and returns it with a client configuration that passes.
func tlsServer(t *testing.T) (*testServer, *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	testcerts.Write(t, dir)
	srv, cli := testcerts.Configs(t, dir)
	ts := startServer(t, NewMemory(testSize, testBS, false), func(s *Server) { s.TLSConfig = srv })
	return ts, cli
}

// startTLS sends NBD_OPT_STARTTLS and, once acknowledged, runs the rest
// of the connection inside TLS.
func (tc *testClient) startTLS(cfg *tls.Config) {
	tc.t.Helper()
	tc.option(OptStartTLS, nil)
	if r := tc.optReply(); r.typ != RepAck {
		tc.t.Fatalf("NBD_OPT_STARTTLS: %#x %q", r.typ, r.data)
	}
	c := tls.Client(tc.c, cfg)
	if err := c.Handshake(); err != nil {
		tc.t.Fatalf("TLS handshake: %v", err)
	}
	tc.c, tc.br = c, bufio.NewReader(c)
}

// TestTLS: a server with a TLSConfig answers every option but STARTTLS
// and ABORT with NBD_REP_ERR_TLS_REQD, upgrades on STARTTLS, forgets what
// was negotiated before, and then serves inside TLS.
func TestTLS(t *testing.T) {
	ts, cli := tlsServer(t)
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed | clientNoZeroes)
	if r := tc.goOpt(OptGo, "vol0"); r.typ != RepErrTLSReqd {
		t.Fatalf("NBD_OPT_GO before TLS: %#x", r.typ)
	}
	tc.option(OptList, nil)
	if r := tc.optReply(); r.typ != RepErrTLSReqd {
		t.Fatalf("NBD_OPT_LIST before TLS: %#x", r.typ)
	}
	tc.option(OptStartTLS, []byte{1})
	if r := tc.optReply(); r.typ != RepErrInvalid {
		t.Fatalf("NBD_OPT_STARTTLS with data: %#x", r.typ)
	}
	tc.startTLS(cli)
	tc.option(OptStartTLS, nil)
	if r := tc.optReply(); r.typ != RepErrInvalid {
		t.Fatalf("a second NBD_OPT_STARTTLS: %#x", r.typ)
	}
	tc.option(OptStructuredReply, nil)
	if r := tc.optReply(); r.typ != RepAck {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %#x", r.typ)
	}
	if _, r := tc.metaOpt(OptSetMetaContext, "vol0", MetaAllocation); r.typ != RepAck {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT: %#x", r.typ)
	}
	if r := tc.goOpt(OptGo, "vol0"); r.typ != RepAck {
		t.Fatalf("NBD_OPT_GO inside TLS: %#x %q", r.typ, r.data)
	}
	data := bytes.Repeat([]byte("tls"), 10000)
	if r := tc.doS(CmdWrite, CmdFlagFUA, 0, uint32(len(data)), data); r.errno != 0 {
		t.Fatalf("write: %+v", r)
	}
	if r := tc.doS(CmdRead, 0, 0, uint32(len(data)), nil); r.errno != 0 || !bytes.Equal(r.data, data) {
		t.Fatalf("read: errno %d", r.errno)
	}
	if r := tc.doS(CmdBlockStatus, 0, 0, testSize, nil); r.errno != 0 || len(r.extents) != 2 {
		t.Fatalf("block status: %+v", r)
	}
	tc.send(CmdDisc, 0, 1, 0, 0, nil)
	tc.expectClosed()

	// Structured replies negotiated before STARTTLS are forgotten.
	tc = dialRaw(t, ts.addr)
	tc.hello(clientFixed | clientNoZeroes)
	tc.startTLS(cli)
	if r := tc.goOpt(OptGo, "vol0"); r.typ != RepAck || tc.flags&FlagSendDF != 0 {
		t.Fatalf("NBD_OPT_GO: %#x, flags %#x", r.typ, tc.flags)
	}
	if errno, got := tc.do(CmdRead, 0, 0, 3, nil); errno != 0 || string(got) != "tls" {
		t.Fatalf("simple read inside TLS: %d %q", errno, got)
	}
}

// TestTLSRefusals: the ways into a TLS-only server without TLS close the
// connection, each with its reason logged.
func TestTLSRefusals(t *testing.T) {
	ts, cli := tlsServer(t)
	noCert := cli.Clone()
	noCert.Certificates = nil
	cases := []struct {
		name string
		run  func(tc *testClient)
		log  string
	}{
		{"NBD_OPT_EXPORT_NAME before TLS", func(tc *testClient) {
			tc.option(OptExportName, []byte("vol0"))
		}, "requires TLS"},
		{"plaintext after STARTTLS", func(tc *testClient) {
			b := appendOptHeader(nil, OptStartTLS, 0)
			tc.write(appendOptHeader(b, OptGo, 0)) // in one write: buffered with STARTTLS
		}, "sent after NBD_OPT_STARTTLS"},
		{"no client certificate", func(tc *testClient) {
			tc.option(OptStartTLS, nil)
			if r := tc.optReply(); r.typ != RepAck {
				t.Fatalf("NBD_OPT_STARTTLS: %#x", r.typ)
			}
			c := tls.Client(tc.c, noCert)
			c.Handshake()
			c.Read(make([]byte, 1)) // TLS 1.3: the server's verdict comes after the client's Finished
		}, "TLS handshake"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := dialRaw(t, ts.addr)
			tc.hello(clientFixed)
			c.run(tc)
			tc.expectClosed()
			waitLog(t, ts, c.log)
		})
	}
}
