package transporttest

import (
	"context"
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// Completion queue rules: sharing a CQ between QPs, and Close waking a
// waiter.
func init() {
	register("CQ/CloseWakesWait", testCQCloseWakesWait)
	register("CQ/SharedQPNum", testSharedCQ)
}

// Closing a CQ wakes a goroutine blocked in Wait (cq.go).
func testCQCloseWakesWait(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	cq, err := dev.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	if cq.Depth() < 8 {
		t.Errorf("CreateCQ(8).Depth() = %d", cq.Depth())
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		done <- cq.Wait(ctx)
	}()
	<-started
	if err := cq.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	err = <-done
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on a CQ closed under it returned %v, want an error before the deadline (ErrClosed)", err)
	}
	if _, err := cq.Poll(make([]transport.WC, 1)); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Poll of a closed CQ: %v, want ErrClosed", err)
	}
}

// Completions of several QPs on one CQ name their QP.
func testSharedCQ(t *testing.T, p transport.Provider) {
	dev := openDevice(t, p)
	pd := allocPD(t, dev)
	cq := createCQ(t, dev, 64)
	b := newBuf(t, p, pd, transport.PageSize, transport.AccessLocalWrite)
	var qps []transport.QP
	for range 3 {
		qp, err := pd.CreateQP(transport.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { qp.Close() })
		if err := qp.Modify(transport.QPErr); err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
	}
	for i, qp := range qps {
		postSend(t, qp, sendWR(uint64(10*i), b.sge(0, 8)))
		postRecv(t, qp, recvWR(uint64(10*i+1), b.sge(0, 8)))
	}
	wcs := waitWC(t, cq, 6, Timeout)
	for k, wc := range wcs {
		i, r := int(wc.ID/10), wc.ID%10
		if i >= len(qps) || r > 1 {
			t.Errorf("completion %d has unknown ID %#x", k, wc.ID)
			continue
		}
		checkWC(t, wc, wc.ID, qps[i], transport.StatusWRFlushErr)
	}
}
