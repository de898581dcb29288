package target

// A connection's protection domain and registered buffers, and the spare
// sets a released connection leaves for the next accept.

import (
	"errors"
	"sync"

	"github.com/gosrp/gosrp/transport"
)

// connBufs is a connection's protection domain and the buffers it
// registers there: the IU arena (receives, then the IUs it sends) and
// the data arena (each slot's MaxTransfer bytes, the sink of its RDMA
// READs and the source of its RDMA WRITEs), each with its MR.
type connBufs struct {
	dev       transport.Device
	access    transport.Access // the data MR's
	pd        transport.PD
	iuArena   *transport.Arena
	dataArena *transport.Arena
	iuMR      transport.MR
	dataMR    transport.MR
}

// newConnBufs allocates a protection domain on dev and registers an IU
// arena of iuLen bytes and a data arena of dataLen bytes there. On
// failure it says which step failed and releases what it made.
func newConnBufs(dev transport.Device, iuLen, dataLen int, access transport.Access) (b *connBufs, step string, err error) {
	b = &connBufs{dev: dev, access: access}
	defer func() {
		if err != nil {
			b.close()
			b = nil
		}
	}()
	if b.pd, err = dev.AllocPD(); err != nil {
		return b, "alloc PD", err
	}
	if b.iuArena, err = transport.NewArena(iuLen, transport.ArenaOptions{}); err != nil {
		return b, "IU arena", err
	}
	if b.iuMR, err = b.pd.RegMR(b.iuArena, 0, iuLen, transport.AccessLocalWrite); err != nil {
		return b, "register IU buffers", err
	}
	if b.dataArena, err = transport.NewArena(dataLen, transport.ArenaOptions{}); err != nil {
		return b, "data arena", err
	}
	if b.dataMR, err = b.pd.RegMR(b.dataArena, 0, dataLen, access); err != nil {
		return b, "register data buffers", err
	}
	return b, "", nil
}

// fits reports whether b serves a connection on dev of those sizes and
// data access: the core's slots and receives are laid out on the MRs'
// exact lengths, so a set fits only the sizes it was registered for.
func (b *connBufs) fits(dev transport.Device, iuLen, dataLen int, access transport.Access) bool {
	return b.dev == dev && b.access == access && b.iuMR.Len() == iuLen && b.dataMR.Len() == dataLen
}

// close deregisters the MRs, then unmaps the arenas and frees the PD.
func (b *connBufs) close() error {
	var errs []error
	if b.iuMR != nil {
		errs = append(errs, b.iuMR.Close())
	}
	if b.dataMR != nil {
		errs = append(errs, b.dataMR.Close())
	}
	if b.iuArena != nil {
		errs = append(errs, b.iuArena.Close())
	}
	if b.dataArena != nil {
		errs = append(errs, b.dataArena.Close())
	}
	if b.pd != nil {
		errs = append(errs, b.pd.Close())
	}
	return errors.Join(errs...)
}

// spareBufs keeps the buffer sets of the latest released connections,
// up to max (Config.SpareBuffers, none by default), for the next
// accepts. Registering a connection's buffers pins and maps every page
// of Credits × MaxTransfer bytes (64 MiB for an SRP channel), which on
// rxe is most of what an accept costs (docs/performance.md); a
// reconnect, and the SRP nexus's SINGLE login that ends and remakes
// every channel, then waits for none of it.
//
// A set is handed on only after its connection's QP is destroyed: no
// peer can reach its MRs any more, and the next peer's QP is the only
// one in its PD. The data it holds is the last connection's, which the
// next one overwrites before it sends any (a slot's buffer is sent only
// after the volume or an RDMA READ filled it), as a connection's own
// slots already reuse their buffers from command to command.
type spareBufs struct {
	mu     sync.Mutex
	max    int
	sets   []*connBufs
	closed bool
}

// take hands out a spare set that fits, or nil.
func (s *spareBufs) take(dev transport.Device, iuLen, dataLen int, access transport.Access) *connBufs {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, b := range s.sets {
		if b.fits(dev, iuLen, dataLen, access) {
			s.sets = append(s.sets[:i], s.sets[i+1:]...)
			return b
		}
	}
	return nil
}

// put keeps b for a later accept, in place of the set kept longest when
// the spares are full (that one is returned, for the caller to close):
// the sets kept are those of the latest connections, whose sizes the
// next ones are likeliest to have. When the spares are closed (or max
// is 0) put keeps nothing and returns b itself.
func (s *spareBufs) put(b *connBufs) (drop *connBufs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.max <= 0 {
		return b
	}
	if len(s.sets) >= s.max {
		drop = s.sets[0]
		s.sets = append(s.sets[:0], s.sets[1:]...)
	}
	s.sets = append(s.sets, b)
	return drop
}

// close releases every spare set; put refuses from then on.
func (s *spareBufs) close() error {
	s.mu.Lock()
	sets := s.sets
	s.sets, s.closed = nil, true
	s.mu.Unlock()
	var errs []error
	for _, b := range sets {
		errs = append(errs, b.close())
	}
	return errors.Join(errs...)
}
