package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
)

// TestSRPOpenBecomingReady: over T10 SRP the store hangs in vol1's open
// at login, so srpd leaves LUN 1 opening and answers its commands NOT
// READY, becoming ready. Open of lun1 asks again until its context ends
// (ErrNotReady, as a gosrp OPEN the target is still opening), and once
// the store answers, Open succeeds and the unit serves I/O. Before, the
// LUN was answered LOGICAL UNIT NOT SUPPORTED until it opened, and Open
// failed at once as if it would never be there.
func TestSRPOpenBecomingReady(t *testing.T) {
	cat, p, addr, _ := newGatedRig(t, 200*time.Millisecond)
	release := cat.gate("vol1")
	t.Cleanup(release)
	s := dial(t, initiator.Config{Provider: p, Addr: addr, Name: "srp-late", Protocol: initiator.ProtocolSRP})

	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	_, err := s.Open(ctx, "lun1", initiator.OpenOptions{})
	cancel()
	if !errors.Is(err, initiator.ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open of a LUN whose volume is still opening, until its context ends: %v, want ErrNotReady and the context's error", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opened := make(chan error, 1)
	var v *initiator.Volume
	go func() {
		var err error
		v, err = s.Open(ctx, "lun1", initiator.OpenOptions{})
		opened <- err
	}()
	release()
	if err := <-opened; err != nil {
		t.Fatalf("Open of lun1 once its volume opened: %v", err)
	}
	want := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := v.WriteAtContext(ctx, want, 8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := v.ReadAtContext(ctx, got, 8192); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back from lun1: %v, equal %t", err, bytes.Equal(got, want))
	}
}

// TestSRPReloginBecomingReady: the connection is lost, and the store
// then hangs in vol1's open for the re-login, so srpd answers LUN 1 NOT
// READY, becoming ready. The session's check of the unit
// (srp_identity.go) must ask again, not take the LUN for gone: a write
// to lun1 across the loss waits and succeeds once the store answers,
// while lun0 is served meanwhile. Were the LUN answered LOGICAL UNIT NOT
// SUPPORTED, the write would fail with ErrVolumeGone.
func TestSRPReloginBecomingReady(t *testing.T) {
	cat, p, addr, _ := newGatedRig(t, 200*time.Millisecond)
	s := dial(t, initiator.Config{Provider: p, Addr: addr, Name: "srp-late", Protocol: initiator.ProtocolSRP, LossTimeout: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v0, v1 := openNamed(t, ctx, s, "lun0"), openNamed(t, ctx, s, "lun1")
	opens, _ := cat.counts("vol1")
	release := cat.gate("vol1")
	t.Cleanup(release)
	for _, q := range p.QPs() {
		if err := p.InjectQPError(q, 0); err != nil {
			t.Fatal(err)
		}
	}
	v1done := make(chan error, 1)
	go func() { v1done <- write(v1, 0, 30*time.Second) }()
	if err := write(v0, 0, 10*time.Second); err != nil {
		t.Fatalf("write to lun0 across the loss, vol1's store hung: %v", err)
	}
	waitUntil(t, "vol1's open for the re-login in the store", func() bool { n, _ := cat.counts("vol1"); return n > opens })
	release()
	if err := <-v1done; err != nil {
		t.Fatalf("write to lun1 once its store answered: %v", err)
	}
}
