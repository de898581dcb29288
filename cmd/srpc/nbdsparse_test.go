package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// span is a run of the volume as a map reports it.
type span struct {
	Off, Len int64
	Data     bool
}

// merge joins adjacent spans of the same kind, so that maps that split
// runs differently (per request, per answer) compare equal.
func merge(in []span) []span {
	var out []span
	for _, s := range in {
		if k := len(out) - 1; k >= 0 && out[k].Data == s.Data && out[k].Off+out[k].Len == s.Off {
			out[k].Len += s.Len
			continue
		}
		out = append(out, s)
	}
	return out
}

// TestNBDSparse is issue 24's black-box test: a pebble volume with a few
// ranges written by srpc import, served by srpc nbd; nbdinfo --map and
// qemu-img map show holes and data where they are (base:allocation over
// structured replies, from srpd's extents), and nbdcopy copies it to a
// sparse file with the same bytes and the holes kept.
func TestNBDSparse(t *testing.T) {
	needNBDTools(t)
	const size = 64 << 20
	srpc, dir, addr := startTarget(t, "64MiB")

	// Three ranges of random data; the rest was never written.
	want := make([]byte, size)
	written := []span{{4 << 20, 1 << 20, true}, {20 << 20, 64 << 10, true}, {size - 8<<10, 8 << 10, true}}
	for i, w := range written {
		chunk := want[w.Off : w.Off+w.Len]
		rand.Read(chunk)
		f := filepath.Join(dir, fmt.Sprintf("range%d", i))
		if err := os.WriteFile(f, chunk, 0o644); err != nil {
			t.Fatal(err)
		}
		e2etest.MustRun(t, srpc, "import", "--target", addr, "--quiet", "--offset", fmt.Sprint(w.Off), "vol0", f)
	}
	var wantMap []span
	pos := int64(0)
	for _, w := range written {
		if w.Off > pos {
			wantMap = append(wantMap, span{pos, w.Off - pos, false})
		}
		wantMap = append(wantMap, w)
		pos = w.Off + w.Len
	}

	sock := filepath.Join(dir, "nbd.sock")
	p := startNBD(t, srpc, addr, "vol0", sock)
	uri := "nbd+unix:///vol0?socket=" + sock
	run := func(name string, args ...string) []byte {
		t.Helper()
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				out = append(out, ee.Stderr...)
			}
			t.Fatalf("%s %s: %v\n%s\nsrpc nbd log:\n%s", name, strings.Join(args, " "), err, out, p.Output())
		}
		return out
	}

	// nbdinfo --map: type 3 ("hole,zero") and 0 ("data").
	out := run("nbdinfo", "--map", "--json", uri)
	var nmap []struct {
		Offset, Length int64
		Type           uint32
		Description    string
	}
	if err := json.Unmarshal(out, &nmap); err != nil {
		t.Fatalf("nbdinfo --map --json: %v\n%s", err, out)
	}
	var got []span
	for _, e := range nmap {
		switch e.Type {
		case 0, 3:
			got = append(got, span{e.Offset, e.Length, e.Type == 0})
		default:
			t.Fatalf("nbdinfo --map: type %d (%s) at %d", e.Type, e.Description, e.Offset)
		}
	}
	if got = merge(got); fmt.Sprint(got) != fmt.Sprint(wantMap) {
		t.Errorf("nbdinfo --map:\n got %v\nwant %v\n%s", got, wantMap, out)
	}
	t.Logf("nbdinfo --map:\n%s", run("nbdinfo", "--map", uri))

	// qemu-img map agrees: data where written, zero elsewhere.
	qemuURI := "nbd:unix:" + sock + ":exportname=vol0"
	out = run("qemu-img", "map", "--output=json", qemuURI)
	var qmap []struct {
		Start, Length int64
		Data, Zero    bool
	}
	if err := json.Unmarshal(out, &qmap); err != nil {
		t.Fatalf("qemu-img map: %v\n%s", err, out)
	}
	got = got[:0]
	for _, e := range qmap {
		if e.Data == e.Zero {
			t.Fatalf("qemu-img map: data %v zero %v at %d", e.Data, e.Zero, e.Start)
		}
		got = append(got, span{e.Start, e.Length, e.Data})
	}
	if got = merge(got); fmt.Sprint(got) != fmt.Sprint(wantMap) {
		t.Errorf("qemu-img map:\n got %v\nwant %v\n%s", got, wantMap, out)
	}

	// nbdcopy to a file: the same bytes, and holes where the volume has
	// them (SEEK_DATA finds data only in the written ranges).
	dst := filepath.Join(dir, "copy.img")
	run("nbdcopy", uri, dst)
	copied, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copied, want) {
		t.Fatal("nbdcopy's copy differs from what was written")
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fileData []span
	for pos := int64(0); pos < size; {
		d, err := unix.Seek(int(f.Fd()), pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h, err := unix.Seek(int(f.Fd()), d, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		fileData = append(fileData, span{d, h - d, true})
		pos = h
	}
	var allocated int64
	for _, s := range fileData {
		allocated += s.Len
		inside := false
		for _, w := range written {
			inside = inside || s.Off >= w.Off/(1<<20)*(1<<20) && s.Off+s.Len <= (w.Off+w.Len+1<<20-1)/(1<<20)*(1<<20)
		}
		if !inside {
			t.Errorf("the copy has data at %d (%d bytes), where the volume has a hole", s.Off, s.Len)
		}
	}
	if allocated > 4<<20 {
		t.Errorf("the copy allocates %d bytes for %d written: holes not kept (%v)", allocated, 1<<20+64<<10+8<<10, fileData)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("srpc nbd exit %d after SIGTERM: %s", code, p.Output())
	}
}
