// Package servetest runs a target for the in-process tests of the
// packages that talk to one (initiator, cmd/srpd): it serves the target
// on a listener until the test ends, and then shuts it down and releases
// what the test handed it, in order.
//
//	addr := servetest.Serve(t, tgt, nic.Listen, nic.Close, store.Close)
//	s, err := initiator.Dial(ctx, initiator.Config{Provider: nic, Addr: addr})
package servetest

import (
	"context"
	"testing"
	"time"

	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport"
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
