package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/internal/e2etest"
)

// startNBD runs 'srpc nbd --socket SOCK' against srpd at addr and waits
// until the socket answers.
func startNBD(t *testing.T, srpc, addr, vol, sock string) *e2etest.Proc {
	t.Helper()
	return startNBDWith(t, srpc, "nbd", "--target", addr, "--socket", sock, vol)
}

// startNBDWith runs srpc with args and waits until it says it serves.
func startNBDWith(t *testing.T, srpc string, args ...string) *e2etest.Proc {
	t.Helper()
	p := e2etest.StartProc(t, srpc, args...)
	p.WaitOutput(t, "serving", 30*time.Second)
	return p
}

func TestNBDUsage(t *testing.T) {
	_, srpc := e2etest.Binaries(t)
	for _, args := range [][]string{
		{"nbd", "vol0"},
		{"nbd", "--socket", "/tmp/x", "--listen", "127.0.0.1:0", "vol0"},
		{"nbd", "--socket", "/tmp/x"},
		{"nbd", "--listen", "127.0.0.1:0", "--tls-cert", "cert.pem", "vol0"},
		{"nbd", "--listen", "127.0.0.1:0", "--tls-client-ca", "ca.pem", "vol0"},
	} {
		if r := e2etest.Run(t, nil, srpc, args...); r.Code != 2 {
			t.Errorf("srpc %v: exit %d, want 2 (stderr %q)", args, r.Code, r.Stderr)
		}
	}
}

// TestNBDRaw speaks NBD byte by byte to srpc nbd in front of a real srpd:
// the adapter, the registered buffers and the error mapping, no external
// tools needed.
func TestNBDRaw(t *testing.T) {
	srpc, dir, addr := startTarget(t, "64MiB", "--backend", "memory")
	sock := filepath.Join(dir, "nbd.sock")
	p := startNBD(t, srpc, addr, "vol0", sock)

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	be := binary.BigEndian
	read := func(n int) []byte {
		t.Helper()
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			t.Fatalf("read: %v\n%s", err, p.Output())
		}
		return b
	}
	if g := read(18); string(g[:16]) != "NBDMAGICIHAVEOPT" {
		t.Fatalf("greeting %q", g)
	}
	opt := be.AppendUint32(nil, 3) // fixed newstyle, no zeroes
	opt = be.AppendUint64(opt, 0x49484156454f5054)
	opt = be.AppendUint32(opt, 7) // NBD_OPT_GO
	opt = be.AppendUint32(opt, 4+4+2)
	opt = be.AppendUint32(opt, 4)
	opt = append(opt, "vol0"...)
	opt = be.AppendUint16(opt, 0)
	c.Write(opt)
	var size uint64
	for {
		h := read(20)
		data := read(int(be.Uint32(h[16:])))
		typ := be.Uint32(h[12:])
		if typ == 1 {
			break
		}
		if typ != 3 {
			t.Fatalf("NBD_OPT_GO reply %#x %q", typ, data)
		}
		if be.Uint16(data) == 0 {
			size = be.Uint64(data[2:])
		}
	}
	if size != 64<<20 {
		t.Fatalf("export size %d", size)
	}
	cookie := uint64(0)
	do := func(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
		t.Helper()
		cookie++
		b := be.AppendUint32(nil, 0x25609513)
		b = be.AppendUint16(b, flags)
		b = be.AppendUint16(b, typ)
		b = be.AppendUint64(b, cookie)
		b = be.AppendUint64(b, off)
		b = be.AppendUint32(b, length)
		c.Write(append(b, payload...))
		h := read(16)
		if be.Uint64(h[8:]) != cookie {
			t.Fatalf("cookie %d, want %d", be.Uint64(h[8:]), cookie)
		}
		errno := be.Uint32(h[4:])
		if typ == 0 && errno == 0 {
			return 0, read(int(length))
		}
		return errno, nil
	}
	data := make([]byte, 3<<20) // above the 1 MiB max transfer: split by the volume
	rand.Read(data)
	if errno, _ := do(1, 1, 4096, uint32(len(data)), data); errno != 0 {
		t.Fatalf("write FUA: errno %d", errno)
	}
	if _, got := do(0, 0, 4096, uint32(len(data)), nil); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if errno, _ := do(1, 0, 1000, 7, []byte("unalign")); errno != 0 {
		t.Fatalf("unaligned write: errno %d", errno)
	}
	if _, got := do(0, 0, 1000, 7, nil); string(got) != "unalign" {
		t.Fatalf("unaligned read %q", got)
	}
	if errno, _ := do(6, 0, 4096+100, 8192, nil); errno != 0 { // WRITE_ZEROES, unaligned
		t.Fatalf("write zeroes: errno %d", errno)
	}
	want := append([]byte(nil), data[:100]...)
	want = append(want, make([]byte, 8192)...)
	want = append(want, data[100+8192:20000]...)
	if _, got := do(0, 0, 4096, 20000, nil); !bytes.Equal(got, want) {
		t.Fatal("unaligned write zeroes")
	}
	if errno, _ := do(4, 0, 0, 1<<20, nil); errno != 0 { // TRIM
		t.Fatalf("trim: errno %d", errno)
	}
	if errno, _ := do(3, 0, 0, 0, nil); errno != 0 { // FLUSH
		t.Fatalf("flush: errno %d", errno)
	}
	if errno, _ := do(1, 0, size, 512, make([]byte, 512)); errno != 28 {
		t.Fatalf("write past the end: errno %d, want ENOSPC", errno)
	}
	if errno, got := do(0, 0, 0, 0, nil); errno != 0 || len(got) != 0 {
		t.Fatalf("empty read: errno %d, %d bytes", errno, len(got))
	}
	disc := be.AppendUint32(nil, 0x25609513)
	disc = be.AppendUint16(disc, 0)
	disc = be.AppendUint16(disc, 2)
	c.Write(append(disc, make([]byte, 20)...))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after NBD_CMD_DISC: %v", err)
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("srpc nbd exit %d after SIGTERM: %s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "flushed") {
		t.Errorf("no flush on stop: %s", p.Output())
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("socket left behind")
	}
}

// TestNBDInterop runs the real clients: nbdinfo and nbdcopy (libnbd-bin)
// and qemu-img (qemu-utils). CI installs them; elsewhere it skips.
func TestNBDInterop(t *testing.T) {
	needNBDTools(t)
	srpc, dir, addr := startTarget(t, "256MiB", "--backend", "memory")
	sock := filepath.Join(dir, "nbd.sock")
	p := startNBD(t, srpc, addr, "vol0", sock)
	uri := "nbd+unix:///vol0?socket=" + sock
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s\nsrpc nbd log:\n%s", name, strings.Join(args, " "), err, out, p.Output())
		}
		return string(out)
	}

	info := run("nbdinfo", uri)
	for _, want := range []string{"export-size: 268435456", "can_flush: true", "can_fua: true", "can_trim: true",
		"can_zero: true", "can_multi_conn: true", "block_size_minimum: 4096"} {
		if !strings.Contains(info, want) {
			t.Errorf("nbdinfo lacks %q:\n%s", want, info)
		}
	}
	if out := run("nbdinfo", "--list", "nbd+unix://?socket="+sock); !strings.Contains(out, `export="vol0"`) {
		t.Errorf("nbdinfo --list:\n%s", out)
	}

	// qemu-img in and out: 48 MiB of random data.
	img := make([]byte, 48<<20)
	rand.Read(img)
	in := filepath.Join(dir, "in.raw")
	if err := os.WriteFile(in, img, 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(img)
	qemuURI := "nbd:unix:" + sock + ":exportname=vol0"
	run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", in, qemuURI)
	out := filepath.Join(dir, "out.raw")
	run("qemu-img", "convert", "-f", "raw", "-O", "raw", qemuURI, out)
	if st, err := os.Stat(out); err != nil || st.Size() != 256<<20 {
		t.Fatalf("qemu-img output: %v %v", st, err)
	}
	if err := os.Truncate(out, int64(len(img))); err != nil {
		t.Fatal(err)
	}
	if got := e2etest.FileSum(t, out); got != want {
		t.Fatal("qemu-img convert out of the volume differs from what went in")
	}

	// nbdcopy (multi-conn, many requests in flight) out and back in at an offset-free copy.
	out2 := filepath.Join(dir, "out2.raw")
	run("nbdcopy", uri, out2)
	os.Truncate(out2, int64(len(img)))
	if e2etest.FileSum(t, out2) != want {
		t.Fatal("nbdcopy out of the volume differs")
	}
	rand.Read(img)
	os.WriteFile(in, img, 0o644)
	run("nbdcopy", in, uri)
	run("qemu-img", "convert", "-f", "raw", "-O", "raw", qemuURI, out)
	os.Truncate(out, int64(len(img)))
	if e2etest.FileSum(t, out) != sha256.Sum256(img) {
		t.Fatal("nbdcopy into the volume, qemu-img out: differs")
	}

	if code := p.Stop(t); code != 0 {
		t.Fatalf("srpc nbd exit %d after SIGTERM: %s", code, p.Output())
	}
}

// needNBDTools skips the test unless nbdinfo, nbdcopy (libnbd-bin) and
// qemu-img (qemu-utils) are installed, as CI installs them.
func needNBDTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"nbdinfo", "nbdcopy", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (apt-get install libnbd-bin qemu-utils): skipping", tool)
		}
	}
}
