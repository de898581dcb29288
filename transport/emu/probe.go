package emu

import (
	"fmt"

	"github.com/gosrp/gosrp/transport"
)

// Probe asks the NIC under victim whether an RDMA WRITE (data into the
// peer's memory) or RDMA READ (len(data) bytes out of it) at (rkey, va)
// arriving on victim would be served right now, and if so performs it.
// It is a hostile peer's stray without the wire: no packet, no
// completion and no state change on either side, so a test can fire
// every descriptor it was ever handed, after every step, without tearing
// the connection down, and see exactly which ones a real device would
// have served (a refused probe of an invalidated key still counts in
// Counters.AccessAfterInvalidate). reason says why it was refused, in the
// responder's words.
func (p *Provider) Probe(victim transport.QP, op transport.Opcode, rkey transport.Key, va uint64, data []byte) (served bool, reason string, err error) {
	q, err := asQP(p.dev, victim)
	if err != nil {
		return false, "", err
	}
	need := transport.AccessRemoteWrite
	switch op {
	case transport.OpRDMAWrite:
	case transport.OpRDMARead:
		need = transport.AccessRemoteRead
	default:
		return false, "", fmt.Errorf("emu: probe %s: only RDMA_WRITE and RDMA_READ: %w", op, transport.ErrInvalidArgument)
	}
	if len(data) == 0 {
		return false, "", fmt.Errorf("emu: probe of 0 bytes: %w", transport.ErrInvalidArgument)
	}
	d := p.dev
	d.mem.Lock()
	defer d.mem.Unlock()
	b, bad := d.checkRemoteLocked(q, rkey, va, uint64(len(data)), need)
	if bad != "" {
		return false, bad, nil
	}
	p.counters.probesServed.Add(1)
	if op == transport.OpRDMAWrite {
		copy(b, data)
	} else {
		copy(data, b)
	}
	return true, "", nil
}
