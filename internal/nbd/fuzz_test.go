package nbd

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/testcerts"
)

func TestHostileInput(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false), func(s *Server) { s.MaxPayload = 1 << 16 })
	cases := []struct {
		name string
		run  func(tc *testClient)
		log  string
	}{
		{"unknown client flags", func(tc *testClient) { tc.hello(1 << 7) }, "unknown client flags"},
		{"bad option magic", func(tc *testClient) {
			tc.hello(clientFixed)
			tc.write(make([]byte, 16))
		}, "option magic"},
		{"oversized option", func(tc *testClient) {
			tc.hello(clientFixed)
			b := be.AppendUint64(nil, magicOpt)
			b = be.AppendUint32(b, OptGo)
			tc.write(be.AppendUint32(b, 1<<30))
		}, "bytes of data"},
		{"option other than EXPORT_NAME without fixed newstyle", func(tc *testClient) {
			tc.hello(0)
			tc.option(OptList, nil)
		}, "without fixed newstyle"},
		{"bad request magic", func(tc *testClient) {
			tc.hello(clientFixed)
			tc.goOpt(OptGo, "vol0")
			tc.write(bytes.Repeat([]byte{0xee}, 28))
		}, "request magic"},
		{"write above the maximum payload", func(tc *testClient) {
			tc.hello(clientFixed)
			tc.goOpt(OptGo, "vol0")
			tc.send(CmdWrite, 0, 1, 0, 1<<20, nil)
		}, "above the advertised maximum"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := dialRaw(t, ts.addr)
			c.run(tc)
			tc.expectClosed()
			waitLog(t, ts, c.log)
		})
	}
	// The server still serves.
	tc := connect(t, ts.addr, "vol0")
	if errno, _ := tc.do(CmdRead, 0, 0, 512, nil); errno != 0 {
		t.Fatal(errno)
	}
}

func FuzzDecodeInfoRequest(f *testing.F) {
	f.Add(appendInfoRequest(nil, "vol0", InfoBlockSize, InfoName))
	f.Add(appendInfoRequest(nil, ""))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 1, 'a', 0, 5, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeInfoRequest(b)
		if err != nil {
			return
		}
		if again := appendInfoRequest(nil, r.Name, r.Infos...); !bytes.Equal(again, b) {
			t.Fatalf("decode/encode not a round trip: %x -> %+v -> %x", b, r, again)
		}
	})
}

func FuzzDecodeMetaContextRequest(f *testing.F) {
	f.Add(appendMetaContextRequest(nil, "vol0", MetaAllocation))
	f.Add(appendMetaContextRequest(nil, "", "base:", "qemu:dirty-bitmap:a"))
	f.Add(appendMetaContextRequest(nil, "vol0"))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeMetaContextRequest(b)
		if err != nil {
			return
		}
		if len(r.Queries) > len(b)/4 {
			t.Fatalf("%d queries from %d bytes", len(r.Queries), len(b))
		}
		if again := appendMetaContextRequest(nil, r.Name, r.Queries...); !bytes.Equal(again, b) {
			t.Fatalf("decode/encode not a round trip: %x -> %+v -> %x", b, r, again)
		}
	})
}

func FuzzDecodeHeaders(f *testing.F) {
	f.Add(appendRequest(nil, request{Type: CmdWrite, Cookie: 7, Offset: 4096, Length: 512}))
	f.Add(appendOptHeader(nil, OptGo, 12))
	f.Add(make([]byte, 28))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRequest(b); err == nil {
			if again := appendRequest(nil, r); !bytes.Equal(again, b[:requestLen]) {
				t.Fatalf("request round trip: %x -> %x", b, again)
			}
		}
		if h, err := decodeOptHeader(b); err == nil {
			if h.Length > maxOptionLen {
				t.Fatalf("accepted option length %d", h.Length)
			}
			if again := appendOptHeader(nil, h.Option, h.Length); !bytes.Equal(again, b[:optHeaderLen]) {
				t.Fatalf("option header round trip: %x -> %x", b, again)
			}
		}
	})
}

// fuzzConn feeds a client byte stream to ServeConn over a pipe and
// drains the replies; it must neither panic nor hang.
func fuzzConn(t *testing.T, stream []byte, tweak ...func(*Server)) {
	mem := NewMemory(64<<10, 512, false)
	s := &Server{
		Export:           Export{Name: "vol0", Backend: mem},
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxPayload:       1 << 14,
		MaxBuffered:      1 << 15,
		MaxInFlight:      4,
		HandshakeTimeout: 2 * time.Second,
	}
	for _, f := range tweak {
		f(s)
	}
	cli, srv := net.Pipe()
	done := make(chan struct{})
	go func() { s.ServeConn(srv); close(done) }()
	go io.Copy(io.Discard, cli)
	cli.SetWriteDeadline(time.Now().Add(2 * time.Second))
	cli.Write(stream)
	cli.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not return after the client closed")
	}
}

// handshake is a valid client negotiation up to the transmission phase.
func handshake() []byte {
	b := be.AppendUint32(nil, clientFixed|clientNoZeroes)
	b = appendOptHeader(b, OptList, 0)
	info := appendInfoRequest(nil, "vol0", InfoBlockSize)
	b = appendOptHeader(b, OptGo, uint32(len(info)))
	return append(b, info...)
}

// structuredHandshake negotiates structured replies and base:allocation
// before NBD_OPT_GO.
func structuredHandshake() []byte {
	b := be.AppendUint32(nil, clientFixed|clientNoZeroes)
	b = appendOptHeader(b, OptStructuredReply, 0)
	meta := appendMetaContextRequest(nil, "vol0", MetaAllocation)
	b = appendOptHeader(b, OptSetMetaContext, uint32(len(meta)))
	b = append(b, meta...)
	info := appendInfoRequest(nil, "vol0")
	b = appendOptHeader(b, OptGo, uint32(len(info)))
	return append(b, info...)
}

func FuzzNegotiation(f *testing.F) {
	f.Add(handshake())
	f.Add(structuredHandshake())
	f.Add(append(be.AppendUint32(nil, 1), appendOptHeader(nil, OptExportName, 4)...))
	f.Add(append(be.AppendUint32(nil, 1), appendOptHeader(nil, OptAbort, 0)...))
	f.Add([]byte{0, 0, 0, 3})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzConn(t, b) })
}

func FuzzTransmission(f *testing.F) {
	w := appendRequest(nil, request{Type: CmdWrite, Cookie: 1, Offset: 100, Length: 8})
	w = append(w, "abcdefgh"...)
	f.Add(w)
	f.Add(appendRequest(nil, request{Type: CmdRead, Cookie: 2, Offset: 0, Length: 4096}))
	f.Add(appendRequest(nil, request{Type: CmdWriteZeroes, Flags: CmdFlagNoHole | CmdFlagFUA, Offset: 3, Length: 5000}))
	f.Add(appendRequest(nil, request{Type: CmdTrim, Offset: 1, Length: 1 << 16}))
	f.Add(appendRequest(nil, request{Type: CmdDisc}))
	f.Fuzz(func(t *testing.T, b []byte) { fuzzConn(t, append(handshake(), b...)) })
}

// FuzzTLSNegotiation feeds arbitrary negotiations to a server that
// requires TLS: options before STARTTLS, STARTTLS with data, bytes after
// it, and garbage where the TLS handshake should be.
func FuzzTLSNegotiation(f *testing.F) {
	dir := f.TempDir()
	testcerts.Write(f, dir)
	cfg, _ := testcerts.Configs(f, dir)
	hello := be.AppendUint32(nil, clientFixed|clientNoZeroes)
	f.Add(append(appendOptHeader(append([]byte{}, hello...), OptStartTLS, 0), 0x16, 0x03, 0x01, 0, 5, 1, 0, 0, 1, 0))
	f.Add(appendOptHeader(append([]byte{}, hello...), OptStartTLS, 3))
	f.Add(append(appendOptHeader(append([]byte{}, hello...), OptList, 0), structuredHandshake()[4:]...))
	f.Add(appendOptHeader(append([]byte{}, hello...), OptExportName, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzConn(t, b, func(s *Server) { s.TLSConfig = cfg })
	})
}

// FuzzStructuredTransmission is FuzzTransmission after negotiating
// structured replies and base:allocation, so the chunked replies and
// BLOCK_STATUS run.
func FuzzStructuredTransmission(f *testing.F) {
	f.Add(appendRequest(nil, request{Type: CmdBlockStatus, Cookie: 1, Offset: 100, Length: 9000}))
	f.Add(appendRequest(nil, request{Type: CmdBlockStatus, Flags: CmdFlagReqOne, Cookie: 2, Length: 1 << 16}))
	f.Add(appendRequest(nil, request{Type: CmdRead, Flags: CmdFlagDF, Cookie: 3, Offset: 1 << 20, Length: 512}))
	f.Add(appendRequest(nil, request{Type: CmdCache, Cookie: 4, Length: 1 << 16}))
	f.Fuzz(func(t *testing.T, b []byte) { fuzzConn(t, append(structuredHandshake(), b...)) })
}
