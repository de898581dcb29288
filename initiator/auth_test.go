package initiator_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

func TestAuthentication(t *testing.T) {
	secrets := func(ini string) ([]byte, bool) {
		if ini == "host-a" {
			return []byte("correct horse"), true
		}
		return nil, false
	}
	r := newRig(t, emu.Config{Seed: 11}, 1<<20, target.Config{Secrets: secrets})
	dial := func(name string, secret []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := initiator.Dial(ctx, initiator.Config{Provider: r.ip, Addr: r.addr, Name: name, Secret: secret})
		if err == nil {
			_, err = s.Open(ctx, "vol0", initiator.OpenOptions{})
			s.Close()
		}
		return err
	}
	var le *initiator.LoginError
	if err := dial("host-a", []byte("wrong")); !errors.As(err, &le) || le.Reason != initiator.RejectAuthFailed {
		t.Fatalf("wrong secret: %v", err)
	}
	if err := dial("host-a", nil); !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("no secret: %v", err)
	}
	if err := dial("host-a", []byte("correct horse")); err != nil {
		t.Fatalf("right secret: %v", err)
	}
	// An initiator that holds a secret refuses a target that cannot prove
	// it knows it (here: a target that never challenges).
	if err := dial("host-b", []byte("correct horse")); !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("unauthenticated target accepted: %v", err)
	}
	if err := dial("host-b", nil); err != nil {
		t.Fatalf("no authentication required: %v", err)
	}
}

func TestACL(t *testing.T) {
	acl := &target.ACL{DenyByDefault: true, Rules: []target.ACLRule{
		{Initiator: "reader", Volume: "vol0", Access: target.AccessReadOnly},
		{Initiator: "writer", Volume: "*", Access: target.AccessReadWrite},
	}}
	r := newRig(t, emu.Config{Seed: 12}, 1<<20, target.Config{ACL: acl})
	ctx := context.Background()
	open := func(name string) (*initiator.Volume, error) {
		s := r.dial(t, initiator.Config{Name: name})
		return s.Open(ctx, "vol0", initiator.OpenOptions{})
	}
	if _, err := open("stranger"); err == nil {
		t.Fatal("a denied initiator opened the volume")
	}
	v, err := open("reader")
	if err != nil {
		t.Fatal(err)
	}
	if !v.ReadOnly() {
		t.Fatal("read-only ACL opened read-write")
	}
	if _, err := v.WriteAt(make([]byte, 4096), 0); !errors.Is(err, initiator.ErrReadOnly) {
		t.Fatalf("write through a read-only ACL: %v", err)
	}
	if _, err := v.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	w, err := open("writer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
}

// TestRevocation: an ACL change reaches a volume the session has open,
// within a second, as errors the caller can act on: narrowed to
// read-only, writes fail with ErrReadOnly; revoked, everything fails
// with ErrAccessDenied (fs.ErrPermission), and so does a new Open.
func TestRevocation(t *testing.T) {
	r := newRig(t, emu.Config{Seed: 14}, 1<<20, target.Config{})
	s := r.dial(t, initiator.Config{Name: "host-b"})
	ctx := context.Background()
	v := openVol0(t, ctx, s)
	buf := make([]byte, 4096)
	if _, err := v.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	within := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: not within 1s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	r.tgt.SetACL(&target.ACL{Rules: []target.ACLRule{{Initiator: "host-b", Volume: "vol0", Access: target.AccessReadOnly}}})
	var werr error
	within("write refused as read-only", func() bool {
		_, werr = v.WriteAt(buf, 0)
		return werr != nil
	})
	if !errors.Is(werr, initiator.ErrReadOnly) {
		t.Fatalf("write after the ACL narrowed to read-only: %v", werr)
	}
	if _, err := v.ReadAt(buf, 0); err != nil {
		t.Fatalf("read after the ACL narrowed to read-only: %v", err)
	}
	r.tgt.SetACL(&target.ACL{DenyByDefault: true})
	var rerr error
	within("read refused", func() bool {
		_, rerr = v.ReadAt(buf, 0)
		return rerr != nil
	})
	if !errors.Is(rerr, initiator.ErrAccessDenied) || !errors.Is(rerr, fs.ErrPermission) {
		t.Fatalf("read after revocation: %v", rerr)
	}
	if err := v.Flush(ctx); !errors.Is(err, initiator.ErrAccessDenied) {
		t.Fatalf("flush after revocation: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("close of a revoked volume: %v", err)
	}
	if _, err := s.Open(ctx, "vol0", initiator.OpenOptions{}); !errors.Is(err, initiator.ErrAccessDenied) {
		t.Fatalf("open after revocation: %v", err)
	}
}

// TestLiveACL: a rule change reaches the running target for the next open.
func TestLiveACL(t *testing.T) {
	r := newRig(t, emu.Config{Seed: 13}, 1<<20, target.Config{})
	s := r.dial(t, initiator.Config{Name: "host-c"})
	ctx := context.Background()
	if _, err := s.Open(ctx, "vol0", initiator.OpenOptions{}); err != nil {
		t.Fatal(err)
	}
	r.tgt.SetACL(&target.ACL{DenyByDefault: true})
	if _, err := s.Open(ctx, "vol0", initiator.OpenOptions{}); err == nil {
		t.Fatal("open allowed after the ACL denied it")
	}
	r.tgt.SetACL(nil)
	if _, err := s.Open(ctx, "vol0", initiator.OpenOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestIOErrorSentinels: the senses a caller acts on are errors.Is-able,
// access denied also as fs.ErrPermission.
func TestIOErrorSentinels(t *testing.T) {
	denied := error(&initiator.IOError{Op: initiator.OpRead, Sense: initiator.SenseAccessDenied})
	if !errors.Is(denied, initiator.ErrAccessDenied) || !errors.Is(denied, fs.ErrPermission) || errors.Is(denied, initiator.ErrReadOnly) {
		t.Errorf("access denied: %v", denied)
	}
	if wp := error(&initiator.IOError{Op: initiator.OpWrite, Sense: initiator.SenseWriteProtected}); !errors.Is(wp, initiator.ErrReadOnly) {
		t.Errorf("write protected is not ErrReadOnly: %v", wp)
	}
	if me := error(&initiator.IOError{Op: initiator.OpRead, Sense: initiator.SenseMediumError}); errors.Is(me, initiator.ErrAccessDenied) || errors.Is(me, initiator.ErrReadOnly) {
		t.Errorf("medium error matches a sentinel: %v", me)
	}
}
