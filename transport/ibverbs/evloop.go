//go:build linux && cgo && ibverbs

package ibverbs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The device's two event channels, its async events (ibv_get_async_event)
// and the provider's rdma_cm events (rdma_get_cm_event), are each read by
// one goroutine the same way: poll the channel's nonblocking fd together
// with an eventfd, drain every queued event when the channel is readable,
// and return when the eventfd is written.

// newStopFD makes the eventfd that stops an event goroutine (stopEvents).
func newStopFD() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("ibverbs: eventfd: %w", err)
	}
	return fd, nil
}

// readEvents calls drain each time fd is readable, until stopFD is written
// or poll fails; it closes done when it returns.
func readEvents(fd, stopFD int, done chan<- struct{}, drain func()) {
	defer close(done)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(stopFD), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		drain()
	}
}

// stopEvents ends the readEvents that stopFD stops, waits for it to close
// done, and closes stopFD.
func stopEvents(stopFD int, done <-chan struct{}) {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	_, _ = unix.Write(stopFD, one)
	<-done
	unix.Close(stopFD)
}
