//go:build linux && cgo && ibverbs

package ibverbs

import (
	"sync"
	"unsafe"
)

// handleTable maps handles (index and generation) to C objects, so that Go
// objects never hand C a pointer the table has not vouched for: a post
// naming a closed MR or window fails with ErrClosed instead of touching
// freed memory.
type handleTable struct {
	mu    sync.RWMutex
	slots []handleSlot
	free  []uint32
}

type handleSlot struct {
	p       unsafe.Pointer
	gen     uint32
	closing bool
}

func (t *handleTable) add(p unsafe.Pointer) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var i uint32
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		t.slots = append(t.slots, handleSlot{})
		i = uint32(len(t.slots) - 1)
	}
	s := &t.slots[i]
	s.gen++
	s.p = p
	s.closing = false
	return uint64(s.gen)<<32 | uint64(i)
}

func (t *handleTable) slot(h uint64) *handleSlot {
	i := uint32(h)
	if int(i) >= len(t.slots) {
		return nil
	}
	s := &t.slots[i]
	if s.gen != uint32(h>>32) || s.p == nil {
		return nil
	}
	return s
}

// get returns the live object of h, or nil.
func (t *handleTable) get(h uint64) unsafe.Pointer {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := t.slot(h)
	if s == nil || s.closing {
		return nil
	}
	return s.p
}

// hold marks h as closing (gets fail from now on) and returns its object.
func (t *handleTable) hold(h uint64) unsafe.Pointer {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.slot(h)
	if s == nil || s.closing {
		return nil
	}
	s.closing = true
	return s.p
}

func (t *handleTable) unhold(h uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.slot(h); s != nil {
		s.closing = false
	}
}

func (t *handleTable) remove(h uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.slot(h); s != nil {
		s.p = nil
		s.closing = false
		t.free = append(t.free, uint32(h))
	}
}
