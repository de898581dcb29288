package initiator_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestResizeReachesOpenVolume: a volume grown and then shrunk on the
// target while a session has it open (as `srpd volume resize` does:
// the store, then Target.VolumeResized) reaches the session without a
// reopen: Volume.Size and OnResize follow with the next I/O, a read in
// the grown part works, and after the shrink a read past the new end
// fails with an error that says the volume was resized (and then,
// refused locally, "beyond the end"), never "target: medium error".
// Before, Size kept the size of the OPEN, the grown part was out of
// range and reads past a shrink failed as a medium error.
func TestResizeReachesOpenVolume(t *testing.T) {
	const mib = 1 << 20
	r := newRig(t, emu.Config{Wire: emu.WireLoop}, mib, target.Config{})
	s := r.dial(t, initiator.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var seen []int64 // OnResize runs on the session's goroutine; read after a completion
	v, err := s.Open(ctx, "vol0", initiator.OpenOptions{OnResize: func(n int64) { seen = append(seen, n) }})
	if err != nil {
		t.Fatal(err)
	}
	resize := func(n int64) {
		t.Helper()
		sv, err := r.store.Open("vol0")
		if err != nil {
			t.Fatal(err)
		}
		defer sv.Close()
		// In the order srpd takes: the sessions learn a shrink first.
		if n < sv.Size() {
			if err := r.tgt.VolumeResized(ctx, "vol0", n); err != nil {
				t.Fatal(err)
			}
		}
		grow := n > sv.Size()
		if err := sv.Resize(n); err != nil {
			t.Fatal(err)
		}
		if grow {
			if err := r.tgt.VolumeResized(ctx, "vol0", n); err != nil {
				t.Fatal(err)
			}
		}
	}
	buf := make([]byte, 4096)
	read := func(off int64) error {
		_, err := v.ReadAtContext(ctx, buf, off)
		return err
	}

	resize(2 * mib)
	if err := read(0); err != nil {
		t.Fatalf("read after the grow: %v", err)
	}
	if v.Size() != 2*mib || len(seen) != 1 || seen[0] != 2*mib {
		t.Fatalf("after a grow and one read: Size %d, OnResize %v; want %d once", v.Size(), seen, 2*mib)
	}
	if err := read(3 * mib / 2); err != nil {
		t.Fatalf("read in the grown part: %v", err)
	}

	resize(mib / 2)
	err = read(3 * mib / 4) // sent while the session still believes 2 MiB
	var ioe *initiator.IOError
	if !errors.As(err, &ioe) || ioe.Sense != initiator.SenseOutOfRange || !strings.Contains(err.Error(), "resized from 2097152 to 524288 bytes") ||
		strings.Contains(err.Error(), "medium error") {
		t.Fatalf("read past the new end, sent before the notice: %v; want out of range saying it was resized", err)
	}
	t.Log(err)
	if v.Size() != mib/2 || len(seen) != 2 || seen[1] != mib/2 {
		t.Fatalf("after the shrink: Size %d, OnResize %v", v.Size(), seen)
	}
	if err := read(3 * mib / 4); err != io.EOF {
		t.Fatalf("ReadAt past the new end: %v, want io.EOF", err)
	}
	if _, err := v.WriteAt(buf, 3*mib/4); !errors.Is(err, initiator.ErrInvalid) || !strings.Contains(err.Error(), "beyond the end") {
		t.Fatalf("write past the new end: %v, want beyond the end", err)
	}
	if err := read(0); err != nil {
		t.Fatalf("read within the new end: %v", err)
	}
	if len(seen) != 2 {
		t.Fatalf("OnResize called again without a change: %v", seen)
	}
}
