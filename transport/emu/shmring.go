package emu

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The connection region of the shm wire is one sealed memfd the passive
// side creates and passes to the active side with the accept. It holds a
// header, one doorbell per side and four single-producer/single-consumer
// rings, a request ring and a response ring in each direction. Each ring
// has exactly one producing goroutine (the requester of one side, or the
// ring reader of one side answering as responder) and one consuming
// goroutine (the other side's ring reader), so no lock is ever taken on
// shared memory, and responses never wait behind requests.
//
//	0     header: magic u64, version u32, slot size u32, request slots u32, response slots u32
//	64    doorbell of side 0 (the active side): rsv u32, sleeping u32
//	128   doorbell of side 1 (the passive side)
//	192   sink gate of side 0 (u32, written by side 0: 1 = accepts READ data)
//	256   sink gate of side 1
//	320   placing flag into side 0's sinks (u32, written by side 1)
//	384   placing flag into side 1's sinks (u32, written by side 0)
//	4096  direction 1→0: request ring, response ring; then direction 0→1
//
// A ring is a producer cache line (tail u64), a consumer cache line
// (head u64), then its slots. Indices are free-running u64; a slot is
// index & (slots-1).
const (
	shmMagic     = 0x6d68737072736f67 // "gosrpshm"
	shmVersion   = 1
	shmReqSlots  = 512
	shmRespSlots = 512
	ringCtl      = 128
	reqRingLen   = ringCtl + shmReqSlots*shmSlot
	respRingLen  = ringCtl + shmRespSlots*shmSlot
	dirLen       = reqRingLen + respRingLen
	regionRings  = 4096
	regionLen    = regionRings + 2*dirLen
)

// initRegion writes the header of a fresh (zeroed) region.
func initRegion(m []byte) {
	binary.LittleEndian.PutUint64(m[0:], shmMagic)
	binary.LittleEndian.PutUint32(m[8:], shmVersion)
	binary.LittleEndian.PutUint32(m[12:], shmSlot)
	binary.LittleEndian.PutUint32(m[16:], shmReqSlots)
	binary.LittleEndian.PutUint32(m[20:], shmRespSlots)
}

// checkRegion validates the header of a region the peer created.
func checkRegion(m []byte) error {
	switch {
	case len(m) < regionLen:
		return fmt.Errorf("%w: region of %d bytes", errBadFrame, len(m))
	case binary.LittleEndian.Uint64(m[0:]) != shmMagic,
		binary.LittleEndian.Uint32(m[8:]) != shmVersion,
		binary.LittleEndian.Uint32(m[12:]) != shmSlot,
		binary.LittleEndian.Uint32(m[16:]) != shmReqSlots,
		binary.LittleEndian.Uint32(m[20:]) != shmRespSlots:
		return fmt.Errorf("%w: region header %x", errBadFrame, m[:24])
	}
	return nil
}

func u64At(m []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m[off : off+8 : off+8][0]))
}

func u32At(m []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&m[off : off+4 : off+4][0]))
}

// ring is one side's view of a ring: a producer uses ptail/phead, a
// consumer chead/ctail; each is touched by one goroutine only. The shared
// indices are the peer's to scribble on: the producer never trusts head
// and the consumer never trusts tail beyond checking them against the ring
// size.
type ring struct {
	tail, head *atomic.Uint64
	slots      []byte
	n          uint64

	ptail, phead uint64 // producer: next index to write, last head seen
	chead, ctail uint64 // consumer: next index to read, last tail seen
}

func newRing(m []byte, off, nslots int) ring {
	return ring{
		tail:  u64At(m, off),
		head:  u64At(m, off+64),
		slots: m[off+ringCtl : off+ringCtl+nslots*shmSlot : off+ringCtl+nslots*shmSlot],
		n:     uint64(nslots),
	}
}

func (r *ring) slot(i uint64) []byte {
	j := int(i&(r.n-1)) * shmSlot
	return r.slots[j : j+shmSlot : j+shmSlot]
}

// space reports whether k slots are free (producer). bad: the consumer's
// head is impossible.
func (r *ring) space(k uint64) (ok, bad bool) {
	if r.ptail+k-r.phead <= r.n {
		return true, false
	}
	h := r.head.Load()
	if h > r.ptail || r.ptail-h > r.n {
		return false, true
	}
	r.phead = h
	return r.ptail+k-r.phead <= r.n, false
}

// put copies k slots of descriptor bytes in and publishes them (producer;
// space(k) must have said yes).
func (r *ring) put(b []byte, k int) {
	for i := range k {
		copy(r.slot(r.ptail+uint64(i)), b[i*shmSlot:(i+1)*shmSlot])
	}
	r.ptail += uint64(k)
	r.tail.Store(r.ptail)
}

// avail is the number of published slots not yet consumed (consumer).
// bad: the producer's tail is impossible.
func (r *ring) avail() (uint64, bool) {
	if r.ctail == r.chead {
		t := r.tail.Load()
		if t-r.chead > r.n {
			return 0, false
		}
		r.ctail = t
	}
	return r.ctail - r.chead, true
}

// release gives k consumed slots back to the producer.
func (r *ring) release(k uint64) {
	r.chead += k
	r.head.Store(r.chead)
}

// gate lets a responder place READ data into a requester's sinks only
// while the requester accepts it: the requester closes it (QP to ERR)
// and then waits out a placement in progress, so no byte lands in a
// buffer the consumer already got back with a flushed completion.
type gate struct {
	open, placing *atomic.Uint32
}

func newGate(m []byte, side int) gate {
	return gate{open: u32At(m, 192+64*side), placing: u32At(m, 320+64*side)}
}

// bell is one side's doorbell flag in shared memory: its ring reader
// sets it just before it sleeps. A producer sends a wake-up (a WAKE
// datagram on the unix socket) only if it finds the flag set, and only
// the one producer that clears it does, so doorbells are coalesced and a
// busy consumer costs its producers no system call at all.
//
// The sleeping reader waits in Go's netpoller (the socket reader hands it
// the WAKE), not in FUTEX_WAIT: a goroutine blocked in a raw futex system
// call keeps its P until sysmon retakes it (20µs to 10ms), which starves
// the process's other goroutines on a small GOMAXPROCS.
type bell struct {
	sleeping *atomic.Uint32
}

func newBell(m []byte, side int) bell {
	return bell{sleeping: u32At(m, 64*(1+side)+4)}
}

// claim reports whether the caller should wake the consumer: it was
// asleep and no other producer has claimed the wake-up.
func (b bell) claim() bool {
	return b.sleeping.Load() != 0 && b.sleeping.CompareAndSwap(1, 0)
}
