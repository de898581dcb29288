package emu

import (
	"sync"
	"testing"
)

// TestQPCloseWaits: two Closes of one QP at once, as a consumer's
// release (target/conn.go) and the NIC's shutdown (Provider.Close,
// which destroys every QP) meet when a gateway is killed: each returns
// only once the QP is gone, so that the CQ's destroy after it finds no
// QP on it. Before, the second Close returned at once while the first
// still held the QP on the CQ and PD: the CQ's destroy failed "used by
// 1 QPs", the PD's "with 1 objects on it", and both leaked (the killed
// gateway's target logged it under load in bench's
// TestMultipathFailover).
func TestQPCloseWaits(t *testing.T) {
	for i := range 300 {
		x := newPair(t, Config{}, 4096)
		start := make(chan struct{})
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := x.qa.Close(); err != nil {
					errs[j] = err
					return
				}
				errs[j] = x.cqa.Close()
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: a QP's Close, then its CQ's, beside another Close of the QP: %v", i, err)
			}
		}
	}
}
