package emu

import (
	"sort"

	"github.com/gosrp/gosrp/transport"
)

// QPs lists the NIC's live queue pairs, ordered by number, so a test can
// aim injections at QPs an embedded program created.
func (p *Provider) QPs() []transport.QP {
	d := p.dev
	d.qpMu.Lock()
	out := make([]transport.QP, 0, len(d.qps))
	for _, q := range d.qps {
		out = append(out, q)
	}
	d.qpMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Num() < out[j].Num() })
	return out
}

// MemObjects lists the indexes of the NIC's live memory objects of a kind
// ("mr", "frmr", "mw"; "" for all), for MRInfo.
func (p *Provider) MemObjects(kind string) []uint32 {
	d := p.dev
	d.mem.RLock()
	defer d.mem.RUnlock()
	var out []uint32
	for i, o := range d.objs {
		if o != nil && (kind == "" || o.kind.String() == kind) {
			out = append(out, uint32(i))
		}
	}
	return out
}
