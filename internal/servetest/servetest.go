// Package servetest runs a target for the in-process tests of the
// packages that talk to one (initiator, cmd/srpd, cmd/srpc): Serve
// serves a target on a listener until the test ends, and then shuts it
// down and releases what the test handed it, in order; a Rig is such a
// target over a memory store on the software NIC, with sessions on it.
//
//	addr := servetest.Serve(t, tgt, nic.Listen, nic.Close, store.Close)
//	s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addr})
//
//	r := servetest.NewRig(t)
//	r.Store.Create("vol0", 1<<20, 4096)
//	s, v := r.Open(t, "vol0", initiator.Config{})
package servetest

import (
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// Serve runs tgt on a listener from listen until the test ends. The
// test's cleanup shuts tgt down (10 s at most), waits for Serve to
// return, closes the listener and then each of closers, in order. Serve
// returns the listener's address.
func Serve(tb testing.TB, tgt *target.Target, listen func(context.Context, string) (transport.Listener, error), closers ...func() error) string {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := listen(ctx, "")
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- tgt.Serve(ctx, l) }()
	tb.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		tgt.Shutdown(sctx)
		cancel()
		<-served
		l.Close()
		for _, c := range closers {
			c()
		}
	})
	return l.Addr()
}

// Rig is a target serving a memory store on one software NIC (loop
// wire), for tests that need a live target and sessions on it.
type Rig struct {
	Store  block.Store
	Target *target.Target
	NIC    *emu.Provider
	Addr   string
}

// NewRig starts a target named "t" over an empty memory store; the
// test's cleanup stops it and closes the NIC and the store.
func NewRig(tb testing.TB) *Rig {
	tb.Helper()
	st := block.NewMemStore()
	nic, err := emu.New(emu.Config{Wire: emu.WireLoop})
	if err != nil {
		st.Close()
		tb.Fatal(err)
	}
	tgt, err := target.New(target.Config{Name: "t", Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		nic.Close()
		st.Close()
		tb.Fatal(err)
	}
	addr := Serve(tb, tgt, nic.Listen, nic.Close, st.Close)
	return &Rig{Store: st, Target: tgt, NIC: nic, Addr: addr}
}

// Open dials a session with cfg (Provider and Addr filled in, Name
// "host" unless set) and opens volume on it, 10 s at most; the test's
// cleanup closes the session.
func (r *Rig) Open(tb testing.TB, volume string, cfg initiator.Config) (*initiator.Session, *initiator.Volume) {
	tb.Helper()
	cfg.Provider, cfg.Addr = r.NIC, r.Addr
	if cfg.Name == "" {
		cfg.Name = "host"
	}
	s := Dial(tb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s.Open(ctx, volume, initiator.OpenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return s, v
}

// Dial dials with cfg (10 s at most); the test's cleanup closes the
// session.
func Dial(tb testing.TB, cfg initiator.Config) *initiator.Session {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}
