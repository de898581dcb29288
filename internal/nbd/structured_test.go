package nbd

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
)

// TestStructuredReplies checks what NBD_OPT_STRUCTURED_REPLY changes: READ
// data in one final OFFSET_DATA chunk, errors (early ones too) in an ERROR
// chunk with a message, DF offered and accepted, and simple replies still
// used for payload-less successes.
func TestStructuredReplies(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem)
	tc, _ := connectStructured(t, ts.addr)
	if tc.flags&FlagSendDF == 0 {
		t.Errorf("structured replies negotiated but NBD_FLAG_SEND_DF clear: %#x", tc.flags)
	}
	data := bytes.Repeat([]byte("structured"), 1000)
	if r := tc.doS(CmdWrite, 0, 100, uint32(len(data)), data); r.errno != 0 || r.types != nil {
		t.Fatalf("write: %+v (a simple reply expected)", r)
	}
	r := tc.doS(CmdRead, CmdFlagDF, 100, uint32(len(data)), nil)
	if r.errno != 0 || !reflect.DeepEqual(r.types, []uint16{ReplyTypeOffsetData}) || !bytes.Equal(r.data, data) {
		t.Fatalf("read: errno %d, chunks %v, data equal %v", r.errno, r.types, bytes.Equal(r.data, data))
	}
	// Large reads take the writer's vectored path.
	big := make([]byte, 256<<10)
	copy(big[100:], data)
	if r := tc.doS(CmdRead, 0, 0, uint32(len(big)), nil); r.errno != 0 || !bytes.Equal(r.data, big) {
		t.Fatalf("large read: errno %d", r.errno)
	}
	if r := tc.doS(CmdRead, 0, 0, 0, nil); r.errno != 0 || !reflect.DeepEqual(r.types, []uint16{ReplyTypeNone}) {
		t.Fatalf("empty read: %+v", r)
	}
	// An early error on a READ is a chunk, never a simple reply.
	r = tc.doS(CmdRead, 0, testSize-512, 1024, nil)
	if r.errno != EINVAL || !reflect.DeepEqual(r.types, []uint16{ReplyTypeError}) || !strings.Contains(r.msg, "beyond the export") {
		t.Fatalf("read past the end: %+v", r)
	}
	var fail atomic.Bool
	mem.Fail = func(op string, off, n int64) error {
		if fail.Load() {
			return errors.New("disk on fire")
		}
		return nil
	}
	fail.Store(true)
	if r := tc.doS(CmdRead, 0, 0, 512, nil); r.errno != EIO || r.msg != "disk on fire" {
		t.Fatalf("failing read: %+v", r)
	}
	if r := tc.doS(CmdFlush, 0, 0, 0, nil); r.errno != EIO || r.types[0] != ReplyTypeError {
		t.Fatalf("failing flush: %+v", r)
	}
	fail.Store(false)
	if r := tc.doS(CmdCache, 0, 0, testSize, nil); r.errno != 0 {
		t.Fatalf("cache: %+v", r)
	}
	// A client that does not ask keeps simple replies and no DF.
	plain := connect(t, ts.addr, "vol0")
	if plain.flags&FlagSendDF != 0 {
		t.Errorf("NBD_FLAG_SEND_DF without structured replies: %#x", plain.flags)
	}
	if errno, got := plain.do(CmdRead, 0, 100, uint32(len(data)), nil); errno != 0 || !bytes.Equal(got, data) {
		t.Fatalf("simple read: errno %d", errno)
	}
}

func TestMetaContextNegotiation(t *testing.T) {
	ts := startServer(t, NewMemory(testSize, testBS, false))
	tc := dialRaw(t, ts.addr)
	tc.hello(clientFixed)
	// SET needs structured replies; LIST may come first.
	if _, r := tc.metaOpt(OptSetMetaContext, "vol0", MetaAllocation); r.typ != RepErrInvalid {
		t.Errorf("SET before STRUCTURED_REPLY: %#x", r.typ)
	}
	if ctxs, r := tc.metaOpt(OptListMetaContext, "vol0"); r.typ != RepAck || !reflect.DeepEqual(ctxs, map[string]uint32{MetaAllocation: 0}) {
		t.Errorf("LIST with no query: %#x %v", r.typ, ctxs)
	}
	tc.option(OptStructuredReply, []byte{1})
	if r := tc.optReply(); r.typ != RepErrInvalid {
		t.Errorf("STRUCTURED_REPLY with data: %#x", r.typ)
	}
	tc.option(OptStructuredReply, nil)
	if r := tc.optReply(); r.typ != RepAck {
		t.Fatalf("STRUCTURED_REPLY: %#x", r.typ)
	}
	cases := []struct {
		name    string
		opt     uint32
		export  string
		queries []string
		want    map[string]uint32
		reply   uint32
	}{
		{"LIST the base namespace", OptListMetaContext, "vol0", []string{"base:"}, map[string]uint32{MetaAllocation: 0}, RepAck},
		{"LIST another namespace", OptListMetaContext, "", []string{"qemu:dirty-bitmap:x"}, map[string]uint32{}, RepAck},
		{"LIST for an unknown export", OptListMetaContext, "nope", nil, map[string]uint32{}, RepErrUnknown},
		{"SET base: selects nothing", OptSetMetaContext, "vol0", []string{"base:"}, map[string]uint32{}, RepAck},
		{"SET an unknown leaf", OptSetMetaContext, "vol0", []string{"base:nothing", "x-foo:bar"}, map[string]uint32{}, RepAck},
		{"SET base:allocation", OptSetMetaContext, "", []string{"x-foo:bar", MetaAllocation}, map[string]uint32{MetaAllocation: allocationContextID}, RepAck},
	}
	for _, c := range cases {
		if ctxs, r := tc.metaOpt(c.opt, c.export, c.queries...); r.typ != c.reply || !reflect.DeepEqual(ctxs, c.want) {
			t.Errorf("%s: reply %#x %q, contexts %v; want %#x %v", c.name, r.typ, r.data, ctxs, c.reply, c.want)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0, 4, 'v'}, append(appendMetaContextRequest(nil, "vol0"), 0), be.AppendUint32(be.AppendUint32(nil, 0), 1<<30)} {
		tc.option(OptSetMetaContext, bad)
		if r := tc.optReply(); r.typ != RepErrInvalid {
			t.Errorf("SET with data %x: %#x", bad, r.typ)
		}
	}
	// The last SET failed, and a failed SET clears the selection.
	if r := tc.goOpt(OptGo, "vol0"); r.typ != RepAck {
		t.Fatalf("GO: %#x", r.typ)
	}
	if r := tc.doS(CmdBlockStatus, 0, 0, testBS, nil); r.errno != EINVAL {
		t.Fatalf("BLOCK_STATUS after a failed SET: %+v", r)
	}
}

// statusless hides Memory's BlockStatus: a backend that knows nothing of
// allocation.
type statusless struct{ Backend }

func TestBlockStatus(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	ts := startServer(t, mem)
	tc, ctxs := connectStructured(t, ts.addr, MetaAllocation)
	id, ok := ctxs[MetaAllocation]
	if !ok || id == 0 {
		t.Fatalf("SET base:allocation: %v", ctxs)
	}
	hz := StateHole | StateZero
	block := bytes.Repeat([]byte{7}, testBS)
	for _, b := range []uint64{2, 5, 6} {
		if r := tc.doS(CmdWrite, 0, b*testBS, testBS, block); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	cases := []struct {
		name      string
		flags     uint16
		off       uint64
		length    uint32
		want      [][2]uint32
		wantErrno uint32
	}{
		{"aligned", 0, 0, 8 * testBS, [][2]uint32{{2 * testBS, hz}, {testBS, 0}, {2 * testBS, hz}, {2 * testBS, 0}, {testBS, hz}}, 0},
		{"unaligned edges", 0, 100, 3 * testBS, [][2]uint32{{2*testBS - 100, hz}, {testBS, 0}, {100, hz}}, 0},
		{"REQ_ONE", CmdFlagReqOne, 0, 8 * testBS, [][2]uint32{{2 * testBS, hz}}, 0},
		{"REQ_ONE inside an extent", CmdFlagReqOne, testBS, 10, [][2]uint32{{10, hz}}, 0},
		{"the whole export", 0, 0, testSize, [][2]uint32{{2 * testBS, hz}, {testBS, 0}, {2 * testBS, hz}, {2 * testBS, 0}, {testSize - 7*testBS, hz}}, 0},
		{"past the end", 0, testSize - testBS, 2 * testBS, nil, EINVAL},
		{"length 0", 0, 0, 0, nil, EINVAL},
		{"FUA is not a BLOCK_STATUS flag", CmdFlagFUA, 0, testBS, nil, EINVAL},
	}
	for _, c := range cases {
		r := tc.doS(CmdBlockStatus, c.flags, c.off, c.length, nil)
		if r.errno != c.wantErrno || !reflect.DeepEqual(r.extents, c.want) || (r.errno == 0 && r.ctx != id) {
			t.Errorf("%s: errno %d, context %d, extents %v; want errno %d, %v", c.name, r.errno, r.ctx, r.extents, c.wantErrno, c.want)
		}
	}
	// A backend error is an error chunk.
	mem.Fail = func(op string, off, n int64) error {
		if op == "status" {
			return WithErrno(errors.New("map unavailable"), ENOTSUP)
		}
		return nil
	}
	if r := tc.doS(CmdBlockStatus, 0, 0, testBS, nil); r.errno != ENOTSUP || r.msg != "map unavailable" {
		t.Errorf("failing status: %+v", r)
	}

	// A backend without BlockStatus: all allocated.
	ts2 := startServer(t, mem, func(s *Server) { s.Export.Backend = statusless{mem} })
	tc2, _ := connectStructured(t, ts2.addr, MetaAllocation)
	if r := tc2.doS(CmdBlockStatus, 0, 100, 5*testBS, nil); r.errno != 0 || !reflect.DeepEqual(r.extents, [][2]uint32{{5 * testBS, 0}}) {
		t.Errorf("statusless backend: %+v", r)
	}
}

// badStatus is a backend whose BlockStatus returns what it is told.
type badStatus struct {
	*Memory
	exts []Extent
}

func (b badStatus) BlockStatus(ctx context.Context, off, n int64) ([]Extent, error) {
	return b.exts, nil
}

// TestBlockStatusFromBackend checks what the server makes of a backend's
// extents: cut to the request, merged, never empty, capped.
func TestBlockStatusFromBackend(t *testing.T) {
	mem := NewMemory(testSize, testBS, false)
	many := make([]Extent, 3*maxExtents)
	for i := range many {
		many[i] = Extent{Length: 1, Flags: uint32(i % 2)}
	}
	cases := []struct {
		name  string
		exts  []Extent
		want  [][2]uint32
		errno uint32
	}{
		{"cut to the request", []Extent{{testBS, StateHole}, {1 << 40, 0}}, [][2]uint32{{testBS, StateHole}, {testBS, 0}}, 0},
		{"merged", []Extent{{100, 0}, {200, 0}, {300, StateZero}}, [][2]uint32{{300, 0}, {300, StateZero}}, 0},
		{"a prefix", []Extent{{10, 0}}, [][2]uint32{{10, 0}}, 0},
		{"none", nil, nil, EIO},
		{"an empty extent", []Extent{{10, 0}, {0, 0}}, nil, EIO},
		{"a negative extent", []Extent{{-5, 0}}, nil, EIO},
	}
	for _, c := range cases {
		ts := startServer(t, mem, func(s *Server) { s.Export.Backend = badStatus{mem, c.exts} })
		tc, _ := connectStructured(t, ts.addr, MetaAllocation)
		if r := tc.doS(CmdBlockStatus, 0, 0, 2*testBS, nil); r.errno != c.errno || !reflect.DeepEqual(r.extents, c.want) {
			t.Errorf("%s: errno %d extents %v; want %d %v", c.name, r.errno, r.extents, c.errno, c.want)
		}
	}
	ts := startServer(t, mem, func(s *Server) { s.Export.Backend = badStatus{mem, many} })
	tc, _ := connectStructured(t, ts.addr, MetaAllocation)
	if r := tc.doS(CmdBlockStatus, 0, 0, testSize, nil); r.errno != 0 || len(r.extents) != maxExtents {
		t.Errorf("%d extents: errno %d, %d descriptors, want %d", len(many), r.errno, len(r.extents), maxExtents)
	}
}
